"""The runner's log at its default level (no -v), read as an operator reads sshd's: one line when a client connects (its address and
session number), authenticates and ends (how, its time and requests), one for a peer runner (once per session), one when a signal stops the
runner; nothing per request. -q keeps errors only. And `--help` says what is printed where."""
import re, signal, subprocess
import pytest
from client import protocol as P
from client.connection import Runner
from runner_proc import RunnerProc, build, runner
from wire import Raw

pytestmark = pytest.mark.cpu_only

TOKEN = b"a token for the log tests"

def session_lines(log:str, n:int) -> list[str]:
  """The lines of session n, without their time."""
  return [l.split(" ", 1)[1] for l in log.splitlines() if re.match(rf"\d\d:\d\d:\d\d (warning: )?session {n}: ", l)]

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_client_connects_authenticates_and_disconnects_in_three_lines(iso, tmp_path):
  (tf:=tmp_path / "token").write_bytes(TOKEN)
  tf.chmod(0o600)
  with runner("--isolation", iso, "--token-file", str(tf)) as r:
    with Runner(r.addr, token=TOKEN, timeout=10) as c:
      local = "%s:%d" % c.sock.getsockname()[:2]
      for _ in range(20): c.ping(b"x")   # requests: not one line each
    log = r.wait_log("session 1: ended: ")
    lines = session_lines(log, 1)
    assert len(lines) == 3, log
    assert lines[0] == f"session 1: client connected from {local}", log
    assert lines[1] == "session 1: authenticated", log
    assert re.fullmatch(r"session 1: ended: the client disconnected( \(connection reset\))?; \d+\.\d s, 2\d requests, \d+ answered, \d+ bytes in, "
                        r"\d+ bytes out", lines[2]), log

def test_an_idle_timeout_ends_the_session_with_a_line_that_says_so():
  with runner("--idle-timeout", "1") as r:
    c = Raw(r.addr)
    c.ping()
    assert r.wait_log("session 1: ended: idle for 1 s (--idle-timeout); ")
    assert c.closed()
    lines = session_lines(r.log_text(), 1)
    assert len(lines) == 2 and lines[0].startswith("session 1: client connected from 127.0.0.1:"), lines

def test_a_protocol_error_ends_the_session_with_its_reason():
  with runner() as r:
    c = Raw(r.addr, hello=False)
    c.req(P.THELLO, magic=1234, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG)
    assert c.error()[0] == P.EVERSION
    r.wait_log("session 1: ended: EVERSION: bad magic: not a metal_runner client; ")

@pytest.mark.parametrize("iso", ["process", "thread"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_runner_with_a_line_and_ends_each_session_with_one(iso, sig):
  r = RunnerProc("--isolation", iso)
  try:
    c = Raw(r.addr)
    c.ping()
    r.wait_log("session 1: client connected from")
    r.proc.send_signal(getattr(signal, sig))
    assert r.proc.wait(10) == 0
    log = r.log_text(0)
    assert f"stopping on {sig}: 1 sessions open" in log, log
    assert re.search(r"session 1: ended: the runner stopped; \d+\.\d s, 2 requests", log), log
  finally: r.stop()

def test_a_peer_connection_has_a_line_of_its_own():
  """A Tpeer first frame is a runner, not a client: no connected or ended line, one that names it and the session it is for."""
  with runner() as r:
    c = Raw(r.addr, hello=False)
    c.req(P.TPEER, magic=P.MAGIC, grant=(7 << 32) | 1, count=0, cnonce=bytes(32), mac=bytes(32))
    assert c.error()[0] == P.EGRANT
    log = r.wait_log("session 1: peer connection from 127.0.0.1:")
    assert len(session_lines(log, 1)) == 1 and "for session 7" in log, log

@pytest.mark.parametrize("iso", ["process", "thread"])
@pytest.mark.parametrize("verbose", [False, True])
def test_a_runner_that_links_into_a_session_has_one_line_however_many_links(iso, verbose):
  """A sharded step sets up a link per copy, each a peer connection: the default log names the runner that connected once per session;
  each connection's own line (`handed to session`) is -v's."""
  from conformance.test_links import dial, listen
  with runner("--isolation", iso, *(["-v"] if verbose else [])) as r:
    snd, rcv = Raw(r.addr), Raw(r.addr)
    for link in (1, 2, 3):
      g, sec = listen(rcv, link)
      dial(snd, link, r.addr, g, sec)
    rcv.ping(b"x")
    log = r.log_text()
    snd.close(); rcv.close()
  assert len(re.findall(r"session 2: runner at 127\.0\.0\.1 connected to copy or link into it\n", log + "\n")) == 1, log
  assert len(re.findall(r"peer connection from 127\.0\.0\.1:\d+ handed to session 2", log)) == (3 if verbose else 0), log

@pytest.mark.parametrize("quiet", [False, True])
def test_quiet_keeps_only_errors(quiet):
  """-q: no client lines and no warnings (here a connection that never says hello, closed at the handshake deadline), which the
  default level shows."""
  with runner(*(["-q"] if quiet else []), "--handshake-timeout", "1") as r:
    with Runner(r.addr, timeout=10) as c: c.ping(b"x")
    c = Raw(r.addr, hello=False)
    assert c.closed()   # the handshake deadline came
    log = r.log_text(settle=0.5)
    assert "listening on 127.0.0.1:" in log, log
    assert bool(re.search(r"session \d", log)) != quiet and ("warning:" in log) != quiet, log

def test_help_says_what_goes_to_stdout_and_stderr():
  out = subprocess.run([str(build()), "--help"], capture_output=True, text=True, timeout=10).stdout
  text = " ".join(out.split())
  assert "With --port 0 the chosen port is printed" not in text
  assert 'prints "listening on HOST:PORT" on stdout (with --port 0, the port chosen)' in text, out
  assert "Its log goes to stderr" in text and "nothing per request" in text and "-q, --quiet" in text and "--exit-with-stdin" in text
  # as the code does: that line on stdout, the log (here the stop's line) on stderr
  p = subprocess.Popen([str(build()), "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert p.stdout.readline().startswith("listening on 127.0.0.1:")
  finally:
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
  assert "stopping on SIGTERM: 0 sessions open" in p.stderr.read()
  p.stdout.close(); p.stderr.close()
