"""The embedding example, examples/embed/appliance.c: a program of its own that links libmetal_runner.a, sets a token and limits,
serves on a thread and stops on a signal. It is built with make (and, in the slow tests, with CMake, in the tree and against an
installed library), serves a tinygrad workload to a client with the token, refuses other tokens, reads its token again on SIGHUP with a new
token, and exits 0 on SIGTERM or SIGINT. tests/embed_api.c checks the library calls an embedding program relies on."""
import contextlib, os, re, select, shutil, signal, socket, subprocess, sys, threading, time
import pytest
from conftest import ROOT, run_python
from runner_proc import build_error
from client import connection as conn
from client import protocol as P

pytestmark = pytest.mark.cpu_only

EMBED = ROOT / "examples" / "embed"
BUILD = ROOT / "tests" / ".build"
# on macOS the library holds the Metal backend too (not tried: there is no Mac here)
FRAMEWORKS = [f for fw in ("Metal", "Foundation", "CoreGraphics") for f in ("-framework", fw)] if sys.platform == "darwin" else []

def make_appliance() -> str:
  if (why := build_error()) is not None: pytest.skip(f"daemon library cannot be built: {why}")
  r = subprocess.run(["make", "-C", str(EMBED)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout + r.stderr
  return str(EMBED / "appliance")

@pytest.fixture(scope="module")
def appliance_bin() -> str: return make_appliance()

class Appliance:
  """The example started on 127.0.0.1 with a free port (or `port`); stopped by its pid. .log collects its stderr."""
  def __init__(self, binary, token_file, *args:str, prefix:tuple[str, ...]=(), port:int=0):
    self.proc = subprocess.Popen([*prefix, str(binary), "-H", "127.0.0.1", "-p", str(port), *args, str(token_file)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.log: list[str] = []
    threading.Thread(target=lambda: self.log.extend(line.rstrip("\n") for line in self.proc.stderr), daemon=True).start()

  def listening(self, timeout:float=30) -> str:
    """The address of the next "listening on" line on stdout."""
    line = self.proc.stdout.readline() if select.select([self.proc.stdout], [], [], timeout)[0] else ""
    if (m := re.match(r"listening on (127\.0\.0\.1:\d+)", line)) is None:
      raise AssertionError(f"appliance did not listen (exit {self.proc.poll()}, {line!r}): {self.text()}")
    return m.group(1)

  def signal(self, sig, timeout:float=10) -> tuple[int, float]:
    """Send sig; (exit code, seconds to exit)."""
    t = time.monotonic()
    os.kill(self.proc.pid, sig)
    return self.proc.wait(timeout), time.monotonic() - t

  def text(self, settle:float=0.2) -> str:
    time.sleep(settle)
    return "\n".join(self.log)

  def stop(self):
    if self.proc.poll() is None:
      self.proc.terminate()
      try: self.proc.wait(10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()

@contextlib.contextmanager
def appliance(binary, token_file, *args, **kw):
  a = Appliance(binary, token_file, *args, **kw)
  try: yield a
  finally: a.stop()

@pytest.fixture
def token_file(tmp_path):
  p = tmp_path / "token"
  p.write_bytes(os.urandom(32).hex().encode() + b"\n")  # a trailing newline, as an editor leaves it, is not part of the token
  p.chmod(0o600)   # a token file is its owner's alone
  return p

def token(path) -> bytes: return path.read_bytes().rstrip(b"\r\n")

def refused(addr:str, tok:bytes|None) -> str:
  with pytest.raises(conn.RunnerError) as e: conn.Runner(addr, token=tok, timeout=10).close()
  assert e.value.code == P.EAUTH, e.value
  return str(e.value)

# A small MLP, forward and backward, on the runner and on tinygrad's own CPU device; the runner must have run kernels.
WORKLOAD = """
import json, numpy as np, client.remote_metal
from tinygrad import Device, Tensor
rng = np.random.default_rng(0)
x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((32, 16), (16, 24), (24, 4)))
def step(dev):
  tx, t1, t2 = Tensor(x, device=dev), Tensor(w1, device=dev), Tensor(w2, device=dev)
  loss = ((tx @ t1).relu() @ t2).square().mean()
  return loss.numpy(), *(g.numpy() for g in loss.gradient(t1, t2))
remote, local = step("REMOTE"), step("CPU")
print(json.dumps({"err": max(float(np.abs(a - b).max()) for a, b in zip(remote, local)), "loss": float(remote[0]),
                  "kernels": len(Device["REMOTE"].runner._names)}))"""

def run_workload(addr:str, token_file) -> dict:
  import json
  r = run_python(WORKLOAD, {"METAL_RUNNER": addr, "METAL_RUNNER_TOKEN_FILE": str(token_file)}, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.splitlines()[-1])

def test_appliance_serves_tinygrad_with_its_token_and_stops_on_sigterm(appliance_bin, token_file):
  with appliance(appliance_bin, token_file) as a:
    addr = a.listening()
    out = run_workload(addr, token_file)
    assert out["err"] < 1e-4 and out["loss"] > 0 and out["kernels"] >= 2, out
    assert "the runner requires a token" in refused(addr, None)
    refused(addr, b"not the token")
    refused(addr, token(token_file) + b"\n")  # the file's newline is not part of the token
    assert re.search(r"session \d+: authenticated", a.text()) and "authentication failed" in a.text()
    # a session still open at the stop: the program blocks SIGTERM for sigwait(), the session process must not inherit that
    with conn.Runner(addr, token=token(token_file), timeout=10) as r:
      r.ping()
      code, took = a.signal(signal.SIGTERM)
    log = a.text()
    assert code == 0 and took < 3, (code, took, log)
    assert "appliance: SIGTERM: stopping the runner" in log and re.search(r"stopping: \d+ sessions open", log), log
    assert re.search(r"session \d+: ended: the runner stopped", log) and log.rstrip().endswith("appliance: stopped"), log
    assert "ended by signal" not in log, log

def test_sighup_reads_the_token_again_and_open_sessions_carry_on(appliance_bin, token_file):
  old = token(token_file)
  with appliance(appliance_bin, token_file) as a:
    addr = a.listening()
    with conn.Runner(addr, token=old, timeout=10) as open_session:
      open_session.ping()
      token_file.write_bytes(b"the rotated token")
      os.kill(a.proc.pid, signal.SIGHUP)
      wait_for(a, "appliance: SIGHUP: the token file read again")
      refused(addr, old)
      with conn.Runner(addr, token=b"the rotated token", timeout=10) as r: r.ping()
      open_session.ping()   # authenticated with the old token, still served
    token_file.write_bytes(b"")  # a bad token file leaves the runner serving with the token it has
    os.kill(a.proc.pid, signal.SIGHUP)
    wait_for(a, "the token must be 1 to 4096 bytes")
    with conn.Runner(addr, token=b"the rotated token", timeout=10) as r: r.ping()
    code, took = a.signal(signal.SIGINT)
    log = a.text()
    assert code == 0 and took < 3, (code, took, log)
    assert log.count("appliance: SIGHUP: the token file read again") == 1, log
    assert "appliance: SIGINT: stopping the runner" in log, log

def wait_for(a, text:str, timeout:float=5.0):
  deadline = time.monotonic() + timeout
  while text not in a.text():
    assert time.monotonic() < deadline, f"no {text!r} in the log: {a.text()}"
    time.sleep(0.05)

def test_a_runner_that_cannot_listen_ends_the_program(appliance_bin, token_file):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    with appliance(appliance_bin, token_file, port=s.getsockname()[1]) as a:
      code = a.proc.wait(10)
      log = a.text()
      assert code == 1 and "the runner stopped by itself" in log, (code, log)

def test_a_missing_token_file_is_an_error(appliance_bin, tmp_path):
  with appliance(appliance_bin, tmp_path / "missing") as a:
    assert a.proc.wait(10) == 1 and "missing: No such file or directory" in a.text()

def test_library_calls_an_embedding_program_relies_on():
  """tests/embed_api.c: serve again after a stop, a stop from another thread or before serving, the program's own children."""
  make_appliance()  # builds daemon/libmetal_runner.a
  BUILD.mkdir(exist_ok=True)
  exe = BUILD / "embed_api"
  r = subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-I", str(ROOT / "daemon"), "-o", str(exe),
                      str(ROOT / "tests" / "embed_api.c"), str(ROOT / "daemon" / "libmetal_runner.a"), "-lpthread", *FRAMEWORKS],
                     capture_output=True, text=True)
  assert r.returncode == 0 and not r.stderr, r.stderr
  r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
  lines = r.stdout.splitlines()
  assert r.returncode == 0 and len(lines) == 8 and all(l.startswith("ok ") for l in lines), r.stdout + r.stderr

# *** slow: CMake, and valgrind

def cmake(*args, cwd=None):
  r = subprocess.run(["cmake", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return r.stdout + r.stderr

def serves_and_stops(binary, token_file):
  with appliance(binary, token_file) as a:
    addr = a.listening()
    with conn.Runner(addr, token=token(token_file), timeout=10) as r: r.ping()
    refused(addr, b"not the token")
    assert a.signal(signal.SIGTERM)[0] == 0, a.text()

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed (setup.sh test installs it)")
def test_cmake_builds_the_example_in_the_tree_and_against_an_installed_library(tmp_path, token_file):
  b, prefix, app = tmp_path / "build", tmp_path / "prefix", tmp_path / "app"
  cmake("-S", ROOT, "-B", b, "-DMETAL_RUNNER_EXAMPLES=ON")
  out = cmake("--build", b, "-j2")
  assert "warning" not in out, out
  serves_and_stops(b / "examples" / "embed" / "appliance", token_file)
  # what a vendor's own project does: find_package(metal_runner) against the installed library and headers
  cmake("--install", b, "--prefix", prefix)
  assert (prefix / "include" / "metal_runner" / "metal_runner.h").exists()
  cmake("-S", EMBED, "-B", app, f"-DCMAKE_PREFIX_PATH={prefix}")
  out = cmake("--build", app, "-j2")
  assert "warning" not in out, out
  serves_and_stops(app / "appliance", token_file)

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_appliance_under_valgrind(appliance_bin, token_file, tmp_path):
  """The example and its session processes under valgrind (-n: no seccomp filter, which valgrind's own system calls would trip):
  the workload, a refused token, a token read again on SIGHUP and SIGTERM leave no errors and no definite or indirect leaks."""
  import leakcheck
  logs = tmp_path / "vg"
  logs.mkdir()
  with appliance(appliance_bin, token_file, "-n", prefix=(*leakcheck.VALGRIND, f"--log-file={logs}/vg.%p")) as a:
    addr = a.listening(120)
    assert run_workload(addr, token_file)["err"] < 1e-4
    refused(addr, b"not the token")
    os.kill(a.proc.pid, signal.SIGHUP)
    wait_for(a, "appliance: SIGHUP: the token file read again", 60)
    with conn.Runner(addr, token=token(token_file), timeout=30) as r: r.ping()
    code, _ = a.signal(signal.SIGTERM, timeout=60)
  results = {f.name: leakcheck.parse_log(f.read_text()) for f in logs.glob("vg.*")}
  assert code == 0 and len(results) >= 4, (code, results, a.text())  # the program, and a process per session
  assert all(r == (0, 0, 0) for r in results.values()), results
