"""The handshake deadline and the startup limit (issue 15, part 4): connections that never finish Thello (and Tauth) are
closed at --handshake-timeout and counted against --max-startups, never against --max-sessions, so silent or slow
connections cannot lock real clients out; refusals and timeouts are logged with the peer, at most a line a second.
"""
import hashlib, hmac, os, re, select, socket, time
import pytest
from client import protocol as P
from runner_proc import runner
from wire import Raw

pytestmark = pytest.mark.cpu_only
TOKEN = b"handshake test token"

def silent(addr:str) -> socket.socket:
  host, port = addr.rsplit(":", 1)
  return socket.create_connection((host, int(port)), timeout=10)

def peer(s:socket.socket) -> str:
  host, port = s.getsockname()[:2]
  return f"{host}:{port}"

def closed_within(s:socket.socket, timeout:float) -> float|None:
  """Seconds until the runner closes s (EOF or reset), reading and discarding whatever it sends; None if still open."""
  t0 = time.monotonic()
  while (left := t0 + timeout - time.monotonic()) > 0:
    if not select.select([s], [], [], left)[0]: break
    try:
      if s.recv(4096) == b"": return time.monotonic() - t0
    except (ConnectionResetError, BrokenPipeError): return time.monotonic() - t0
  return None

def hello_frame() -> bytes: return P.pack(P.THELLO, 1, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG)

def authenticate(c:Raw, token:bytes=TOKEN) -> tuple[int, dict]:
  cnonce = os.urandom(32)
  tag = c.req(P.TAUTH, cnonce=cnonce, mac=hmac.new(token, b"metal_runner-auth-v1 client" + c.info["nonce"] + cnonce, hashlib.sha256).digest())
  t, f, _ = c.frame()
  assert f["tag"] == tag
  return t, f

@pytest.fixture
def token_file(tmp_path):
  p = tmp_path / "token"
  p.write_bytes(TOKEN + b"\n")
  p.chmod(0o600)   # the runner refuses a token others can read
  return p

def handshake_lines(r) -> list[str]:
  return [l for l in r.log if "no handshake within" in l or "handshakes not logged" in l or "refusing" in l]

# ---- silent connections take no session places

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_client_gets_in_while_max_sessions_silent_connections_are_open(iso):
  with runner("--isolation", iso, "--max-sessions", "2") as r:
    quiet = [silent(r.addr) for _ in range(4)]
    try:
      a = Raw(r.addr)
      assert a.ping(b"first") == b"first"
      b = Raw(r.addr)
      assert b.ping(b"second") == b"second"
      # the two sessions are the limit: a third client is told at once, and the silent ones changed nothing
      c = Raw(r.addr, hello=False)
      code, tag, text = c.error()
      assert (code, tag) == (P.ELIMIT, 0) and "as many sessions as it allows" in text
      assert c.closed()
      assert a.ping(b"still") == b"still" and b.ping() == b""
      for s in quiet: assert closed_within(s, 0) is None  # still open, in their handshake
      for x in (a, b, c): x.close()
    finally:
      for s in quiet: s.close()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_handshake_that_finds_the_sessions_full_gets_elimit(iso):
  """A connection counted as starting completes its Thello after the last session place was taken: Rerror ELIMIT with
  the Thello's tag, then the connection closes."""
  with runner("--isolation", iso, "--max-sessions", "1") as r:
    late = Raw(r.addr, hello=False)
    first = Raw(r.addr)
    tag = late.req(P.THELLO, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG)
    code, etag, text = late.error()
    assert (code, etag) == (P.ELIMIT, tag) and "as many sessions as it allows" in text
    assert late.closed()
    assert first.ping(b"x") == b"x"
    assert f"refusing {peer(late.s)}: 1 sessions is the limit" in r.log_text()
    late.close(); first.close()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_connections_beyond_max_startups_are_refused_without_touching_sessions(iso):
  with runner("--isolation", iso, "--max-sessions", "2", "--max-startups", "3") as r:
    a = Raw(r.addr)
    quiet = [silent(r.addr) for _ in range(3)]
    try:
      time.sleep(0.3)  # the runner has accepted all three
      extra = Raw(r.addr, hello=False)
      code, tag, text = extra.error()
      assert (code, tag) == (P.ELIMIT, 0) and "handshake" in text
      assert extra.closed()
      extra.close()
      assert a.ping(b"kept") == b"kept"
      assert "3 connections in their handshake is the limit" in r.log_text()
    finally:
      for s in quiet: s.close()
    # the startup places come back as the silent connections go: the second session place was never taken
    deadline = time.monotonic() + 5
    while True:
      try:
        b = Raw(r.addr)
        break
      except (AssertionError, ConnectionError, EOFError): assert time.monotonic() < deadline, "startup places never came back"
      time.sleep(0.1)
    assert b.ping(b"in") == b"in" and a.ping() == b""
    a.close(); b.close()

# ---- the deadline

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_silent_connection_is_closed_at_the_deadline_and_logged(iso):
  with runner("--isolation", iso, "--handshake-timeout", "2") as r:
    s = silent(r.addr)
    try:
      t = closed_within(s, 8)
      assert t is not None, "a silent connection was not closed"
      assert 1.5 < t < 5, t
      assert re.search(rf"closing {re.escape(peer(s))}: no handshake within 2 s", r.log_text()), r.log_text()
    finally: s.close()
    c = Raw(r.addr)  # a prompt client is unaffected
    assert c.ping(b"ok") == b"ok"
    c.close()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_slow_loris_thello_is_closed_at_the_deadline(iso):
  """A Thello sent a byte every 0.25 s keeps the connection busy but would take 6 s: it is closed at the 2 s deadline."""
  with runner("--isolation", iso, "--handshake-timeout", "2") as r:
    s = silent(r.addr)
    try:
      t0, closed_at = time.monotonic(), None
      for b in hello_frame():
        try: s.send(bytes([b]))
        except OSError: closed_at = time.monotonic() - t0; break
        if (t := closed_within(s, 0.25)) is not None: closed_at = time.monotonic() - t0; break
      assert closed_at is not None, "the slow Thello was served"
      assert 1.5 < closed_at < 4, closed_at
      assert f"closing {peer(s)}: no handshake within 2 s" in r.log_text()
    finally: s.close()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_thello_without_tauth_is_closed_at_the_deadline(iso, token_file):
  with runner("--isolation", iso, "--token-file", str(token_file), "--handshake-timeout", "2") as r:
    c = Raw(r.addr)
    assert c.info["caps"] & P.CAP_AUTH
    t = closed_within(c.s, 8)
    assert t is not None and t < 4, t
    assert f"closing {peer(c.s)}: no handshake within 2 s" in r.log_text()
    c.close()
    # a client that authenticates in time stays past the deadline
    ok = Raw(r.addr)
    assert authenticate(ok)[0] == P.RAUTH
    time.sleep(2.5)
    assert ok.ping(b"after") == b"after"
    ok.close()

def test_a_handshake_completed_with_a_token_is_refused_when_sessions_are_full(token_file):
  with runner("--token-file", str(token_file), "--max-sessions", "1") as r:
    late, first = Raw(r.addr), Raw(r.addr)  # both past Thello, neither a session yet
    assert authenticate(first)[0] == P.RAUTH
    t, f = authenticate(late)
    assert (t, f["code"]) == (P.RERROR, P.ELIMIT)
    assert late.closed()
    assert first.ping(b"x") == b"x"
    late.close(); first.close()

# ---- the log is rationed

def test_timed_out_handshakes_are_logged_at_most_once_a_second():
  n = 50
  with runner("--handshake-timeout", "1", "--max-startups", "64") as r:
    socks = [silent(r.addr) for _ in range(n)]
    try:
      for s in socks: assert closed_within(s, 10) is not None
    finally:
      for s in socks: s.close()
    def told(lines):   # timeouts logged, plus those a later line says it left out
      return sum(1 for l in lines if "no handshake within" in l) + \
             sum(int(m.group(1)) for l in lines if (m := re.search(r"(\d+) more refused or timed-out handshakes not logged", l)))
    deadline = time.monotonic() + 5  # the counts of lines left out are told once a second, maybe in several lines
    while told(handshake_lines(r)) < n and time.monotonic() < deadline: time.sleep(0.1)
    lines = handshake_lines(r)
    assert 1 <= len(lines) <= 5 and told(lines) == n, lines
    c = Raw(r.addr)
    assert c.ping() == b""
    c.close()

def test_refused_connections_are_logged_at_most_once_a_second():
  with runner("--max-sessions", "1") as r:
    a = Raw(r.addr)
    for _ in range(30):
      c = Raw(r.addr, hello=False)
      assert c.error()[0] == P.ELIMIT
      c.close()
    deadline = time.monotonic() + 5
    while sum(1 for l in r.log if "not logged" in l) == 0 and time.monotonic() < deadline: time.sleep(0.1)
    lines = handshake_lines(r)
    assert 1 <= len(lines) <= 5, lines
    assert "refusing 127.0.0.1" in lines[0] and "1 sessions is the limit" in lines[0]
    assert re.search(r"\d+ more refused or timed-out handshakes not logged", "\n".join(lines)), lines
    a.close()
