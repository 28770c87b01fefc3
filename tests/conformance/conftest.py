"""The conformance suite's options and fixtures.

  pytest tests/conformance                                  starts its own CPU runners, once per isolation mode (process, thread)
  pytest tests/conformance --runner HOST:PORT [--token-file FILE] [--runner-isolation process]
                                                            checks a runner already running
  METAL_RUNNER_BIN=daemon/metal_runner_emu pytest tests/conformance --backend metal
                                                            starts Metal runners (here: on the Metal emulator, a test harness)
                                                            instead: process isolation is then spawned session processes

Against a runner named by --runner, a case that needs what cannot be arranged from outside (a runner option, a crash, a token)
skips and says why; a runner that does not answer fails every case.
"""
import collections, pathlib
import pytest
from conformance.spec import Pool, Target, Raw, P, sections

def pytest_addoption(parser):
  g = parser.getgroup("conformance", "protocol.md conformance suite (tests/conformance)")
  g.addoption("--runner", metavar="HOST:PORT", help="check this runner, already running, instead of starting runners")
  g.addoption("--token-file", metavar="FILE", help="the token of the runner named by --runner (trailing CR/LF removed)")
  g.addoption("--runner-isolation", choices=("process", "thread"), help="the isolation mode of the runner named by --runner, if known")
  g.addoption("--backend", choices=("cpu", "metal"), default="cpu", help="the backend of the runners this suite starts (default cpu)")
  g.addoption("--isolations", default="process,thread", help="the --isolation modes of the runners this suite starts, comma-separated "
              "(default process,thread; spawn: CPU sessions spawned as Metal's are)")

def pytest_configure(config):
  config.addinivalue_line("markers", "section(*names): the protocol.md sections a conformance case checks")

def pytest_generate_tests(metafunc):
  if "target" in metafunc.fixturenames:
    ids = ["external"] if metafunc.config.getoption("--runner", None) else metafunc.config.getoption("--isolations").split(",")
    metafunc.parametrize("target", ids, indirect=True, scope="session")

@pytest.fixture(scope="session")
def pool(request):
  p = Pool(request.config.getoption("--backend"))
  yield p
  p.close()

@pytest.fixture(scope="session")
def target(request, pool) -> Target:
  """The runner under test: the one --runner names, or one this suite starts with --isolation process or thread."""
  cfg = request.config
  if request.param == "external":
    token = None
    if (f:=cfg.getoption("--token-file", None)):
      token = pathlib.Path(f).read_bytes().rstrip(b"\r\n")
      if not token: pytest.fail(f"--token-file {f} is empty")
    return Target(cfg.getoption("--runner", None), token, cfg.getoption("--runner-isolation", None), None)
  return pool.get(request.param, ())

@pytest.fixture(scope="session")
def _probe(request):
  """Connect once to the runner --runner names: None if it answered Thello with Rhello, else why not."""
  addr = request.config.getoption("--runner", None)
  if addr is None: return None
  try:
    c = Raw(addr, timeout=10)
    c.close()
  except (OSError, EOFError, AssertionError, ValueError) as e: return f"{type(e).__name__}: {e}"
  return None

@pytest.fixture(autouse=True)
def _runner_answers(request, _probe):
  """Every case fails, loudly, when the runner under test does not answer: the suite never passes by reaching nothing."""
  if _probe is not None: pytest.fail(f"--runner {request.config.getoption('--runner')} does not answer Thello: {_probe}", pytrace=False)

@pytest.fixture
def c(target) -> Raw:
  """A connection to the runner under test, ready for requests."""
  conn = target.connect()
  yield conn
  conn.close()

# *** the report: one line per protocol.md section, then every case that did not pass, with its reason

_results = []

def pytest_runtest_logreport(report):
  secs = dict(report.user_properties).get("sections")
  if secs is None: return
  if report.when == "call" or report.outcome != "passed":
    reason = ""
    if report.skipped and isinstance(report.longrepr, tuple): reason = report.longrepr[2]
    elif report.failed:
      crash = getattr(report.longrepr, "reprcrash", None)
      reason = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    _results.append((secs, report.nodeid, report.outcome, reason.splitlines()[0] if reason else ""))

def pytest_collection_modifyitems(items):
  for it in items:
    if (m:=it.get_closest_marker("section")) is not None: it.user_properties.append(("sections", m.args))

def pytest_terminal_summary(terminalreporter):
  if not _results: return
  tr, by = terminalreporter, collections.defaultdict(collections.Counter)
  for secs, _, outcome, _ in _results:
    for s in secs: by[s][outcome] += 1
  tr.write_sep("=", "protocol.md conformance")
  for s in sections():
    n = by.get(s)
    tr.write_line(f"  {'FAIL' if n and n['failed'] else 'ok  ' if n and n['passed'] else '----'}  ## {s:32} " +
                  (", ".join(f"{v} {k}" for k, v in sorted(n.items())) if n else "no case ran"))
  for secs, nodeid, outcome, reason in _results:
    if outcome != "passed": tr.write_line(f"  {outcome.upper():7} {nodeid} [{', '.join(secs)}]: {reason}")
