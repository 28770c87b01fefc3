# Shared test setup: the repo on sys.path, the daemon built once, CPU runners on 127.0.0.1 started and stopped by pid.
import contextlib, os, pathlib, signal, subprocess, sys
import pytest

# A suite started with SIGINT or SIGHUP ignored (nohup, or `./test.sh &` from a script: a shell without job control ignores SIGINT in
# what it starts in the background) passes the ignoring on to every program it starts, across exec: the tests that send a program
# Ctrl-C or a hangup then see it ignored. Handled here instead (Ctrl-C interrupts the suite; a hangup is still ignored by it), and a
# handler, unlike an ignored disposition, is reset to the default in the programs the tests start.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN: signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN: signal.signal(signal.SIGHUP, lambda *_: None)

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
# A token in the developer's environment, or in their ~/.metal_runner_token, is for their runner, not for the tokenless ones the tests
# start: a client that holds one refuses every runner that does not prove it (client/connection.py). Set and empty, the variable means
# no token at all. Tests that want a token set it themselves.
os.environ["METAL_RUNNER_TOKEN_FILE"] = ""
# every runner a test starts is a RunnerProc; DAEMON honours METAL_RUNNER_BIN (a prebuilt daemon, e.g. the sanitizer build)
from runner_proc import DAEMON, METAL_BIN, RunnerProc, build_error, stop  # noqa: E402 (stop: for the tests)

def pytest_configure(config):
  config.addinivalue_line("markers", "cpu_only: runs kernels on a runner with the CPU backend (any host, no GPU)")
  config.addinivalue_line("markers", "metal: runs kernels on a Metal runner (the Metal emulator on Linux, a real GPU on macOS)")

@pytest.fixture(scope="session")
def daemon_bin() -> pathlib.Path:
  if (why:=build_error()) is not None: pytest.skip(f"daemon binary cannot be built: {why}")
  return DAEMON

@contextlib.contextmanager
def runner(*args:str, backend:str="cpu"):
  """A runner (RunnerProc) on 127.0.0.1 with a free port, its log on the test's stderr; yields (address, Popen). It leads its own process
  group, so a test can kill it together with its session processes (os.killpg(proc.pid, ...)); only this process and its children are
  ever signalled. Skips the test if the daemon cannot be built."""
  if (why:=build_error()) is not None: pytest.skip(f"daemon binary cannot be built: {why}")
  r = RunnerProc(*args, backend=backend, stdin=subprocess.DEVNULL, log=False, group=True)
  try: yield r.addr, r.proc
  finally: r.stop(5)

@pytest.fixture(scope="session")
def cpu_runner(daemon_bin) -> str:
  """The address of a CPU runner shared by the whole session (tinygrad opens a device once per process)."""
  with runner() as (addr, _): yield addr

@pytest.fixture
def own_runner(daemon_bin):
  """A CPU runner for one test: yields (address, Popen)."""
  with runner() as r: yield r

def run_python(code:str, env:dict[str, str]|None=None, timeout:float=300, unset:tuple[str, ...]=()) -> subprocess.CompletedProcess:
  """Runs code in a fresh python (its own tinygrad Device table) with the repo importable; fails the test on a timeout."""
  full = {k: v for k, v in os.environ.items() if k not in unset and k not in ("DEV", "DEBUG", "BEAM")}
  full.update({"PYTHONPATH": os.pathsep.join([str(ROOT)] + ([full["PYTHONPATH"]] if full.get("PYTHONPATH") else [])), **(env or {})})
  try: return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
  except subprocess.TimeoutExpired as e: pytest.fail(f"subprocess did not finish in {timeout} s (hang?)\nstdout: {e.stdout}\nstderr: {e.stderr}")

# *** Metal runners: METAL_RUNNER names one already running (a Mac's); otherwise one is started here, on macOS the real
# daemon/metal_runner, elsewhere daemon/metal_runner_emu, the daemon on the Metal emulator (tests/metal_emulator, a test harness).
# A Metal test never passes without reaching a runner: one that cannot be built or reached fails the test.

def external_metal_runner() -> str|None:
  return os.environ.get("METAL_RUNNER", "").split(",")[0].strip() or None

def metal_runner_proc(*args:str, env:dict[str, str]|None=None):
  """A Metal runner of the test's own on 127.0.0.1 (RunnerProc: .addr, .log_text(), .stop()); fails if it cannot be built."""
  if (why:=build_error(metal=True)) is not None: pytest.fail(f"the Metal runner cannot be built, so no Metal test can run: {why}")
  return RunnerProc(*args, backend="metal", binary=METAL_BIN, env=env)

def needs_own_metal_runner():
  if external_metal_runner(): pytest.skip("starts a Metal runner with its own options; METAL_RUNNER names one already running")

def is_emulator(addr:str) -> bool:
  from client.connection import Runner
  with Runner(addr) as r: return "emulator" in r.info.name

@pytest.fixture(scope="session")
def metal_addr() -> str:
  """The address of a Metal runner shared by the session: METAL_RUNNER's, which must answer as a Metal runner, or one started here."""
  if (addr:=external_metal_runner()) is not None:
    from client.connection import Runner, RunnerError
    try:
      with Runner(addr, connect_timeout=10) as r: backend = r.info.backend
    except (RunnerError, OSError) as e: pytest.fail(f"METAL_RUNNER={addr} does not answer: {e}")
    if backend != "metal": pytest.fail(f"METAL_RUNNER={addr} is a runner with the {backend} backend, not metal")
    yield addr
    return
  r = metal_runner_proc()
  try: yield r.addr
  finally: r.stop()

@pytest.fixture
def emulator_only(metal_addr):
  """For checks only the emulator can make (guard pages, live-object counts, validation that fails a command buffer)."""
  if not is_emulator(metal_addr): pytest.skip("checks the Metal emulator's own reports; a real Metal device has none of them")
