"""Fault isolation beyond tests/test_daemon.py: clients that vanish mid-reply, flood without reading or exceed the session
limit; each must cost only its own session while other clients' work completes correctly. (Clients that vanish or stall
mid-frame or sit idle are protocol.md's Robustness rules: tests/conformance/test_session.py.)
Plus the slow checks: the fuzz harness runs on its seed corpus, the seed corpus is current, and no leaks under valgrind.
"""
import os, pathlib, shutil, socket, struct, subprocess, sys, threading, time
import pytest
from client import protocol as P
from runner_proc import runner, ROOT
from wire import Raw, compile_kernel, f32, still_serving, ADD1

pytestmark = pytest.mark.cpu_only
FUZZ = ROOT / "tests" / "fuzz"

@pytest.fixture(scope="module")
def add1(): return compile_kernel(ADD1, "add1")


def memory_comes_back(r, size:int, timeout:float=10):
  """A new client can allocate size bytes (the runner's --total-mem) within timeout: the sessions before it are gone."""
  c, deadline = Raw(r.addr), time.monotonic() + timeout
  while True:
    c.alloc(1, size)
    if not c.until_pong(): return c
    if time.monotonic() > deadline: pytest.fail(f"{size} bytes never came back: a session that should have ended still holds them")
    time.sleep(0.05)

def rst_close(s:socket.socket):
  """Close with a TCP reset (SO_LINGER 0) instead of a FIN."""
  s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
  s.close()

# ---- clients that go away at the wrong moment

@pytest.mark.parametrize("iso", ["process", "thread"])
@pytest.mark.parametrize("how", ["close", "reset"])
def test_disconnect_while_a_large_read_is_being_sent(iso, how):
  """A 32 MiB Tread, then the client leaves without reading: the session's send fails, it ends and frees its memory."""
  with runner("--isolation", iso, "--total-mem", "40M") as r:
    c = Raw(r.addr)
    c.alloc(1, 32 << 20); c.write(1, 0, b"\x5a" * (32 << 20)); c.ping()
    c.req(P.TREAD, handle=1, offset=0, count=32 << 20)
    c.s.recv(1000)  # the reply has started
    (rst_close(c.s) if how == "reset" else c.close())
    memory_comes_back(r, 32 << 20).close()
    still_serving(r)

# ---- a client that floods without reading

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_client_flooding_without_reading_blocks_only_itself(iso, add1):
  """100k Tpings and never a recv: the flooder's replies back up until its session's send times out (--frame-timeout),
  which ends that session; meanwhile another client's kernels run and read back correctly and promptly."""
  _, img, entry = add1
  with runner("--isolation", iso, "--frame-timeout", "2", "-v") as r:
    flooder = Raw(r.addr)
    flooder.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    flooder.s.settimeout(30)
    sid = flooder.info["session"]
    flood = b"".join(P.pack(P.TPING, 1000 + i, payload_len=100, count=100) + bytes(100) for i in range(100000))
    outcome = {}
    def run_flood():
      try:
        flooder.send(flood)
        outcome["sent"] = "all"
      except OSError as e: outcome["sent"] = type(e).__name__
    th = threading.Thread(target=run_flood)
    th.start()
    try:
      c = Raw(r.addr, timeout=5)
      c.alloc(1, 16); c.alloc(2, 16)
      c.load(1, img, "add1", nbufs=2, nvals=1, entry=entry)
      worst, t_end = 0.0, time.monotonic() + 3
      n = 0
      while time.monotonic() < t_end:
        t0 = time.monotonic()
        c.write(2, 0, f32(n, n + 1, n + 2, n + 3))
        c.launch(1, [(1, 0), (2, 0)], [4])
        assert c.read(1, 0, 16) == f32(n + 1, n + 2, n + 3, n + 4)
        worst, n = max(worst, time.monotonic() - t0), n + 1
      assert n > 20 and worst < 1.0, f"{n} rounds, slowest {worst:.2f} s while another client flooded"
    finally:
      th.join(40)
    assert not th.is_alive(), "the flooder's send never returned"
    # the flooder's session ended: its send timed out, and the connection is closed (reset: it left requests unread)
    deadline = time.monotonic() + 15
    while f"session {sid}: send failed" not in r.log_text(0) and time.monotonic() < deadline: time.sleep(0.2)
    assert f"session {sid}: send failed" in r.log_text(0), f"flooding session {sid} did not end ({outcome})"
    try:
      while flooder.s.recv(1 << 20): pass
    except OSError: pass
    still_serving(r)

# ---- limits

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_max_sessions_refuses_the_third_and_keeps_the_first_two(iso):
  with runner("--isolation", iso, "--max-sessions", "2") as r:
    a, b = Raw(r.addr), Raw(r.addr)
    a.alloc(1, 4); a.write(1, 0, b"aaaa")
    c = Raw(r.addr, hello=False)
    code, tag, text = c.error()
    assert (code, tag) == (P.ELIMIT, 0) and "as many sessions as it allows" in text
    assert c.closed()
    b.alloc(1, 4); b.write(1, 0, b"bbbb")
    assert (a.read(1, 0, 4), b.read(1, 0, 4)) == (b"aaaa", b"bbbb")
    assert "refusing 127.0.0.1" in r.log_text() and "2 sessions is the limit" in r.log_text()
    a.close()
    # the slot comes back once the first session has ended (a process session is reaped within half a second)
    deadline = time.monotonic() + 5
    while True:
      d = Raw(r.addr, hello=False)
      try:
        d.req(P.THELLO, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG)
        if d.frame()[0] == P.RHELLO: break
      except (ConnectionError, EOFError): pass  # refused and closed before the hello went out
      assert time.monotonic() < deadline, "the closed session's slot never came back"
      time.sleep(0.1)
    assert d.ping(b"in") == b"in" and b.read(1, 0, 4) == b"bbbb"

# ---- slow: fuzzing, the seed corpus, leaks

def have_libfuzzer() -> bool:
  if shutil.which("clang") is None: return False
  p = subprocess.run(["clang", "-fsanitize=fuzzer", "-x", "c", "-", "-o", os.devnull],
                     input="#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n",
                     capture_output=True, text=True)
  return p.returncode == 0

@pytest.mark.slow
def test_fuzz_harness_builds_and_runs_on_the_seed_corpus():
  if not have_libfuzzer(): pytest.skip("needs clang with libFuzzer")
  p = subprocess.run([str(FUZZ / "run.sh")], env={**os.environ, "FUZZ_TIME": "5"}, capture_output=True, text=True, timeout=300)
  print(p.stdout)
  assert p.returncode == 0, p.stdout + p.stderr
  for t in ("session", "proto"): assert f"fuzz_{t}: ok:" in p.stdout

def test_seed_corpus_is_what_make_corpus_writes():
  """The committed seeds follow the current protocol: rerun tests/fuzz/make_corpus.py after changing it."""
  sys.path.insert(0, str(FUZZ))
  try: import make_corpus
  finally: sys.path.remove(str(FUZZ))
  for sub, items in (("session", make_corpus.sessions()), ("proto", make_corpus.frames())):
    d = FUZZ / "corpus" / sub
    assert sorted(p.name for p in d.iterdir()) == sorted(items)
    for name, data in items.items(): assert (d / name).read_bytes() == data, f"corpus/{sub}/{name} is stale"

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
@pytest.mark.parametrize("iso", ["thread", "process"])
def test_no_leaks_over_1000_sessions(iso):
  import leakcheck
  r = leakcheck.run(iso, cycles=1000)
  print(r)
  assert r.ok, str(r)
  # process isolation: the daemon, the peer broker, a process per session, per resuming connection and per peer connection
  assert r.processes == (1002 + r.resumed + 2 * r.peers if iso == "process" else 1) and r.errors == r.definite == r.indirect == 0
