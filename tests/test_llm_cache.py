# A GGUF over runners with --cache-dir (client/placement.py's upload, client/file_digests.py, docs/cache.md): a restart sends almost
# none of the weights, a changed file is hashed and sent again (and answers with its own text), and the host's record of the file's
# digests spares hashing it again at each start (counted, not timed). CPU runners on 127.0.0.1; models from tests/ggufgen.py; the host's
# records in a folder of each test's (METAL_RUNNER_DIGESTS), tinygrad's own cache where it is (XDG_CACHE_HOME kept: its compiled kernels).
import hashlib, json, os, pathlib, re, subprocess, sys, time
import pytest
from conftest import ROOT
from runner_proc import RunnerProc, until
from ggufgen import write
from llm_app import env_for
from client.connection import Runner, PROBE

MB = 1 << 20
CTX = "64"
MODEL = dict(blocks=4, dim=256, ffn=1536, vocab=4096)   # 9 MB: every run of the file a runner is given is above the cache's 1 MiB minimum

def made(path:pathlib.Path, seed:int=0, age:float=60) -> str:
  """The model at path, its modification time age seconds back: the host keeps no record of a file modified within the last two
  seconds (client/file_digests.py, RACY), as a freshly downloaded file's is not."""
  write(str(path), **MODEL, seed=seed)
  os.utime(path, (time.time() - age, time.time() - age))
  return str(path)

def weights(model:str) -> int:
  from client.placement import read_gguf
  _, infos = read_gguf(model)
  tied = not any(t.name == "output.weight" for t in infos)   # the head reads the embedding's bytes, sent to the last runner too
  return sum(t.nbytes for t in infos) + sum(t.nbytes for t in infos if tied and t.name == "token_embd.weight")

class CacheRunners:
  """Two CPU runners, each with a cache directory of its own under d, logging their sessions (-v); restart() stops and starts them
  with the same directories."""
  def __init__(self, d:pathlib.Path):
    self.d = d
    self.procs = self._start()
  def _start(self): return [RunnerProc("-v", "--cache-dir", str(self.d / f"cache{i}")) for i in range(2)]
  def restart(self):
    self.stop()
    self.procs = self._start()
  def stop(self):
    for r in self.procs: r.stop()
  @property
  def addr(self) -> str: return ",".join(r.addr for r in self.procs)
  def sessions(self) -> list[list[tuple[int, int, int]]]:
    """Each runner's ended sessions: (bytes in, bytes of cached content written from its cache, bytes it was given to keep)."""
    out = []
    for r in self.procs:
      log = r.log_text(0)
      ins = [int(b) for b in re.findall(r"session \d+: ended: .*?, (\d+) bytes in", log)]
      cache = [(int(a), int(b)) for a, b in re.findall(r"session \d+: cache: (\d+) bytes written from it, (\d+) bytes given", log)]
      out.append([(i, *c) for i, c in zip(ins, cache)])
    return out

def app(rs:CacheRunners, model:str, digests:pathlib.Path, **env) -> tuple[list[str], list[tuple[int, int, int]]]:
  """tinygrad.llm --benchmark over the two runners: the text after each step, and each runner's session of it (the one that received
  the most)."""
  before = [len(s) for s in rs.sessions()]
  p = subprocess.run([sys.executable, "-m", "client", "run", "--runner", rs.addr, "-m", "tinygrad.llm", "--model", model, "--max_context",
                      CTX, "--benchmark", "4"], env=env_for({"METAL_RUNNER_PLACEMENT": "memory", "METAL_RUNNER_DIGESTS": str(digests), **env}),
                     capture_output=True, text=True, timeout=600, cwd=str(ROOT))
  assert p.returncode == 0, p.stderr[-3000:]
  assert until(lambda: all(len(s) > b for s, b in zip(rs.sessions(), before)), 10), rs.sessions()
  return re.findall(r"tok/s.*--  (.*)", p.stdout), [max(s[b:]) for s, b in zip(rs.sessions(), before)]

def cpu_text(model:str) -> list[str]:
  p = subprocess.run([sys.executable, "-m", "client.llm_kernels", "--model", model, "--max_context", CTX, "--benchmark", "4"],
                     env=env_for({"DEV": "CPU"}), capture_output=True, text=True, timeout=600, cwd=str(ROOT))
  assert p.returncode == 0, p.stderr[-3000:]
  return re.findall(r"tok/s.*--  (.*)", p.stdout)

@pytest.mark.slow
def test_a_restart_sends_under_one_percent_of_the_weights(tmp_path):
  """The same command again, runners kept and then restarted with the same cache directories: each time the runners are sent under 1%
  of the weights' bytes (against the same run without the cache, which sends the same kernels), and the text is the same."""
  model, records, rs = made(tmp_path / "m.gguf"), tmp_path / "records", CacheRunners(tmp_path)
  try:
    plain, none = app(rs, model, records, METAL_RUNNER_CACHE="0")
    first, cold = app(rs, model, records)
    kept, warm = app(rs, model, records)
    rs.restart()
    again, warm2 = app(rs, model, records)
  finally: rs.stop()
  w = weights(model)
  assert first == plain == kept == again and len(first) == 4
  assert sum(s[2] for s in cold) >= 0.99 * w   # the first run gave the runners the weights to keep
  for got in (warm, warm2):
    saved = sum(n[0] for n in none) - sum(g[0] for g in got)
    assert saved >= 0.99 * w, (none, got, w)     # sent: under 1% of the weights
    assert sum(g[1] for g in got) >= 0.99 * w   # and written into the buffers from the runners' caches
    assert sum(g[2] for g in got) == 0           # nothing new to keep

@pytest.mark.slow
def test_a_changed_gguf_is_hashed_and_sent_again_and_answers_with_its_own_text(tmp_path):
  """The file rewritten in place with other weights (the same size): the host's record of the old file is not used, the new weights
  are sent whole and kept, and the text is tinygrad's CPU device's for the new file."""
  path, records, rs = tmp_path / "m.gguf", tmp_path / "records", CacheRunners(tmp_path)
  try:
    old, _ = app(rs, made(path, seed=0, age=120), records)
    assert len(list(records.iterdir())) == 1   # the host's record of the file
    size = path.stat().st_size
    new, got = app(rs, made(path, seed=1, age=60), records)
    assert path.stat().st_size == size
  finally: rs.stop()
  assert new == cpu_text(str(path)) and new != old
  assert sum(g[2] for g in got) >= 0.99 * weights(str(path)) and sum(g[1] for g in got) == 0

COUNT = """
import hashlib, json, sys
import client.connection as c
from client import placement
calls = []
class Counting:   # client/connection.py's hashlib, counting what its cached writes hash
  @staticmethod
  def sha256(*a):
    calls.append(1)
    return hashlib.sha256(*a)
c.hashlib = Counting
placement.from_gguf(sys.argv[1], placement.runner_devices(), max_context=64, speed=False, say=None)
print(json.dumps({"sha256": len(calls), "sent": [placement.runner_of(d).stats()["bytes_sent"] for d in placement.runner_devices()]}))
"""

def counted(rs:CacheRunners, model:str, digests:pathlib.Path, tmp_path:pathlib.Path, **env) -> dict:
  (script := tmp_path / "count.py").write_text(COUNT)
  p = subprocess.run([sys.executable, "-m", "client", "run", "--runner", rs.addr, str(script), model], env=env_for({"METAL_RUNNER_DIGESTS": str(digests), **env}),
                     capture_output=True, text=True, timeout=600, cwd=str(ROOT))
  assert p.returncode == 0, p.stderr[-3000:]
  return json.loads(p.stdout.strip().splitlines()[-1])

@pytest.mark.slow
def test_the_hosts_record_spares_hashing_an_unchanged_file_again(tmp_path):
  """SHA-256 computations of the client's cached writes, counted: the first start hashes each piece of the weights once, a start with
  the record hashes none (and still sends almost nothing), one without a record (another, empty folder) hashes them all again, and a
  file touched since (its modification time changed) is hashed again."""
  model, records, rs = made(tmp_path / "m.gguf"), tmp_path / "records", CacheRunners(tmp_path)
  try:
    first = counted(rs, model, records, tmp_path)
    pieces = first["sha256"]
    assert pieces >= 6   # two runners' runs of 3 MB and more, in pieces of at most 1 MiB
    assert until(lambda: all(len(list((rs.d / f"cache{i}").glob("[0-9a-f]*"))) >= 3 for i in range(2)))   # stored, after the writes
    second = counted(rs, model, records, tmp_path)
    assert second["sha256"] == 0 and sum(second["sent"]) < sum(first["sent"]) - 0.99 * weights(model), (first, second)
    assert counted(rs, model, tmp_path / "none", tmp_path)["sha256"] == pieces   # an empty folder: no record
    os.utime(model, (time.time() - 30, time.time() - 30))
    assert counted(rs, model, records, tmp_path)["sha256"] == pieces
    assert counted(rs, model, records, tmp_path)["sha256"] == 0
  finally: rs.stop()

def test_a_range_of_a_file_reuses_the_chunks_a_write_of_the_whole_file_stored(tmp_path):
  """write(at=): chunks cut at the file's multiples of 1 MiB, not the range's, so a range that starts mid-chunk (another placement of
  the same file) sends only its two edge pieces; known() digests are not hashed again, and what was hashed comes back to be recorded.
  The whole file is new to the runner, so only its sample of chunks is hashed (connection.PROBE, the first and the last among them)."""
  data = os.urandom(8 * MB)
  r = RunnerProc("-v", "--cache-dir", str(tmp_path / "cache"))
  try:
    with Runner(r.addr) as rn:
      rn.alloc(h := rn.new_handle(), len(data))
      sample = rn.write(h, 0, data)
    assert len(sample) == PROBE and sample[0][:2] == (0, MB) and sample[-1][:2] == (7 * MB, MB), sample
    assert all(d == hashlib.sha256(data[o:o + n]).digest() for o, n, d in sample)
    whole = [(o, MB, hashlib.sha256(data[o:o + MB]).digest()) for o in range(0, len(data), MB)]
    names = {d.hex() for _, _, d in whole}
    assert until(lambda: names <= {f.name for f in (tmp_path / "cache").iterdir()})
    a, b = MB + 12345, 7 * MB - 999
    asked = []
    def known(o, n):
      asked.append((o, n))
      return next((d for o2, n2, d in whole if (o2, n2) == (o, n)), None)
    with Runner(r.addr) as rn:
      rn.alloc(h := rn.new_handle(), b - a)
      got = rn.write(h, 0, memoryview(data)[a:b], at=a, known=known)
      out = bytearray(b - a)
      rn.read(h, 0, out)
      sent = rn.stats()["bytes_sent"]
    assert bytes(out) == data[a:b]
    assert [(o, n) for o, n, _ in got] == [(a, 2 * MB - a), *((i * MB, MB) for i in range(2, 6)), (6 * MB, b - 6 * MB)] == asked
    assert all(d == hashlib.sha256(data[o:o + n]).digest() for o, n, d in got)
    assert (2 * MB - a) + (b - 6 * MB) <= sent < (2 * MB - a) + (b - 6 * MB) + 64 * 1024, sent   # the edges only
  finally: r.stop()
