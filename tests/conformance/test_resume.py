"""Tresumekey/Rresumekey and Tresume/Rresume: a session that survives a dropped link (protocol.md, Resuming a session)."""
import hashlib, hmac, os, select, socket, struct, time
import pytest
from conformance.spec import P, Raw, section, fatal, ok, closed, one_error, client_mac

CLIENT, SERVER = b"metal_runner-resume-v1 client", b"metal_runner-resume-v1 server"

def resumable(target):
  if not target.info["caps"] & P.CAP_RESUME: pytest.skip("the runner does not offer CAP_RESUME (started with --resume-grace 0?)")

def key(c, mode:int=P.RESUME_ON) -> dict:
  tag = c.req(P.TRESUMEKEY, mode=mode)
  t, f, p = c.frame()
  assert (t, f["tag"], f["size"], p) == (P.RRESUMEKEY, tag, 56, b""), (t, f)
  return f

def start(target) -> tuple:
  """A resumable session holding buffer 1 (16 bytes of 5): (connection, key, requests sent, reply bytes received). It ends with a
  round trip, so all its requests are processed: a resume that arrives while requests still wait in the old connection is
  answered with the smaller count, rightly, and the cases here would have to send those again."""
  resumable(target)
  c = target.connect()
  k = key(c)
  c.alloc(1, 16)
  c.write(1, 0, b"\5" * 16)
  c.ping()
  return c, k, 4, 72

def tresume(target, session:int, secret:bytes, sent:int, received:int, tag:int=77, maxmsg:int=P.DEFAULT_MAXMSG):
  """Tresume on a new connection (Thello with maxmsg, and Tauth if the runner asks); returns (connection, cnonce)."""
  n = target.connect(maxmsg=maxmsg)
  cn = os.urandom(32)
  mac = hmac.new(secret, CLIENT + n.info["nonce"] + cn + struct.pack("<IQQ", session, sent, received), hashlib.sha256).digest()
  n.send(P.pack(P.TRESUME, tag, session=session, sent=sent, received=received, cnonce=cn, mac=mac))
  return n, cn

@section("Resuming a session", "Thello, Rhello")
def test_each_connection_gets_a_fresh_nonce(target):
  resumable(target)
  a, b = target.connect(), target.connect()
  assert a.info["nonce"] != b.info["nonce"] and len(set(a.info["nonce"])) > 8

@section("Resuming a session")
def test_tresumekey_on_off_and_bad_mode(target, c):
  resumable(target)
  k = key(c)
  assert k["grace"] > 0 and k["log"] >= 65536 and len(set(k["secret"])) > 8
  assert key(c)["secret"] == k["secret"]                  # a second ON: the same key
  off = key(c, P.RESUME_OFF)
  assert (off["grace"], off["log"], off["secret"]) == (0, 0, bytes(32))
  tag = c.req(P.TRESUMEKEY, mode=2)
  code, etag, _ = c.error()
  assert (code, etag) == (P.EINVAL, tag)
  ok(c)

@section("Resuming a session")
def test_resume_continues_the_session(target):
  c, k, sent, received = start(target)
  c.close()
  n, cn = tresume(target, c.info["session"], k["secret"], sent, received)
  t, f, _ = n.frame()
  assert (t, f["tag"], f["processed"]) == (P.RRESUME, 77, sent)
  assert f["mac"] == hmac.new(k["secret"], SERVER + cn + n.info["nonce"], hashlib.sha256).digest()
  assert n.read(1, 0, 16) == b"\5" * 16

@section("Resuming a session")
def test_resume_sends_again_the_replies_not_received(target):
  c, k, sent, received = start(target)
  c.ping(b"seen")
  tag = c.req(P.TPING, b"lost", count=4)   # processed; its reply is "lost" with the link
  select.select([c.s], [], [], 5)          # processed: its reply has arrived, unread
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], sent + 2, received + 20)
  assert n.frame()[1]["processed"] == sent + 2
  t, f, p = n.frame()
  assert (t, f["tag"], p) == (P.RPING, tag, b"lost")

@section("Resuming a session", "Error codes")
def test_resume_of_an_unknown_session(target):
  resumable(target)
  n, _ = tresume(target, 0xfffffff0, os.urandom(32), 0, 0)
  fatal(n, P.ERESUME, 77)

@section("Resuming a session", "Error codes")
def test_resume_with_a_wrong_proof_does_not_touch_the_session(target):
  c, k, sent, received = start(target)
  n, _ = tresume(target, c.info["session"], bytes(a ^ 1 for a in k["secret"]), sent, received)
  fatal(n, P.EAUTH, 77)
  ok(c)

@section("Resuming a session")
def test_a_replayed_tresume_fails(target):
  c, k, sent, received = start(target)
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], sent, received)
  assert n.frame()[0] == P.RRESUME
  m = target.connect()
  cn = os.urandom(32)   # the first connection's nonce with this one's Tresume: what a replay amounts to
  mac = hmac.new(k["secret"], CLIENT + n.info["nonce"] + cn + struct.pack("<IQQ", c.info["session"], sent, received), hashlib.sha256).digest()
  m.send(P.pack(P.TRESUME, 5, session=c.info["session"], sent=sent, received=received, cnonce=cn, mac=mac))
  fatal(m, P.EAUTH, 5)
  ok(n)

@section("Resuming a session")
def test_the_proven_resume_closes_a_standing_connection(target):
  c, k, sent, received = start(target)
  n, _ = tresume(target, c.info["session"], k["secret"], sent, received)
  assert n.frame()[0] == P.RRESUME
  assert closed(c)
  ok(n)

@section("Resuming a session", "Error codes")
@pytest.mark.parametrize("claim", ["sent below processed", "received above sent"])
def test_counts_the_runner_cannot_honour_end_the_session(target, claim):
  c, k, sent, received = start(target)
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], sent - (claim[0] == "s"), received + (claim[0] == "r"))
  fatal(n, P.ERESUME, 77)
  again, _ = tresume(target, c.info["session"], k["secret"], sent, received)
  fatal(again, P.ERESUME, 77)   # the session is gone

@section("Resuming a session")
def test_tresume_only_as_the_first_request(target, c):
  resumable(target)
  ok(c)
  tag = c.req(P.TRESUME, session=1, sent=0, received=0, cnonce=bytes(32), mac=bytes(32))
  fatal(c, P.ESTATE, tag)

@section("Resuming a session")
def test_the_grace_period_ends_the_session(target):
  t = target.with_options("--resume-grace", "1")
  c, k, sent, received = start(t)
  c.close()
  time.sleep(3)     # the grace period runs from when the runner sees the close: give it 2 s of slack
  n, _ = tresume(t, c.info["session"], k["secret"], sent, received)
  fatal(n, P.ERESUME, 77)

@section("Resuming a session", "Authentication")
def test_a_resume_authenticates_like_a_new_connection(target):
  t = target.authenticating()
  c, k, sent, received = start(t)
  c.close()
  n, _ = tresume(t, c.info["session"], k["secret"], sent, received)   # Thello, Tauth with the token, then Tresume
  assert n.frame()[0] == P.RRESUME
  ok(n)

@section("Resuming a session", "Thello, Rhello")
def test_no_cap_resume_no_tresumekey(target):
  t = target.with_options("--resume-grace", "0")
  c = t.connect()
  assert not c.info["caps"] & P.CAP_RESUME
  tag = c.req(P.TRESUMEKEY, mode=P.RESUME_ON)
  fatal(c, P.EPROTO, tag)

@section("Resuming a session", "Copies between runners")
def test_a_session_waiting_for_its_client_takes_a_copy_between_runners(target):
  from conformance.test_peer import grant, peersend
  d, k, sent, received = start(target)
  if not d.info["caps"] & P.CAP_PEER: pytest.skip("the runner does not offer CAP_PEER")
  g, sec = grant(d, 1, 4, 8)                       # a request, and a 56-byte reply: counted
  d.close()
  time.sleep(0.3)                                  # the destination session now waits for a resume
  c = target.connect()
  c.alloc(9, 8); c.write(9, 0, b"peerdata")
  _, t, f, p = peersend(c, 9, 0, 8, target.addr, g, sec)
  assert t == P.RPEERSEND, (t, f, p[:300])         # the bytes landed while the destination's client was away
  n, _ = tresume(target, d.info["session"], k["secret"], sent + 1, received + 56)
  assert n.frame()[1]["processed"] == sent + 1
  assert n.read(1, 0, 16) == b"\5" * 4 + b"peerdata" + b"\5" * 4

@section("Resuming a session", "Error codes")
@pytest.mark.parametrize("how", ["never took a key", "withdrew its key"])
def test_a_session_without_a_key_is_not_resumed(target, how):
  resumable(target)
  c = target.connect()
  if how == "withdrew its key":
    k = key(c)
    key(c, P.RESUME_OFF)
    secret = k["secret"]
  else: secret = os.urandom(32)
  n, _ = tresume(target, c.info["session"], secret, 1, 56)
  fatal(n, P.EAUTH, 77)
  ok(c)                                            # the session it names is not affected

@section("Resuming a session")
def test_no_cap_resume_no_tresume(target):
  t = target.with_options("--resume-grace", "0")
  n = t.connect()
  n.send(P.pack(P.TRESUME, 9, session=1, sent=0, received=0, cnonce=bytes(32), mac=bytes(32)))
  fatal(n, P.EPROTO, 9)

@section("Resuming a session")
def test_a_request_cut_off_is_not_processed_and_comes_again_whole(target):
  c, k, sent, received = start(target)
  c.send(P.pack(P.TWRITE, 50, payload_len=16, handle=1, offset=0, count=16) + b"\7" * 8)   # half of it
  time.sleep(0.2)
  c.close()
  time.sleep(0.2)
  n, _ = tresume(target, c.info["session"], k["secret"], sent + 1, received)
  t, f, _ = n.frame()
  assert (t, f["processed"]) == (P.RRESUME, sent), (t, f)
  n.write(1, 0, b"\7" * 8 + b"\6" * 8)                                       # sent again whole (its half may have landed already)
  assert n.read(1, 0, 16) == b"\7" * 8 + b"\6" * 8

@section("Resuming a session", "Error codes")
def test_replies_older_than_the_log_cannot_be_sent_again_and_the_session_ends(target):
  t = target.with_options("--resume-log", "64K")
  c, k, sent, received = start(t)
  assert k["log"] == 65536
  for i in range(3): c.req(P.TPING, bytes(30000), count=30000)               # 90 KB of replies the client then says it lost
  tag = c.req(P.TPING, count=0)
  while c.frame()[1]["tag"] != tag: pass                                      # all processed
  c.close()
  n, _ = tresume(t, c.info["session"], k["secret"], sent + 4, received)
  fatal(n, P.ERESUME, 77)
  again, _ = tresume(t, c.info["session"], k["secret"], sent + 4, received)
  fatal(again, P.ERESUME, 77)                                                 # the session has ended

def retry_while_full(fn, what:str):
  """fn() once the runner has a session place for it: a connection accepted while the sessions are full gets Rerror ELIMIT instead
  of Rhello (the hello's assertion fails), and the runner frees a place only once it has seen a close."""
  deadline = time.monotonic() + 5
  while True:
    try: return fn()
    except AssertionError:
      assert time.monotonic() < deadline, what
      time.sleep(0.05)

def refused_full(t):
  """A connection accepted while the runner's sessions are full: Rerror ELIMIT with tag 0, then closed."""
  fatal(Raw(t.addr, hello=False), P.ELIMIT, 0)

@section("Resuming a session")
def test_a_waiting_session_gives_up_its_session_place_and_takes_it_back(target):
  t = target.with_options("--max-sessions", "1")
  c, k, sent, received = retry_while_full(lambda: start(t), "an earlier case's session never gave its place back")
  refused_full(t)
  c.close()
  o = retry_while_full(t.connect, "the session waiting for its client kept its session place")
  refused_full(t)                                                             # its client comes back while another holds the place
  o.close()
  n, _ = retry_while_full(lambda: tresume(t, c.info["session"], k["secret"], sent, received), "the place never came back")
  assert n.frame()[0] == P.RRESUME
  assert n.read(1, 0, 16) == b"\5" * 16
  refused_full(t)                                                             # the resumed session took its place back
  key(n, P.RESUME_OFF)
  n.close()

@section("Resuming a session")
def test_an_idle_timeout_counts_as_a_dropped_link_for_a_resumable_session(target):
  t = target.with_options("--idle-timeout", "1")
  c, k, sent, received = start(t)
  assert closed(c, 5), "the idle resumable session's connection stayed open"
  n, _ = tresume(t, c.info["session"], k["secret"], sent, received)
  t_, f, p = n.frame()
  assert (t_, f.get("processed")) == (P.RRESUME, sent), (t_, f, p)
  assert n.read(1, 0, 16) == b"\5" * 16

@section("Resuming a session", "Handles")
def test_a_waiting_session_keeps_its_memory_until_the_grace_period_passes(target):
  t = target.with_options("--resume-grace", "1", "--total-mem", "1M")
  resumable(t)
  c = t.connect()
  assert key(c)["grace"] == 1
  c.alloc(1, 800 << 10)
  assert c.until_pong() == []
  c.close()
  o = t.connect()
  tag = o.alloc(1, 800 << 10)                                                 # the buffers stay reserved while it waits
  assert [e[:2] for e in o.until_pong()] == [(P.ELIMIT, tag)]
  deadline = time.monotonic() + 6
  while True:                                                                 # then the grace period ends it and frees them
    o.alloc(1, 800 << 10)
    if not o.until_pong(): break
    assert time.monotonic() < deadline, "the memory of a session whose grace period passed never came back"
    time.sleep(0.1)

@section("Resuming a session", "Handles")
def test_tresumekey_off_then_the_session_ends_with_its_connection(target):
  t = target.with_options("--total-mem", "1M")                              # and the default grace period, 60 s
  resumable(t)
  c = t.connect()
  key(c)
  c.alloc(1, 800 << 10)
  assert c.until_pong() == []
  key(c, P.RESUME_OFF)
  c.close()
  o = t.connect()
  deadline = time.monotonic() + 5
  while True:                                                                 # freed at once, not after the grace period
    o.alloc(1, 800 << 10)
    if not o.until_pong(): break
    assert time.monotonic() < deadline, "a session that withdrew its key kept its memory after its connection closed"
    time.sleep(0.05)
  n, _ = tresume(t, c.info["session"], os.urandom(32), 1, 56)
  fatal(n, P.ERESUME, 77)                                                     # it has ended

# *** Tack, and the data of Rreads kept by reference (CAP_ACK)

def acking(target):
  resumable(target)
  if not target.info["caps"] & P.CAP_ACK: pytest.skip("the runner does not offer CAP_ACK")

def pattern(n:int, seed:int) -> bytes: return bytes((i * 7 + seed) & 0xff for i in range(n))

def read_then(c, n:int, *then) -> tuple[int, int, int]:
  """Buffer 2 of n bytes holding pattern(n, 1); a Tread of it whose reply the client reads, then the requests then builds, then a
  round trip (all processed). Returns (requests sent, reply bytes of the Rread, reply bytes after it)."""
  c.alloc(2, n)
  c.write(2, 0, pattern(n, 1))
  assert c.read(2, 0, n) == pattern(n, 1)
  for f in then: f(c)
  c.ping()
  return 3 + len(then) + 1, 16 + n, 16

def tack(c, received:int) -> int: return c.req(P.TACK, received=received)

@section("Resuming a session", "Thello, Rhello")
def test_cap_ack_comes_only_with_cap_resume(target):
  if target.info["caps"] & P.CAP_ACK: assert target.info["caps"] & P.CAP_RESUME
  off = target.with_options("--resume-grace", "0").connect()
  assert not off.info["caps"] & (P.CAP_RESUME | P.CAP_ACK)

@section("Resuming a session")
def test_no_cap_ack_no_tack(target):
  t = target.with_options("--resume-grace", "0")
  c = t.connect()
  tag = tack(c, 0)
  fatal(c, P.EPROTO, tag)

@section("Resuming a session")
def test_rread_data_is_kept_by_reference_past_the_log(target):
  """A missed Rread of 200,000 bytes goes again whole although --resume-log is 64 KiB: its data is kept by reference."""
  t = target.with_options("--resume-log", "64K")
  acking(t)
  c, k, sent, received = start(t)
  nreq, _, _ = read_then(c, 200_000)
  c.close()
  n, _ = tresume(t, c.info["session"], k["secret"], sent + nreq, received)   # the client says it lost the Rread and the Rping
  assert n.frame()[1]["processed"] == sent + nreq
  rt, f, p = n.frame()
  assert (rt, f["count"], p == pattern(200_000, 1)) == (P.RREAD, 200_000, True), (rt, f)
  assert n.frame()[0] == P.RPING
  ok(n)

@section("Resuming a session")
def test_rread_data_is_copied_before_a_request_changes_its_buffer(target):
  """The Rread went out by reference; a Twrite then changed the buffer before any Tack: what goes again is what was read."""
  t = target.with_options("--resume-log", "64K")
  acking(t)
  c, k, sent, received = start(t)
  nreq, _, _ = read_then(c, 8192, lambda c: c.write(2, 0, pattern(8192, 2)))
  c.close()
  n, _ = tresume(t, c.info["session"], k["secret"], sent + nreq, received)
  assert n.frame()[1]["processed"] == sent + nreq
  rt, f, p = n.frame()
  assert (rt, p == pattern(8192, 1)) == (P.RREAD, True), (rt, f)
  assert n.frame()[0] == P.RPING
  assert n.read(2, 0, 8192) == pattern(8192, 2)

@section("Resuming a session", "Error codes")
@pytest.mark.parametrize("change", ["Twrite", "Tfree"])
def test_rread_data_that_would_pass_the_log_is_let_go_when_its_buffer_changes(target, change):
  t = target.with_options("--resume-log", "64K")
  acking(t)
  c, k, sent, received = start(t)
  nreq, _, _ = read_then(c, 100_000, (lambda c: c.write(2, 0, pattern(100_000, 2))) if change == "Twrite" else (lambda c: c.req(P.TFREE, handle=2)))
  c.close()
  n, _ = tresume(t, c.info["session"], k["secret"], sent + nreq, received)
  assert "no longer held" in fatal(n, P.ERESUME, 77)
  again, _ = tresume(t, c.info["session"], k["secret"], sent + nreq, received)
  fatal(again, P.ERESUME, 77)                                                 # the session has ended

@section("Resuming a session", "Error codes")
def test_after_a_tack_the_data_is_let_go_and_a_resume_from_before_it_ends_the_session(target):
  acking(target)
  c, k, sent, received = start(target)
  nreq, rread, after = read_then(c, 8192, lambda c: tack(c, received + 16 + 8192), lambda c: c.write(2, 0, pattern(8192, 2)))
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], sent + nreq, received)   # before the Rread it acknowledged
  assert "acknowledged" in fatal(n, P.ERESUME, 77)
  again, _ = tresume(target, c.info["session"], k["secret"], sent + nreq, received + rread)
  fatal(again, P.ERESUME, 77)                                                 # the session has ended

@section("Resuming a session")
def test_a_resume_from_the_tack_goes_on(target):
  acking(target)
  c, k, sent, received = start(target)
  nreq, rread, after = read_then(c, 8192, lambda c: tack(c, received + 16 + 8192), lambda c: c.write(2, 0, pattern(8192, 2)))
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], sent + nreq, received + rread)
  assert n.frame()[1]["processed"] == sent + nreq
  assert n.frame()[0] == P.RPING                                              # the reply after the Rread
  assert n.read(2, 0, 8192) == pattern(8192, 2)

@section("Resuming a session", "Error codes")
def test_tack_beyond_what_was_sent_is_einval_and_one_not_above_the_last_changes_nothing(target, c):
  acking(target)
  key(c)
  c.ping()                                                                    # the stream so far: 56 + 16 bytes
  tag = tack(c, 56 + 16 + 1)
  one_error(c, P.EINVAL, tag)
  tack(c, 56)
  tack(c, 56)
  tack(c, 0)
  ok(c)

@section("Resuming a session")
def test_tack_without_a_resume_key_changes_nothing(target, c):
  acking(target)
  tack(c, 1 << 60)
  ok(c)

@section("Resuming a session", "Error codes")
def test_a_received_count_inside_a_frame_ends_the_session(target):
  c, k, sent, received = start(target)
  c.ping(b"12345678")                                                         # a 24-byte Rping
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], sent + 1, received + 5)
  assert "inside the frame" in fatal(n, P.ERESUME, 77)
  again, _ = tresume(target, c.info["session"], k["secret"], sent + 1, received + 24)
  fatal(again, P.ERESUME, 77)                                                 # the session has ended

@section("Resuming a session", "Thello, Rhello")
def test_a_resumed_session_holds_to_the_new_connections_smaller_maxmsg(target):
  c, k, sent, received = start(target)                                        # maxmsg 64 MiB
  c.alloc(2, 100_000)
  c.ping()
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], sent + 2, received + 16, maxmsg=65536)
  assert n.frame()[0] == P.RRESUME
  tag = n.req(P.TREAD, handle=2, offset=0, count=65536 - 16 + 1)              # one byte more than an Rread of 64 KiB carries
  code, etag, _ = n.error()
  assert (code, etag) == (P.ELIMIT, tag)
  tag = n.req(P.TWRITE, bytes(65536 - 32 + 1), handle=2, offset=0, count=65536 - 32 + 1)
  fatal(n, P.EPROTO, tag)                                                     # a frame above the new maxmsg

@section("Resuming a session", "Thello, Rhello")
def test_a_resumed_session_takes_the_new_connections_larger_maxmsg(target):
  resumable(target)
  c = target.connect(maxmsg=65536)
  k = key(c)
  c.alloc(2, 100_000)
  c.ping()
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], 3, 56 + 16)
  assert n.frame()[0] == P.RRESUME
  n.write(2, 0, pattern(100_000, 3))                                          # a 100,032-byte frame: within the new maxmsg
  assert n.read(2, 0, 100_000) == pattern(100_000, 3)

@section("Resuming a session", "Error codes")
def test_a_missed_reply_larger_than_the_new_maxmsg_ends_the_session(target):
  c, k, sent, received = start(target)
  nreq, _, _ = read_then(c, 100_000)
  c.close()
  n, _ = tresume(target, c.info["session"], k["secret"], sent + nreq, received, maxmsg=65536)
  assert "maxmsg" in fatal(n, P.ERESUME, 77)
  again, _ = tresume(target, c.info["session"], k["secret"], sent + nreq, received)
  fatal(again, P.ERESUME, 77)                                                 # the session has ended

def resume_frame(secret:bytes, snonce:bytes, session:int, sent:int, received:int, tag:int=77) -> bytes:
  """A Tresume for a connection whose Rhello carried snonce."""
  cn = os.urandom(32)
  mac = hmac.new(secret, CLIENT + snonce + cn + struct.pack("<IQQ", session, sent, received), hashlib.sha256).digest()
  return P.pack(P.TRESUME, tag, session=session, sent=sent, received=received, cnonce=cn, mac=mac)

@section("Resuming a session", "Authentication")
@pytest.mark.parametrize("auth", [False, True], ids=["thello", "tauth"])
def test_a_resume_on_a_full_runner_is_refused_at_its_handshake(target, auth):
  """A connection in its handshake holds no session place; one whose handshake found the runner full gets ELIMIT with the tag of
  its Thello (or Tauth), never its Tresume's; once its handshake is done it holds a session place until its Tresume."""
  if target.external: pytest.skip("needs a runner of its own started with --max-sessions 1")
  with target.fresh("--max-sessions", "1", *(("--token-file", target.pool.token_file()) if auth else ())) as t:
    late = Raw(t.addr, hello=auth)                   # accepted while the runner is empty; its handshake is not done
    c, k, sent, received = retry_while_full(lambda: start(t), "a session place never came back")   # takes the only one all the same
    c.close()
    o = retry_while_full(t.connect, "the session waiting for its client kept its session place")
    if auth:
      tag = 5
      late.send(P.pack(P.TAUTH, tag, cnonce=(cn:=os.urandom(32)), mac=client_mac(t.token, late.info["nonce"], cn)) +
                resume_frame(k["secret"], late.info["nonce"], c.info["session"], sent, received))
    else: tag = late.req(P.THELLO, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG)
    fatal(late, P.ELIMIT, tag)
    o.close()
    n = retry_while_full(t.connect, "the place of a closed session never came back")   # handshake done: n holds the place
    refused_full(t)
    n.send(resume_frame(k["secret"], n.info["nonce"], c.info["session"], sent, received))
    ty, f, p = n.frame()
    assert (ty, f["tag"], f.get("processed")) == (P.RRESUME, 77, sent), (ty, f, p)   # the refusal left the session as it was
    assert n.read(1, 0, 16) == b"\5" * 16
    refused_full(t)
    key(n, P.RESUME_OFF)

@section("Resuming a session", "Error codes")
def test_a_tresume_naming_its_own_connections_session_is_eresume(target):
  resumable(target)
  n = target.connect()
  n.send(resume_frame(os.urandom(32), n.info["nonce"], n.info["session"], 0, 0))
  fatal(n, P.ERESUME, 77)

@section("Resuming a session", "Authentication")
def test_a_wrong_resume_proof_is_answered_without_the_authentication_penalty(target):
  t = target.authenticating()
  c, k, sent, received = start(t)
  t0 = time.monotonic()
  for _ in range(3):                                                          # with the penalty: 3 s at least
    n, _ = tresume(t, c.info["session"], os.urandom(32), sent, received)
    fatal(n, P.EAUTH, 77)
  assert time.monotonic() - t0 < 1.5, f"3 wrong resume proofs took {time.monotonic() - t0:.1f} s"
  ok(c)

@section("Robustness rules", "Resuming a session")
@pytest.mark.parametrize("idle", [None, 3], ids=["no-idle-timeout", "idle-timeout-3"])
def test_the_frame_timeout_does_not_apply_between_the_frames_of_a_resumable_session(target, idle):
  t = target.with_options("--frame-timeout", "1", *(("--idle-timeout", str(idle)) if idle else ()))
  c, k, sent, received = start(t)
  time.sleep(2)
  assert c.ping(b"quiet") == b"quiet", "a quiet connection was closed by the frame timeout"
  if idle:
    t0 = time.monotonic()
    assert closed(c, 8), "the idle resumable session's connection stayed open"
    assert 2.5 <= time.monotonic() - t0 <= 5, f"closed after {time.monotonic() - t0:.1f} s of quiet with --idle-timeout {idle}"
  else:
    c.send(P.pack(P.TPING, 9, payload_len=8, count=8) + b"half")          # half a frame, then a stall
    t0 = time.monotonic()
    assert closed(c, 5) and time.monotonic() - t0 < 4, "a resumable session stalled mid-frame kept its connection"
  n, _ = tresume(t, c.info["session"], k["secret"], sent + 1, received + 21)   # a dropped link either way: resumed
  ty, f, p = n.frame()
  assert (ty, f.get("processed")) == (P.RRESUME, sent + 1), (ty, f, p)
  key(n, P.RESUME_OFF)

@section("Resuming a session", "Limits")
@pytest.mark.parametrize("missed", [8, 9])
def test_the_data_of_the_last_8_large_rreads_is_kept_by_reference(target, missed):
  """Nine Rreads of 8 KiB, none acknowledged: a resume that missed the last eight gets them again; one that missed all nine fails,
  the first one's data having been let go for the ninth (PROTO_RESUME_REFS)."""
  t = target.with_options("--resume-log", "64K")
  acking(t)
  c, k, sent, received = start(t)
  c.alloc(2, 8192)
  c.write(2, 0, pattern(8192, 1))
  for _ in range(9): assert c.read(2, 0, 8192) == pattern(8192, 1)
  c.ping()
  c.close()
  n, _ = tresume(t, c.info["session"], k["secret"], sent + 12, received + (9 - missed) * (16 + 8192))
  if missed == 9:
    assert "no longer held" in fatal(n, P.ERESUME, 77)
    return
  assert n.frame()[1]["processed"] == sent + 12
  for _ in range(8):
    rt, f, p = n.frame()
    assert (rt, p == pattern(8192, 1)) == (P.RREAD, True), (rt, f)
  assert n.frame()[0] == P.RPING
