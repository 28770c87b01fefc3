"""The daemon's files call one way, down (docs/layout.md, The runner's layers; issue 36).

The graph is drawn from the objects' symbols (tests/file_graph.py: nm over daemon/*.o after make): a file uses another when its
object references a symbol the other's defines. No two files may use each other, directly or around a circle, except the session
core's own files; and nothing the session core uses, however indirectly, is above it.
"""
import pathlib, shutil, subprocess
import pytest
from file_graph import graph, circles

ROOT = pathlib.Path(__file__).resolve().parents[1]
DAEMON = ROOT / "daemon"

# The session core: frame input, replies and the error queue (session.h declares what the session's files share). Its own files may
# use each other; today it is one file.
SESSION_CORE = {"session"}
# Above the core: the start, the accept loop, the session's start, the serve loop, the request handlers and what they share.
ABOVE_CORE = {"main", "server", "isolate", "dispatch", "handshake", "buffers", "programs", "launch", "profile", "cachereq",
              "resume", "peer", "link", "grant"}

@pytest.fixture(scope="module")
def files() -> dict:
  if shutil.which("nm") is None: pytest.skip("no nm to read the objects' symbols")
  r = subprocess.run(["make", "-s", "-C", str(DAEMON)], capture_output=True, text=True, timeout=600)
  if r.returncode != 0: pytest.skip(f"make -C daemon failed: {(r.stdout + r.stderr).strip()[-400:]}")
  g = graph(DAEMON, sources=DAEMON)
  assert SESSION_CORE | ABOVE_CORE <= set(g), "a file this test names is not in daemon/ any more: update the test and docs/layout.md"
  return g

def test_no_two_files_use_each_other_except_the_session_cores(files):
  assert [c for c in circles(files) if not set(c) <= SESSION_CORE] == []

def test_the_session_core_uses_nothing_above_it(files):
  seen, todo = set(), list(SESSION_CORE)
  while todo:
    f = todo.pop()
    for to in files[f]:
      if to not in seen: seen.add(to); todo.append(to)
  assert {f: sorted(set(files[f]) & ABOVE_CORE) for f in SESSION_CORE} == {f: [] for f in SESSION_CORE}
  assert seen & ABOVE_CORE == set()
