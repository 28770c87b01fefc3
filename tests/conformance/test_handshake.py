"""Thello/Rhello, Tauth/Rauth, Versioning and Authentication: the first exchanges of a connection."""
import os, re, signal, struct, threading, time
import pytest
from conformance.spec import P, Raw, section, send_auth, client_mac, server_mac, fatal, closed, ok, TOKEN

@section("Thello, Rhello")
def test_rhello_repeats_magic_and_version_and_reports_the_runner(target):
  c = Raw(target.addr)
  i = c.info
  assert (i["magic"], i["version"]) == (P.MAGIC, 1)
  assert i["backend"] in (P.BACKEND_CPU, P.BACKEND_METAL)
  kinds = i["caps"] & (P.CAP_CPU_IMAGE | P.CAP_METALLIB | P.CAP_METAL_SOURCE)
  assert kinds, "caps name no program kind"
  if i["backend"] == P.BACKEND_CPU:
    assert P.cstr(i["arch"]) in ("x86_64", "arm64", "riscv64") and i["ncores"] >= 1
  else:   # cpu: the runner's macOS "MAJOR.MINOR.PATCH"; features: the newest Metal language version it has, "MAJOR.MINOR"
    assert i["ncores"] == 1
    assert re.fullmatch(r"\d+\.\d+\.\d+", P.cstr(i["cpu"])) and int(P.cstr(i["cpu"]).split(".")[0]) >= 10, i["cpu"]
    assert re.fullmatch(r"\d+\.\d+", P.cstr(i["features"])), i["features"]
  assert i["memory"] > 0 and 0 < i["maxbuf"] <= i["memory"] and i["maxhandles"] >= 1
  for f in ("name", "arch", "cpu", "features"): i[f].split(b"\0", 1)[0].decode("utf-8")  # UTF-8 text padded with NUL bytes

@section("Thello, Rhello")
def test_maxmsg_is_the_minimum_of_both_sides(target):
  runner_max = Raw(target.addr, hello=False).hello(maxmsg=0xffffffff)["maxmsg"]
  assert P.MIN_MAXMSG <= runner_max
  assert Raw(target.addr, hello=False).hello(maxmsg=runner_max + 1 if runner_max < 0xffffffff else runner_max)["maxmsg"] == runner_max
  c = target.connect(maxmsg=P.MIN_MAXMSG)
  assert c.info["maxmsg"] == P.MIN_MAXMSG
  assert c.ping(bytes(P.MIN_MAXMSG - 16)) == bytes(P.MIN_MAXMSG - 16)  # the largest frame both sides accept

@section("Thello, Rhello")
def test_maxmsg_below_65536_is_einval_and_closes(target):
  c = Raw(target.addr, hello=False)
  tag = c.req(P.THELLO, magic=P.MAGIC, version=1, maxmsg=P.MIN_MAXMSG - 1)
  fatal(c, P.EINVAL, tag)

@section("Thello, Rhello", "Versioning")
@pytest.mark.parametrize("type", [P.TALLOC, P.TPING, P.TSYNC, P.TAUTH, P.TRESUME], ids=lambda t: P.TYPE_NAMES[t])
def test_first_frame_other_than_thello_is_estate_and_closes(target, type):
  c = Raw(target.addr, hello=False)
  tag = c.req(type, **({"handle": 1, "bufsize": 16} if type == P.TALLOC else {}))
  assert "Thello" in fatal(c, P.ESTATE, tag)

@section("Versioning")
@pytest.mark.parametrize("frame", [struct.pack("<IHHI", 5, P.THELLO, 0, 7), struct.pack("<IHHI", 24, 999, 0, 7) + bytes(12),
                                   P.pack(P.RHELLO, 7), P.pack(P.RERROR, 7)], ids=["size-5", "unknown-type", "rhello", "rerror"])
def test_a_malformed_first_frame_is_eproto_and_closes(target, frame):
  c = Raw(target.addr, hello=False)
  c.send(frame)
  fatal(c, P.EPROTO, 7)

@section("Thello, Rhello")
def test_second_thello_is_estate_and_closes(target):
  c = target.connect()
  tag = c.req(P.THELLO, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG)
  fatal(c, P.ESTATE, tag)

@section("Thello, Rhello", "Versioning")
def test_bad_magic_is_eversion_and_closes(target):
  c = Raw(target.addr, hello=False)
  tag = c.req(P.THELLO, magic=0x12345678, version=1, maxmsg=P.DEFAULT_MAXMSG)
  assert fatal(c, P.EVERSION, tag) == "bad magic: not a metal_runner client"

@section("Thello, Rhello", "Versioning")
@pytest.mark.parametrize("version", [0, 2, 99])
def test_unsupported_version_is_eversion_naming_version_1(target, version):
  c = Raw(target.addr, hello=False)
  tag = c.req(P.THELLO, magic=P.MAGIC, version=version, maxmsg=P.DEFAULT_MAXMSG)
  assert fatal(c, P.EVERSION, tag) == f"protocol version {version} not supported; this runner speaks version 1"

@section("Versioning", "Robustness rules")
def test_a_peer_that_is_not_a_client_gets_eproto_not_a_hang(target):
  c = Raw(target.addr, hello=False)
  c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # "GET " read as a size far above maxmsg
  fatal(c, P.EPROTO)

@section("Versioning", "Robustness rules")
def test_oversized_thello_is_a_framing_error(target):
  c = Raw(target.addr, hello=False)
  c.send(P.pack(P.THELLO, 1, payload_len=4096, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG) + bytes(4096))
  assert "Thello" in fatal(c, P.EPROTO, 1)

@section("Thello, Rhello")
@pytest.mark.parametrize("first", [True, False], ids=["first-request", "later"])
def test_tresume_without_cap_resume_is_eproto(target, first):
  t = target.with_options("--resume-grace", "0")
  c = t.connect()
  assert not c.info["caps"] & P.CAP_RESUME
  if not first: c.alloc(1, 4); ok(c)
  tag = c.req(P.TRESUME, session=c.info["session"], sent=0, received=0, cnonce=os.urandom(32), mac=bytes(32))
  fatal(c, P.EPROTO, tag)

# *** Tauth and Authentication

@section("Tauth, Rauth", "Authentication")
def test_right_token_gets_in_and_rauth_proves_the_runner_holds_it(target):
  a = target.authenticating()
  c = Raw(a.addr)
  assert c.info["caps"] & P.CAP_AUTH and c.info["nonce"] != bytes(32)
  tag, cnonce = send_auth(c, a.token)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RAUTH, tag)
  assert f["mac"] == server_mac(a.token, c.info["nonce"], cnonce)
  c.alloc(1, 32); c.write(1, 0, b"authenticated" * 2)
  assert c.read(1, 0, 26) == b"authenticated" * 2

@section("Authentication")
def test_a_runner_with_a_token_sets_cap_auth_and_proves_it_on_every_connection(target):
  """What makes a client's refusal of a runner without CAP_AUTH safe: a runner started with a token never omits it, and its Rauth
  always proves the token, so a client that holds one loses nothing by refusing every runner that does not prove it."""
  a = target.authenticating()
  for _ in range(8):
    c = Raw(a.addr)
    assert c.info["caps"] & P.CAP_AUTH, "a runner with a token sent an Rhello without CAP_AUTH"
    tag, cnonce = send_auth(c, a.token)
    t, f, _ = c.frame()
    assert (t, f["tag"], f["mac"]) == (P.RAUTH, tag, server_mac(a.token, c.info["nonce"], cnonce))
    c.close()

@section("Authentication")
def test_replacing_the_token_never_drops_cap_auth_and_rauth_proves_the_new_one(target, tmp_path):
  old, new = b"the token before the reload", b"the token after the reload"
  (tf := tmp_path / "token").write_bytes(old)
  tf.chmod(0o600)
  with target.fresh("--token-file", str(tf)) as t:
    def proves(token:bytes) -> bool:
      deadline = time.monotonic() + 5
      while True:   # SIGHUP is acted on by the runner's accept loop: until then the old token is in force
        c = Raw(t.addr)
        assert c.info["caps"] & P.CAP_AUTH, "an Rhello without CAP_AUTH from a runner started with a token"
        tag, cnonce = send_auth(c, token)
        typ, f, _ = c.frame()
        if typ == P.RAUTH:
          assert (f["tag"], f["mac"]) == (tag, server_mac(token, c.info["nonce"], cnonce))
          return True
        assert typ == P.RERROR and f["code"] == P.EAUTH and time.monotonic() < deadline, f"Tauth: {P.TYPE_NAMES.get(typ, typ)} {f}"
    assert proves(old)
    tf.write_bytes(new)
    os.kill(t.pid, signal.SIGHUP)
    assert proves(new)
    tf.unlink()   # a file that cannot be read at SIGHUP keeps the token, and CAP_AUTH
    os.kill(t.pid, signal.SIGHUP)
    time.sleep(0.3)
    assert proves(new)

@section("Thello, Rhello")
@pytest.mark.parametrize("tag", [0, 1, 0x0a0d0a0d, 0xffffffff])
def test_rhello_carries_the_thello_tag_whatever_it_is(target, tag):
  """The client library's Thello tag is "\\r\\n\\r\\n" (so that a line-based server reached by mistake answers at once)."""
  c = Raw(target.addr, hello=False)
  c.send(P.pack(P.THELLO, tag, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG))
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RHELLO, tag)

@section("Authentication")
def test_every_session_gets_a_fresh_nonce(target):
  a = target.authenticating()
  assert len({Raw(a.addr).info["nonce"] for _ in range(5)}) == 5

@section("Tauth, Rauth", "Authentication")
def test_wrong_mac_is_eauth_after_a_wait_and_closes(target):
  c = Raw(target.authenticating().addr)
  t0 = time.monotonic()
  tag, _ = send_auth(c, b"guess")
  assert fatal(c, P.EAUTH, tag) == "authentication failed: wrong token"
  assert time.monotonic() - t0 >= 0.9, "a failed guess was answered at once: no rate limit"

@section("Authentication")
def test_parallel_failed_guesses_are_answered_one_second_apart(target):
  a, times = target.authenticating(), []
  def guess():
    c = Raw(a.addr)
    send_auth(c, b"guess")
    assert c.error()[0] == P.EAUTH
    times.append(time.monotonic())
  t0 = time.monotonic()
  ths = [threading.Thread(target=guess) for _ in range(3)]
  for th in ths: th.start()
  for th in ths: th.join(15)
  assert len(times) == 3
  gaps = [b - a for a, b in zip(sorted([t0] + times), sorted(times))]
  assert all(g >= 0.85 for g in gaps), f"3 parallel failures answered at {[round(t - t0, 2) for t in sorted(times)]} s"

@section("Authentication")
def test_a_failed_guess_does_not_delay_another_session(target):
  a, done = target.authenticating(), {}
  def guess():
    c = Raw(a.addr)
    send_auth(c, b"guess")
    done["code"] = c.error()[0]
  th = threading.Thread(target=guess)
  th.start()
  time.sleep(0.1)
  t0 = time.monotonic()
  c = a.connect()
  assert c.ping(b"x") == b"x" and time.monotonic() - t0 < 0.8, "another client's failed guess delayed this one"
  th.join(10)
  assert done.get("code") == P.EAUTH

@section("Authentication")
def test_a_mac_seen_in_another_session_cannot_be_replayed(target):
  a = target.authenticating()
  x = Raw(a.addr)
  tag, cnonce = send_auth(x, a.token)
  assert x.frame()[0] == P.RAUTH
  y = Raw(a.addr)
  tag, _ = send_auth(y, a.token, cnonce=cnonce, mac=client_mac(a.token, x.info["nonce"], cnonce))
  fatal(y, P.EAUTH, tag)

@section("Tauth, Rauth")
@pytest.mark.parametrize("req", ["ping", "alloc", "hello"])
def test_any_request_before_tauth_is_estate_and_closes(target, req):
  c = Raw(target.authenticating().addr)
  tag = {"ping": lambda: c.req(P.TPING, count=0), "alloc": lambda: c.alloc(1, 16),
         "hello": lambda: c.req(P.THELLO, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG)}[req]()
  fatal(c, P.ESTATE, tag)

@section("Tauth, Rauth")
def test_requests_pipelined_before_tauth_are_not_acted_on(target):
  c = Raw(target.authenticating().addr)
  c.send(P.pack(P.TALLOC, 1, handle=1, bufsize=1 << 20) + P.pack(P.TWRITE, 2, payload_len=4, handle=1, offset=0, count=4) + b"data"
         + P.pack(P.TREAD, 3, handle=1, offset=0, count=4))  # one send: the runner ends the session at the first
  fatal(c, P.ESTATE, 1)

@section("Tauth, Rauth")
def test_a_second_tauth_is_estate(target):
  a = target.authenticating()
  c = Raw(a.addr)
  send_auth(c, a.token)
  assert c.frame()[0] == P.RAUTH
  tag, _ = send_auth(c, a.token)
  fatal(c, P.ESTATE, tag)

@section("Tauth, Rauth")
def test_tauth_without_cap_auth_is_estate(target):
  if target.auth: pytest.skip("the runner requires a token (CAP_AUTH set)")
  c = Raw(target.addr)
  tag, _ = send_auth(c, TOKEN)
  fatal(c, P.ESTATE, tag)

# *** the handshake deadline and limits (Authentication)

def closed_silently(c:Raw, timeout:float) -> float|None:
  """Seconds until the runner closes c having sent nothing (EOF or reset); None if it stayed open. Any byte fails the case."""
  t0 = time.monotonic()
  c.s.settimeout(timeout)
  try: got = c.s.recv(1)
  except ConnectionResetError: return time.monotonic() - t0
  except TimeoutError: return None
  assert got == b"", f"the runner sent {got!r}... to a connection it closed at the handshake deadline"
  return time.monotonic() - t0

@section("Authentication")
@pytest.mark.parametrize("auth", [False, True], ids=["no-token", "token"])
def test_a_handshake_not_completed_within_the_deadline_is_closed_without_a_reply(target, auth):
  if target.external: pytest.skip("needs a runner started with --handshake-timeout 1")
  t = target.with_options(*(("--token-file", target.pool.token_file()) if auth else ()), "--handshake-timeout", "1")
  t0 = time.monotonic()   # before the connections: each is closed no earlier than 1 s after it was opened
  conns = {"silent": Raw(t.addr, hello=False), "trickle": Raw(t.addr, hello=False)}
  if auth:
    conns["no Tauth"], conns["half a Tauth"] = Raw(t.addr), Raw(t.addr)   # Rhello received; no Tauth, or its first 40 bytes
    conns["half a Tauth"].send(P.pack(P.TAUTH, 1, cnonce=bytes(32), mac=bytes(32))[:40])
  done, when = t.connect(), {}
  for b in P.pack(P.THELLO, 1, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG):  # a byte every 0.1 s: 2.4 s for the Thello
    try: conns["trickle"].send(bytes([b]))
    except OSError: pass
    for name, c in conns.items():
      if name not in when and closed_silently(c, 0.1 if name == "trickle" else 0.01) is not None: when[name] = time.monotonic() - t0
    if len(when) == len(conns): break
  for name, c in conns.items():
    if name not in when and closed_silently(c, 3) is not None: when[name] = time.monotonic() - t0
  assert set(when) == set(conns), f"still open after {time.monotonic() - t0:.1f} s: {set(conns) - set(when)}"
  assert all(1 <= w < 4 for w in when.values()), f"closed at {when} s with a 1 s deadline"
  assert done.ping(b"in time") == b"in time"   # a completed handshake is a session: no deadline

@section("Authentication")
@pytest.mark.parametrize("auth", [False, True], ids=["before-thello", "before-tauth"])
def test_connections_in_their_handshake_beyond_the_limit_get_elimit_tag_0(target, auth):
  if target.external: pytest.skip("needs a runner started with --max-startups 2")
  t = target.with_options("--max-startups", "2", *(("--token-file", target.pool.token_file()) if auth else ()))
  s = t.connect()  # a session takes no handshake place once it is one
  quiet = [Raw(t.addr, hello=auth) for _ in range(2)]   # silent, or past Thello and waiting to send Tauth
  time.sleep(0.2)  # the runner has accepted both
  fatal(Raw(t.addr, hello=False), P.ELIMIT, 0)
  assert s.ping(b"x") == b"x"
  for q in quiet: q.close()
  deadline = time.monotonic() + 5
  while True:  # the places come back once the runner has seen the quiet ones go
    try: assert t.connect().ping(b"y") == b"y"; break
    except (AssertionError, EOFError, OSError):
      assert time.monotonic() < deadline, "the handshake places never came back"
      time.sleep(0.05)

@section("Thello, Rhello", "Tauth, Rauth")
@pytest.mark.parametrize("auth", [False, True], ids=["thello", "tauth"])
def test_requests_pipelined_right_after_the_handshake_are_served(target, auth):
  """A client need not wait: frames sent with its Thello (or with its Tauth) in one segment are the session's first requests,
  even where the runner hands the connection to a session process or thread once the handshake is done."""
  t = target.authenticating() if auth else target
  c = Raw(t.addr, hello=False)
  hello = P.pack(P.THELLO, 1, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG)
  reqs = (P.pack(P.TALLOC, 2, handle=1, bufsize=8) + P.pack(P.TWRITE, 3, payload_len=8, handle=1, offset=0, count=8) + b"pipeline"
          + P.pack(P.TREAD, 4, handle=1, offset=0, count=8))
  if auth:
    c.send(hello)
    t_, f, _ = c.frame()
    assert t_ == P.RHELLO
    snonce, cnonce = f["nonce"], os.urandom(32)
    c.send(P.pack(P.TAUTH, 5, cnonce=cnonce, mac=client_mac(t.token, snonce, cnonce)) + reqs)
    t_, f, _ = c.frame()
    assert (t_, f["tag"], f["mac"]) == (P.RAUTH, 5, server_mac(t.token, snonce, cnonce))
  else:
    c.send(hello + reqs)
    assert c.frame()[0] == P.RHELLO
  t_, f, p = c.frame()
  assert (t_, f["tag"], p) == (P.RREAD, 4, b"pipeline")

@section("Authentication")
@pytest.mark.parametrize("auth", [False, True], ids=["thello", "tauth"])
def test_a_handshake_that_finds_the_sessions_full_gets_elimit_with_its_tag(target, auth):
  if target.external: pytest.skip("needs a runner started with --max-sessions 1")
  t = target.with_options("--max-sessions", "1", *(("--token-file", target.pool.token_file()) if auth else ()))
  late = Raw(t.addr, hello=auth)      # accepted (and past Thello when the runner wants a Tauth), not yet a session
  first = t.connect()                 # takes the only session place
  tag = send_auth(late, t.token)[0] if auth else late.req(P.THELLO, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG)
  fatal(late, P.ELIMIT, tag)
  fatal(Raw(t.addr, hello=False), P.ELIMIT, 0)   # accepted while the sessions are full: told before it sends anything
  assert first.ping(b"x") == b"x"
  first.close()

@section("Authentication")
def test_only_trailing_newlines_and_carriage_returns_are_removed_from_the_token(target, tmp_path):
  p = tmp_path / "token"
  p.write_bytes(b"\n tok\r\nen \t\n\r\n\r")
  p.chmod(0o600)
  with target.fresh("--token-file", str(p)) as t:
    t.token = b"\n tok\r\nen \t"
    c = t.connect()
    assert c.ping(b"in") == b"in"
