"""The content cache (--cache-dir, protocol.md "Cache"): a second session writing the same data sends almost nothing and reads
back the same bytes; and every bad-input class: a hash-write for content the session was not told is held, a length that
is not the content's, content whose file does not hash to its name (forged or damaged), a truncated file, a directory that
cannot be written or is full, sessions storing the same content at once. Runners here are the CPU backend on loopback."""
import hashlib, json, os, pathlib, re, struct, threading, time
import pytest
from runner_proc import RunnerProc, until   # the runner stores content after the write that carried it: wait
from client.connection import Runner, RunnerError
import client.protocol as P

MB = 1 << 20

def cache_runner(tmp_path, *args, size="1G"):
  return RunnerProc("-v", "--cache-dir", str(tmp_path / "cache"), "--cache-size", size, *args)

def files(d:pathlib.Path): return sorted(p for p in d.iterdir() if not p.name.startswith("."))

def stored(tmp_path, data:bytes) -> bool:
  """Wait until each 1 MiB chunk of data is a file in the cache: a later session finds only what is stored whole."""
  names = {hashlib.sha256(data[i:i + MB]).hexdigest() for i in range(0, len(data), MB)}
  return until(lambda: names <= {f.name for f in files(tmp_path / "cache")})

def roundtrip(addr:str, data:bytes, **kw) -> tuple[bytes, dict]:
  with Runner(addr, **kw) as rn:
    rn.alloc(h := rn.new_handle(), len(data))
    rn.write(h, 0, data)
    out = bytearray(len(data))
    rn.read(h, 0, out)
    return bytes(out), rn.stats()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_second_session_sends_under_1mib(tmp_path, iso):
  data = os.urandom(64 * MB)
  r = cache_runner(tmp_path, "--isolation", iso)
  try:
    out1, s1 = roundtrip(r.addr, data)
    assert stored(tmp_path, data)
    out2, s2 = roundtrip(r.addr, data)
    assert out1 == data and out2 == data
    assert s1["bytes_sent"] > 64 * MB and s2["bytes_sent"] < MB, (s1, s2)
    assert until(lambda: len(files(tmp_path / "cache")) == 64)   # 1 MiB chunks, each its own file named by its SHA-256
    for f in files(tmp_path / "cache"):
      body = f.read_bytes()
      assert body[:8] == b"MRCACHE1" and hashlib.sha256(body[48:]).hexdigest() == f.name == body[16:48].hex()
    log = r.log_text()
    assert f"cache: {64 * MB} bytes written from it" in log and f"{64 * MB} bytes given to it" in log
  finally: r.stop()

def test_known_content_costs_no_round_trip(tmp_path):
  # a session that was told content is held writes it again by hash with no further Thave
  data = os.urandom(4 * MB)
  r = cache_runner(tmp_path)
  try:
    roundtrip(r.addr, data)
    assert stored(tmp_path, data)
    with Runner(r.addr) as rn:
      rn.alloc(h := rn.new_handle(), 2 * len(data))
      rn.write(h, 0, data)
      rt, sent = rn.stats()["round_trips"], rn.stats()["bytes_sent"]
      rn.write(h, len(data), data)
      assert rn.stats()["round_trips"] == rt and rn.stats()["bytes_sent"] - sent < 1024
      out = bytearray(2 * len(data))
      rn.read(h, 0, out)
      assert out == data + data
  finally: r.stop()

def test_cache_is_off_by_default_and_without_cap_client_writes_plainly(daemon_bin):
  r = RunnerProc()
  try:
    data = os.urandom(2 * MB)
    out, st = roundtrip(r.addr, data)
    assert out == data and st["bytes_sent"] > 2 * MB
    with Runner(r.addr) as rn:
      assert not rn.info.caps & P.CAP_CACHE
      assert rn.have([hashlib.sha256(data).digest()]) == [False]   # a runner without a cache holds nothing
  finally: r.stop()

def test_hashwrite_of_content_not_held(tmp_path):
  r = cache_runner(tmp_path)
  try:
    with Runner(r.addr) as rn:
      rn.alloc(h := rn.new_handle(), 4096)
      rn.write(h, 0, b"\x07" * 4096)
      # a hash never stored, and one stored but never reported held to this session: both refused, the buffer unchanged
      d = hashlib.sha256(b"never stored").digest()
      rn._send(P.TWRITEHASH, "Twritehash", handle=h, offset=0, count=12, hash=d)
      with pytest.raises(RunnerError) as e: rn.sync()
      assert e.value.code == P.ENOTCACHED and "Thave" in e.value.text
      assert rn.have([d]) == [False]
      out = bytearray(4096)
      rn.read(h, 0, out)
      assert out == b"\x07" * 4096
  finally: r.stop()

def test_hash_is_the_runners_not_the_clients(tmp_path):
  # content is named by the hash the runner computes over what it received: nothing a client says can file bytes under
  # another content's name. Store X, then claim X's bytes are Y's: Y is not held, and a Twritehash naming Y fails.
  r = cache_runner(tmp_path)
  x, y = os.urandom(MB), os.urandom(MB)
  try:
    roundtrip(r.addr, x)
    assert stored(tmp_path, x)
    with Runner(r.addr) as rn:
      assert rn.have([hashlib.sha256(x).digest(), hashlib.sha256(y).digest()]) == [True, False]
      rn.alloc(h := rn.new_handle(), MB)
      rn._send(P.TWRITEHASH, "Twritehash", handle=h, offset=0, count=MB, hash=hashlib.sha256(y).digest())
      with pytest.raises(RunnerError) as e: rn.sync()
      assert e.value.code == P.ENOTCACHED
      # the right hash with the wrong length
      rn._send(P.TWRITEHASH, "Twritehash", handle=h, offset=0, count=MB - 1, hash=hashlib.sha256(x).digest())
      with pytest.raises(RunnerError) as e: rn.sync()
      assert e.value.code == P.EINVAL and f"is {MB} bytes" in e.value.text
      # out of the buffer: checked before the cache is asked
      rn._send(P.TWRITEHASH, "Twritehash", handle=h, offset=1, count=MB, hash=hashlib.sha256(x).digest())
      with pytest.raises(RunnerError) as e: rn.sync()
      assert e.value.code == P.ERANGE
    assert [f.name for f in files(tmp_path / "cache")] == [hashlib.sha256(x).hexdigest()]
  finally: r.stop()

def forge(path:pathlib.Path, name_of:bytes, body:bytes, length:int|None=None):
  """A cache file named and headed as content name_of, holding body."""
  d = hashlib.sha256(name_of).digest()
  (path / d.hex()).write_bytes(b"MRCACHE1" + struct.pack("<Q", len(body) if length is None else length) + d + body)
  return d

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_corrupt_file_is_dropped_not_served(tmp_path, iso):
  r = cache_runner(tmp_path, "--isolation", iso)
  try:
    good = os.urandom(MB)
    d = forge(tmp_path / "cache", good, os.urandom(MB))   # the header says good's hash, the bytes are others
    with Runner(r.addr) as rn:
      rn.alloc(h := rn.new_handle(), MB)
      rn.write(h, 0, b"\0" * MB)
      assert rn.have([d]) == [True]   # the header is fine; the bytes are checked when they are used
      rn._send(P.TWRITEHASH, "Twritehash", handle=h, offset=0, count=MB, hash=d)
      with pytest.raises(RunnerError) as e: rn.sync()
      assert e.value.code == P.ECACHE and "corrupt" in e.value.text
      out = bytearray(MB)
      rn.read(h, 0, out)
      assert out == b"\0" * MB   # nothing of it reached the buffer
      assert rn.have([d]) == [False]
    assert not (tmp_path / "cache" / d.hex()).exists()
    assert "failed verification; removed it" in r.log_text()
    # the client's own write path recovers: the content is sent and stored again, correctly
    out, _ = roundtrip(r.addr, good)
    assert out == good and until((f := tmp_path / "cache" / d.hex()).exists) and f.read_bytes()[48:] == good
  finally: r.stop()

def test_truncated_file_is_dropped(tmp_path):
  r = cache_runner(tmp_path)
  try:
    data = os.urandom(MB)
    d = forge(tmp_path / "cache", data, data[:1000], length=MB)   # cut short: its header says 1 MiB
    out, st = roundtrip(r.addr, data)
    assert out == data and st["bytes_sent"] > MB   # not held: sent whole, and stored again
    assert until((tmp_path / "cache" / d.hex()).exists)   # renamed into place whole
    assert (tmp_path / "cache" / d.hex()).read_bytes()[48:] == data
    assert "bad header or length (truncated?); removed it" in r.log_text()
  finally: r.stop()

def test_unwritable_cache_dir_runs_without_cache(tmp_path):
  (tmp_path / "file").write_text("not a directory")
  r = RunnerProc("-v", "--cache-dir", str(tmp_path / "file" / "cache"))
  try:
    data = os.urandom(2 * MB)
    out, st = roundtrip(r.addr, data)
    assert out == data and st["bytes_sent"] > 2 * MB
    with Runner(r.addr) as rn: assert not rn.info.caps & P.CAP_CACHE
    assert "running without the cache" in r.log_text()
  finally: r.stop()

@pytest.mark.skipif(os.geteuid() != 0, reason="--user needs a runner started as root")
def test_cache_dir_unwritable_for_sessions_keeps_serving(tmp_path):
  # the runner (root) can write the directory, its sessions (--user nobody) cannot: writes succeed, nothing is stored
  (tmp_path / "cache").mkdir(mode=0o700)
  r = cache_runner(tmp_path, "--user", "nobody")
  try:
    data = os.urandom(2 * MB)
    for _ in range(2):
      out, st = roundtrip(r.addr, data)
      assert out == data and st["bytes_sent"] > 2 * MB
    assert files(tmp_path / "cache") == []
    assert "going on without caching" in r.log_text()
  finally: r.stop()

def test_full_cache_evicts_least_recently_used(tmp_path):
  r = cache_runner(tmp_path, size="3M")
  try:
    chunks = [os.urandom(MB) for _ in range(4)]
    for c in chunks:
      roundtrip(r.addr, c)
      assert until(lambda: hashlib.sha256(c).hexdigest() in {f.name for f in files(tmp_path / "cache")})
    assert until(lambda: sum(f.stat().st_size for f in files(tmp_path / "cache")) <= 3 * MB)
    names = {f.name for f in files(tmp_path / "cache")}
    assert hashlib.sha256(chunks[0]).hexdigest() not in names and hashlib.sha256(chunks[3]).hexdigest() in names
    # content larger than the whole cache is not stored; the write itself is fine
    big = os.urandom(4 * MB)
    with Runner(r.addr) as rn:
      rn.alloc(h := rn.new_handle(), len(big))
      rn._send(P.TWRITE, "Twrite", P.FCACHE, [big], handle=h, offset=0, count=len(big))
      out = bytearray(len(big))
      rn.read(h, 0, out)
    assert out == big and "more than --cache-size" in r.log_text()
  finally: r.stop()

def test_pinned_content_survives_eviction(tmp_path):
  # Thave pins: content reported held stays usable for that session even when other sessions' stores evict its file
  r = cache_runner(tmp_path, size="2M")
  try:
    a = os.urandom(MB)
    roundtrip(r.addr, a)
    assert stored(tmp_path, a)
    with Runner(r.addr) as rn:
      assert rn.have([hashlib.sha256(a).digest()]) == [True]
      for _ in range(3): roundtrip(r.addr, os.urandom(MB))   # evicts a's file
      assert until(lambda: not (tmp_path / "cache" / hashlib.sha256(a).hexdigest()).exists())
      rn.alloc(h := rn.new_handle(), MB)
      rn.write(h, 0, a)   # by hash: no round trip, served from the pinned file
      out = bytearray(MB)
      rn.read(h, 0, out)
      assert out == a and rn.stats()["bytes_sent"] < 4096
  finally: r.stop()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_concurrent_sessions_store_the_same_content(tmp_path, iso):
  data = os.urandom(8 * MB)
  r = cache_runner(tmp_path, "--isolation", iso)
  try:
    results, errors = [], []
    def one():
      try: results.append(roundtrip(r.addr, data)[0] == data)
      except Exception as e: errors.append(e)
    ts = [threading.Thread(target=one) for _ in range(4)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert not errors and results == [True] * 4
    assert until(lambda: len(files(tmp_path / "cache")) == 8)
    fs = files(tmp_path / "cache")
    assert all(hashlib.sha256(f.read_bytes()[48:]).hexdigest() == f.name for f in fs)
    assert until(lambda: not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")])
    out, st = roundtrip(r.addr, data)
    assert out == data and st["bytes_sent"] < MB
  finally: r.stop()

# *** programs: a second client running the same model compiles nothing on a Metal runner, and uploads no weights ***

MODEL = """
import os, json, numpy as np
import client.remote_metal
from tinygrad import Tensor, Device
rng = np.random.default_rng(0)
w1, w2 = rng.normal(size=(1024, 512)).astype(np.float32), rng.normal(size=(512, 10)).astype(np.float32)   # 2 MiB + 20 KiB
x = Tensor(rng.normal(size=(4, 1024)).astype(np.float32), device="METAL")
out = (x @ Tensor(w1, device="METAL")).relu() @ Tensor(w2, device="METAL")
print(json.dumps({"out": out.numpy().tolist(), **Device["METAL"].runner.stats()}))
"""

@pytest.mark.metal
@pytest.mark.parametrize("iso", ["thread", "process"])
def test_second_session_compiles_no_program_metal(tmp_path, iso):
  # With thread isolation a Metal runner keeps compiled pipelines in memory across sessions (one process); a spawned session
  # process (process isolation, the default) starts with none and compiles its programs again (on a Mac, Metal's own shader
  # cache may make that cheaper; not measured). -v logs each session's count. On Linux this is the Metal emulator (a test
  # harness): the count is of its compilations, not of Apple's compiler. The data cache (--cache-dir) serves both.
  import json
  from conftest import metal_runner_proc, needs_own_metal_runner, run_python
  needs_own_metal_runner()
  r = metal_runner_proc("-v", "--isolation", iso, "--cache-dir", str(tmp_path / "cache"))
  try:
    runs = []
    for _ in range(2):
      p = run_python(MODEL, env={"METAL_RUNNER": r.addr})
      assert p.returncode == 0, p.stderr
      runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0]["out"] == runs[1]["out"]
    counts = [tuple(map(int, m)) for m in re.findall(r"a session compiled (\d+) programs and took (\d+) from", r.log_text())]
    assert len(counts) == 2 and counts[0][0] > 0, counts
    assert counts[1] == ((0, sum(counts[0])) if iso == "thread" else counts[0]), counts
    assert runs[0]["bytes_sent"] > 2 * MB and runs[1]["bytes_sent"] < runs[0]["bytes_sent"] - 2 * MB + 64 * 1024
  finally: r.stop()

def test_hashwrite_is_profiled_as_a_write(tmp_path):
  r = cache_runner(tmp_path)
  try:
    data = os.urandom(2 * MB)
    roundtrip(r.addr, data)
    assert stored(tmp_path, data)
    with Runner(r.addr) as rn:
      rn.profile(P.PROFILE_ON)
      rn.alloc(h := rn.new_handle(), len(data))
      rn.write(h, 0, data)
      recs, _, _, _ = rn.profile(P.PROFILE_OFF)
      assert [(x["kind"], x["handle"], x["count"]) for x in recs] == [(P.PROF_WRITE, h, MB)] * 2
      assert all(0 < x["start"] <= x["end"] for x in recs) and rn.stats()["bytes_sent"] < 8192
  finally: r.stop()

def test_disk_full_keeps_serving(tmp_path):
  # a cache directory on a 3 MiB tmpfs that --cache-size says may hold 1 GiB: the disk fills (ENOSPC), writes go on
  import subprocess
  d = tmp_path / "cache"
  d.mkdir()
  if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(d)], capture_output=True).returncode:
    pytest.skip("needs to mount a small tmpfs (root with CAP_SYS_ADMIN)")
  try:
    r = cache_runner(tmp_path)
    try:
      datas = [os.urandom(8 * MB) for _ in range(2)]
      for data in datas:
        out, st = roundtrip(r.addr, data)
        assert out == data
      assert until(lambda: "No space left on device; going on without caching" in r.log_text(0))
      assert until(lambda: not [p for p in d.iterdir() if p.name.startswith(".tmp")])   # a failed store leaves nothing behind
      for f in files(d): assert hashlib.sha256(f.read_bytes()[48:]).hexdigest() == f.name   # what was stored is whole
      assert 0 < len(files(d)) < 8
      out, st = roundtrip(r.addr, datas[0])   # what was not stored is sent again; what was, goes by hash
      assert out == datas[0] and MB < st["bytes_sent"] < 8 * MB
    finally: r.stop()
  finally: subprocess.run(["umount", str(d)])

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_empty_content_is_not_served_even_from_a_good_file(tmp_path, iso):
  # protocol.md, Cache: empty content is never held. This runner never stores it; a file for it (left by another program
  # sharing the directory) is whole and hashes right, and still Rhave answers 0
  r = cache_runner(tmp_path, "--isolation", iso)
  try:
    d = forge(tmp_path / "cache", b"", b"")
    with Runner(r.addr) as rn:
      assert rn.have([d]) == [False]
  finally: r.stop()

def test_write_in_groups_mixes_held_and_new_chunks(tmp_path):
  # write_cached hashes and asks group by group (1, 2, 4, then 8 chunks), each group's Thave sent before the previous group's data:
  # held chunks in every group, a chunk repeated across groups and a short last chunk must all land where they belong
  c = [os.urandom(MB) for _ in range(12)]
  held = [c[0], c[3], c[6], c[9]]
  # groups: [c0] [c1 c2] [c0 c3 c4 c1] [c5 c6 ...]: c0 again where this write already knows it held, c1 and c5 again, a short tail
  data = b"".join([c[0], c[1], c[2], c[0], c[3], c[4], c[1], *c[5:], c[5]]) + os.urandom(MB // 3)
  r = cache_runner(tmp_path)
  try:
    roundtrip(r.addr, b"".join(held))
    assert stored(tmp_path, b"".join(held))
    out, st = roundtrip(r.addr, data)
    assert out == data
    # the 5 held chunks go by hash; the repeated c1 and c5 may too, if stored and asked about by the time they come again
    assert len(data) - 7 * MB <= st["bytes_sent"] <= len(data) - 5 * MB + 64 * 1024, st
    assert stored(tmp_path, data[:(len(data) // MB) * MB])   # every new whole chunk is kept
  finally: r.stop()

def test_runner_killed_mid_store_leaves_nothing_that_is_served(tmp_path):
  # a store is a temporary file renamed into place once whole and hashed: a runner killed (SIGKILL) while storing leaves only
  # whole files named by their hash, and temporary ones that are never served; a new runner on the same directory serves right bytes
  data = os.urandom(192 * MB)
  r = cache_runner(tmp_path)
  errs = []
  def upload():
    try: roundtrip(r.addr, data)
    except Exception as e: errs.append(e)
  t = threading.Thread(target=upload)
  t.start()
  try:
    assert until(lambda: any(f.name.startswith(".tmp.") for f in (tmp_path / "cache").iterdir()), 20)
    os.kill(r.proc.pid, 9)   # the runner: its sessions and their cache helpers die with it (PR_SET_PDEATHSIG)
  finally:
    t.join(60)
    r.stop()
  assert errs, "the upload finished before the runner was killed: nothing was tested"
  cache = tmp_path / "cache"
  for f in files(cache):   # what is there under a hash name is whole and hashes to its name
    body = f.read_bytes()
    assert body[:8] == b"MRCACHE1" and hashlib.sha256(body[48:]).hexdigest() == f.name == body[16:48].hex()
  r = cache_runner(tmp_path)
  try:
    out, st = roundtrip(r.addr, data)
    assert out == data
  finally: r.stop()

def test_cached_write_in_a_forked_child(tmp_path):
  # the thread that hashes a cached write's chunks is not in a child made by fork(): the child gets a new one, not a hang
  data = os.urandom(4 * MB)
  r = cache_runner(tmp_path)
  try:
    assert roundtrip(r.addr, data)[0] == data   # the parent's hashing thread exists, and waits for work
    if (pid := os.fork()) == 0:
      try: os._exit(0 if roundtrip(r.addr, data[::-1])[0] == data[::-1] else 1)
      finally: os._exit(2)
    deadline = time.monotonic() + 20
    while (w := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline: time.sleep(0.05)
    if w == (0, 0):
      os.kill(pid, 9)
      os.waitpid(pid, 0)
    assert w[0] == pid and os.waitstatus_to_exitcode(w[1]) == 0, "the child's cached write hung or failed"
  finally: r.stop()

AFTER_MAIN = """
import json, os, sys, threading
from client.connection import Runner
data = os.urandom(8 << 20)
rn = Runner(sys.argv[1])
rn.alloc(h := rn.new_handle(), len(data))
if sys.argv[2] == "started": rn.write(h, 0, data[::-1])   # the hashing thread's pool is started: it refuses work after the shutdown
def late():
  threading.main_thread().join()   # the main thread has returned: the interpreter shuts its thread pools down, then waits for this one
  import time; time.sleep(0.5)
  rn.write(h, 0, data)             # 8 chunks: the later groups' hashes would go to the hashing thread
  out = bytearray(len(data)); rn.read(h, 0, out)
  print(json.dumps({"same": out == data, "sent": rn.stats()["bytes_sent"]}), flush=True)
threading.Thread(target=late).start()
"""

@pytest.mark.parametrize("pool", ["started", "never started"])
def test_a_cached_write_from_a_thread_that_outlives_the_main_one(tmp_path, pool):
  # the hashing thread's pool takes no more work once the main thread has returned ("cannot schedule new futures after interpreter
  # shutdown"; "can't register atexit after shutdown" when it was never started): the write hashes those groups itself (ab697fd)
  from conftest import run_python
  r = cache_runner(tmp_path)
  try:
    p = run_python(AFTER_MAIN.replace("sys.argv[1]", repr(r.addr)).replace("sys.argv[2]", repr(pool)), timeout=60)
    assert p.returncode == 0 and p.stdout.strip(), p.stdout + p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["same"] and out["sent"] > 8 * MB, (out, p.stderr[-3000:])   # sent by content: new to this cache
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert until(lambda: len(files(tmp_path / "cache")) == 8 * (1 + (pool == "started"))), files(tmp_path / "cache")   # each chunk kept
  finally: r.stop()

def test_a_write_new_to_the_runner_is_sent_unhashed_but_for_a_sample(tmp_path, monkeypatch):
  # connection.write_cached: a write of PROBE_MIN chunks or more first asks (one Thave) about PROBE of them; where the runner holds
  # none, hashing the rest would save no byte, so its chunks go at once with FCACHE, unhashed. The runner stores each under the hash it
  # computes, and a later write of the same bytes finds its sample held: hashed whole, it is sent by hash
  import client.connection as C
  hashed, real = [], C._digests
  monkeypatch.setattr(C, "_digests", lambda parts, known: (hashed.extend(k for k in known if k is None), real(parts, known))[1])
  data = os.urandom(12 * MB)
  r = cache_runner(tmp_path)
  try:
    with Runner(r.addr) as rn:
      rn.alloc(h := rn.new_handle(), len(data))
      rt = rn.stats()["round_trips"]
      rn.write(h, 0, data)
      assert (rn.stats()["round_trips"] - rt, len(hashed)) == (1, C.PROBE)   # the sample's Thave; the sample's hashes
      out = bytearray(len(data))
      rn.read(h, 0, out)
    assert out == data and stored(tmp_path, data)
    hashed.clear()
    out, st = roundtrip(r.addr, data)
    assert out == data and st["bytes_sent"] < MB and len(hashed) == 12, (st, len(hashed))
  finally: r.stop()

def test_a_runner_that_holds_none_of_the_sample_is_sent_every_chunk(tmp_path):
  # the probe's cost, written down: a runner that holds chunks of a write, but none of the sampled ones (of 12 chunks: 0, 3, 6, 8
  # and 11), is sent all of them again; the bytes still land where they belong
  c = [os.urandom(MB) for _ in range(12)]
  r = cache_runner(tmp_path)
  try:
    held = c[1] + c[5] + c[9]
    roundtrip(r.addr, held)
    assert stored(tmp_path, held)
    out, st = roundtrip(r.addr, b"".join(c))
    assert out == b"".join(c) and st["bytes_sent"] >= 12 * MB, st
  finally: r.stop()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_what_a_session_wrote_is_stored_when_its_place_is_free_again(tmp_path, iso):
  # the runner hashes and names stored content off the session's path (daemon/storeq.c); what waits is finished before the session
  # leaves its place (--max-sessions 1: the next session gets in only then), so a client that starts again right after finds it all,
  # with no wait for a thread that could be stopped with the session
  data = os.urandom(96 * MB)
  names = [hashlib.sha256(data[i:i + MB]).digest() for i in range(0, len(data), MB)]
  r = cache_runner(tmp_path, "--isolation", iso, "--max-sessions", "1")
  try:
    with Runner(r.addr) as rn:
      rn.alloc(h := rn.new_handle(), len(data))
      rn.write(h, 0, data)
      rn.sync()
    deadline = time.monotonic() + 30
    while True:
      try:
        with Runner(r.addr) as rn: assert rn.have(names) == [True] * len(names)
        break
      except RunnerError as e:
        if e.code != P.ELIMIT or time.monotonic() > deadline: raise
        time.sleep(0.01)
  finally: r.stop()
