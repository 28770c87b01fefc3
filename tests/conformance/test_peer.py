"""Tgrant, Tpeersend, Tpeer: copies between runners. The cases use two sessions of the runner under test (a source and a destination
session may be on the same runner), and this suite itself as a peer, speaking Tpeer."""
import os, socket, struct, threading, time
import pytest
from conformance.spec import P, section, ok

def grant(c, h:int, offset:int, count:int, ttl:int=60) -> tuple[int, bytes]:
  tag = c.req(P.TGRANT, handle=h, offset=offset, count=count, ttl=ttl)
  t, f, p = c.frame()
  assert (t, f["tag"], f["size"], p) == (P.RGRANT, tag, 56, b""), (t, f, p[:200])
  return f["grant"], f["secret"]

def peersend(c, h:int, offset:int, count:int, addr:str, g:int, secret:bytes) -> tuple:
  host, port = addr.rsplit(":", 1)
  tag = c.req(P.TPEERSEND, host.encode(), handle=h, offset=offset, count=count, grant=g, secret=secret, port=int(port), hostlen=len(host))
  t, f, p = c.frame()
  return tag, t, f, p

def expect_error(c, tag:int, code:int):
  t, f, p = c.frame()
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, code), (t, f, p[:300])
  return p.decode()

def peer(addr:str, g:int, secret:bytes, count:int, mac:bytes|None=None):
  """A peer connection from this suite: sends Tpeer, returns (socket, cnonce, the first reply frame)."""
  host, port = addr.rsplit(":", 1)
  s = socket.create_connection((host, int(port)), timeout=10)
  cn = os.urandom(32)
  s.sendall(P.pack(P.TPEER, 5, magic=P.MAGIC, grant=g, count=count, cnonce=cn,
                   mac=P.peer_mac(secret, P.PEER_SRC, g, count, cn) if mac is None else mac))
  return s, cn, frame(s)

def frame(s):
  def exact(n):
    b = b""
    while len(b) < n:
      if not (c := s.recv(n - len(b))): raise EOFError(f"closed after {len(b)} of {n} bytes")
      b += c
    return b
  h = exact(12)
  b = h + exact(struct.unpack_from("<I", h)[0] - 12)
  t, f = P.unpack(b)
  return t, f, b[P.MSGS[t].size:]

@section("Tgrant, Rgrant", "Thello, Rhello")
def test_grant_names_the_session_and_carries_a_fresh_secret(target, c):
  assert c.info["caps"] & P.CAP_PEER
  c.alloc(1, 64)
  (g1, s1), (g2, s2) = grant(c, 1, 0, 64), grant(c, 1, 8, 8)
  assert g1 >> 32 == g2 >> 32 == c.info["session"] and g1 & 0xffffffff and g1 != g2
  assert len(s1) == 32 and s1 != s2 and s1 != bytes(32)

@section("Tgrant, Rgrant")
def test_grant_errors_are_its_reply(c):
  c.alloc(1, 64)
  for fields, code in [(dict(handle=2, count=1), P.EHANDLE), (dict(handle=1, offset=60, count=5), P.ERANGE),
                       (dict(handle=1, offset=1 << 63, count=1 << 63), P.ERANGE), (dict(handle=1, count=0), P.EINVAL),
                       (dict(handle=1, count=1, ttl=0), P.EINVAL), (dict(handle=1, count=1, ttl=P.MAX_GRANT_TTL + 1), P.EINVAL)]:
    tag = c.req(P.TGRANT, **{"ttl": 60, **fields})
    expect_error(c, tag, code)
  c.ping()   # the session carries on

@section("Tpeersend, Rpeersend", "Copies between runners")
def test_copy_between_two_sessions_arrives_before_the_reply(target, c):
  d = target.connect()
  data = os.urandom(3000)
  c.alloc(1, 4096); c.alloc(9, 4096); c.write(9, 100, data)
  d.alloc(2, 4096); d.write(2, 0, b"\x55" * 4096)
  g, sec = grant(d, 2, 50, 3000)
  c.req(P.TCOPY, dst=1, src=9, count=4096)   # earlier work of the source session: the copy observes it
  _, t, f, _ = peersend(c, 1, 100, 3000, target.addr, g, sec)
  assert t == P.RPEERSEND and f["ns"] > 0, (t, f)
  assert d.read(2, 0, 4096) == b"\x55" * 50 + data + b"\x55" * 1046
  tag, t, f, p = peersend(c, 1, 100, 3000, target.addr, g, sec)   # used: a replay fails
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.EGRANT), (t, f, p)
  d.close()

@section("Tpeersend, Rpeersend")
def test_peersend_errors_are_its_reply(target, c):
  c.alloc(1, 64)
  s = socket.socket()
  s.bind(("127.0.0.1", 0))   # bound, not listening: refused
  for fields, host, code in [(dict(handle=1, count=64, port=1), b"", P.EINVAL), (dict(handle=1, count=64, port=1), b"a\0b", P.EINVAL),
                             (dict(handle=1, count=64, port=0), b"127.0.0.1", P.EINVAL), (dict(handle=1, count=0, port=1), b"127.0.0.1", P.EINVAL),
                             (dict(handle=2, count=64, port=1), b"127.0.0.1", P.EHANDLE),
                             (dict(handle=1, offset=1, count=64, port=1), b"127.0.0.1", P.ERANGE),
                             (dict(handle=1, count=64, port=s.getsockname()[1]), b"127.0.0.1", P.EPEER)]:
    tag = c.req(P.TPEERSEND, host, hostlen=len(host), grant=1, secret=bytes(32), **fields)
    expect_error(c, tag, code)
  s.close()
  c.ping()

@section("Tpeer, Rpeer")
def test_peer_exchange_proves_the_grant_both_ways(target, c):
  c.alloc(1, 256)
  g, sec = grant(c, 1, 16, 200)
  s, cn, (t, f, p) = peer(target.addr, g, sec, 200, mac=os.urandom(32))   # a wrong proof: refused, and the grant is not used up
  assert (t, f["tag"], f.get("code")) == (P.RERROR, 5, P.EGRANT), (t, f, p)
  s, cn, (t, f, p) = peer(target.addr, g, sec, 201)                       # more than granted: refused, and the grant is used up
  assert (t, f.get("code")) == (P.RERROR, P.ERANGE), (t, f, p)
  s, cn, (t, f, p) = peer(target.addr, g, sec, 200)
  assert (t, f.get("code")) == (P.RERROR, P.EGRANT), (t, f, p)
  g, sec = grant(c, 1, 16, 200)
  s, cn, (t, f, p) = peer(target.addr, g, sec, 100)                       # less than granted is allowed
  assert (t, f["tag"], f["count"], f["mac"]) == (P.RPEER, 5, 0, P.peer_mac(sec, P.PEER_DST, g, 100, cn)), (t, f)
  s.sendall(b"\x77" * 100 + b"\x88" * 100)                                # bytes past count are never read into the buffer
  t, f, _ = frame(s)
  assert (t, f["count"], f["mac"]) == (P.RPEER, 100, P.peer_mac(sec, P.PEER_DONE, g, 100, cn)), (t, f)
  assert c.read(1, 0, 256) == bytes(16) + b"\x77" * 100 + bytes(140)

@section("Tpeer, Rpeer")
def test_tpeer_for_no_session_and_tpeer_in_a_session(target, c):
  s, _, (t, f, p) = peer(target.addr, 0xfffffffe << 32 | 1, bytes(32), 1)
  assert (t, f.get("code")) == (P.RERROR, P.EGRANT) and b"no session of this runner holds that grant" in p, (t, f, p)
  assert closed_socket(s)
  tag = c.req(P.TPEER, magic=P.MAGIC, grant=1, count=1)
  assert "first frame of a peer connection" in expect_error(c, tag, P.ESTATE)
  assert c.closed()

@section("Tgrant, Rgrant", "Copies between runners")
def test_at_most_64_live_grants_and_an_expired_one_is_refused_and_forgotten(c):
  c.alloc(1, 64)
  grants = [grant(c, 1, 0, 8, ttl=1) for _ in range(P.MAX_GRANTS)]
  tag = c.req(P.TGRANT, handle=1, offset=0, count=8, ttl=60)
  expect_error(c, tag, P.ELIMIT)
  time.sleep(1.3)                                                           # every grant's ttl passed
  g, _ = grant(c, 1, 0, 8)                                                  # forgotten: they no longer count
  s, _, (t, f, p) = peer(c_addr(c), *grants[0], 8)
  assert (t, f.get("code")) == (P.RERROR, P.EGRANT), (t, f, p)              # expired: refused
  assert closed_socket(s)

def c_addr(c) -> str: return "%s:%d" % c.s.getpeername()[:2]

def closed_socket(s, timeout:float=5) -> bool:
  s.settimeout(timeout)
  try: return s.recv(1) == b""
  except ConnectionResetError: return True
  except TimeoutError: return False

@section("Tgrant, Rgrant", "Tpeersend, Rpeersend")
def test_a_grant_dies_with_its_session(target, c):
  d = target.connect()
  d.alloc(2, 64)
  g, sec = grant(d, 2, 0, 64)
  d.close()
  time.sleep(0.3)
  c.alloc(1, 64)
  tag, t, f, p = peersend(c, 1, 0, 64, target.addr, g, sec)
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.EGRANT), (t, f, p)
  assert p.decode().startswith("destination runner: "), p

@section("Tpeersend, Rpeersend", "Tpeer, Rpeer")
def test_the_destinations_refusal_is_the_reply_prefixed_and_leaves_the_range_unchanged(target, c):
  d = target.connect()
  d.alloc(2, 64); d.write(2, 0, b"\x55" * 64); d.alloc(3, 64)
  c.alloc(1, 64); c.write(1, 0, b"\x11" * 64)
  g, sec = grant(d, 2, 0, 16)
  tag, t, f, p = peersend(c, 1, 0, 17, target.addr, g, sec)                # more bytes than granted
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.ERANGE) and p.startswith(b"destination runner: "), (t, f, p)
  tag, t, f, p = peersend(c, 1, 0, 16, target.addr, g, sec)                # the right proof used the grant up
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.EGRANT) and p.startswith(b"destination runner: "), (t, f, p)
  g, sec = grant(d, 3, 0, 16)
  d.req(P.TFREE, handle=3)
  tag, t, f, p = peersend(c, 1, 0, 16, target.addr, g, sec)                # the granted buffer was freed
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.EHANDLE) and p.startswith(b"destination runner: "), (t, f, p)
  assert d.read(2, 0, 64) == b"\x55" * 64
  ok(c)

@section("Tpeersend, Rpeersend", "Robustness rules")
def test_peersend_host_over_255_bytes_and_wrapping_ranges(c):
  c.alloc(1, 64)
  host = b"h" * 256
  tag = c.req(P.TPEERSEND, host, hostlen=len(host), handle=1, count=64, port=1, grant=1, secret=bytes(32))
  expect_error(c, tag, P.EINVAL)
  tag = c.req(P.TPEERSEND, b"127.0.0.1", hostlen=9, handle=1, offset=1 << 63, count=1 << 63, port=1, grant=1, secret=bytes(32))
  expect_error(c, tag, P.ERANGE)
  ok(c)

@section("Tpeersend, Rpeersend", "Copies between runners")
def test_a_destination_that_does_not_prove_the_grant_gets_one_tpeer_and_no_data(c):
  lst = socket.create_server(("127.0.0.1", 0))
  got = {}
  def impostor():
    s, _ = lst.accept()
    s.settimeout(5)
    t, f, _ = frame(s)
    got["tpeer"] = (t, f)
    s.sendall(P.pack(P.RPEER, f["tag"], count=0, mac=os.urandom(32)))    # an Rpeer that does not know the secret
    b = b""
    try:
      while (x := s.recv(4096)): b += x
    except (TimeoutError, ConnectionResetError): pass
    got["after"] = b
    s.close()
  th = threading.Thread(target=impostor, daemon=True)
  th.start()
  c.alloc(1, 4096); c.write(1, 0, b"\x42" * 4096)
  tag, t, f, p = peersend(c, 1, 0, 4096, "127.0.0.1:%d" % lst.getsockname()[1], 7 << 32 | 1, os.urandom(32))
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.EPEER), (t, f, p)
  th.join(10)
  lst.close()
  assert got["tpeer"][0] == P.TPEER and got["tpeer"][1]["count"] == 4096, got
  assert got["after"] == b"", f"the source sent {len(got['after'])} bytes to a destination that did not prove the grant"
  ok(c)

@section("Tpeersend, Rpeersend", "Copies between runners")
def test_a_destination_at_its_session_limit_makes_it_epeer(target, c):
  full = target.with_options("--max-sessions", "1")
  d = full.connect()
  d.alloc(2, 64); d.write(2, 0, b"\x55" * 64)
  g, sec = grant(d, 2, 0, 64)
  c.alloc(1, 64)
  tag, t, f, p = peersend(c, 1, 0, 64, full.addr, g, sec)
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.EPEER), (t, f, p)
  assert d.read(2, 0, 64) == b"\x55" * 64
  d.close()

@section("Tpeer, Rpeer")
def test_a_bad_magic_after_a_right_proof_is_eversion_and_uses_the_grant(target, c):
  c.alloc(1, 64)
  g, sec = grant(c, 1, 0, 64)
  host, port = target.addr.rsplit(":", 1)
  s = socket.create_connection((host, int(port)), timeout=10)
  cn = os.urandom(32)
  s.sendall(P.pack(P.TPEER, 5, magic=P.MAGIC ^ 1, grant=g, count=64, cnonce=cn, mac=P.peer_mac(sec, P.PEER_SRC, g, 64, cn)))
  t, f, p = frame(s)
  assert (t, f["tag"], f.get("code")) == (P.RERROR, 5, P.EVERSION), (t, f, p)
  assert closed_socket(s)
  s, _, (t, f, p) = peer(target.addr, g, sec, 64)
  assert (t, f.get("code")) == (P.RERROR, P.EGRANT), (t, f, p)
  assert closed_socket(s)

@section("Tpeer, Rpeer")
def test_tpeer_for_a_freed_or_shrunk_buffer_is_ehandle(target, c):
  c.alloc(1, 64)
  g, sec = grant(c, 1, 32, 32)
  c.req(P.TFREE, handle=1); c.alloc(1, 16)                                 # the handle reused, too small for the range
  s, _, (t, f, p) = peer(target.addr, g, sec, 32)
  assert (t, f.get("code")) == (P.RERROR, P.EHANDLE), (t, f, p)
  assert closed_socket(s)
  ok(c)

@section("Tpeer, Rpeer")
def test_a_transfer_that_breaks_off_leaves_what_arrived_and_the_session_serving(target, c):
  c.alloc(1, 64); c.write(1, 0, bytes(64))
  g, sec = grant(c, 1, 0, 64)
  s, _, (t, f, p) = peer(target.addr, g, sec, 64)
  assert t == P.RPEER, (t, f, p)
  s.sendall(b"\x66" * 20)
  time.sleep(0.2)
  s.close()
  time.sleep(0.2)
  assert c.read(1, 0, 64) == b"\x66" * 20 + bytes(44)
  s, _, (t, f, p) = peer(target.addr, g, sec, 64)                           # used for good
  assert (t, f.get("code")) == (P.RERROR, P.EGRANT), (t, f, p)

@section("Tpeer, Rpeer", "Copies between runners")
def test_a_peer_needs_the_grant_not_the_token(target):
  t = target.authenticating()
  c = t.connect()
  c.alloc(1, 16); c.write(1, 0, bytes(16))
  g, sec = grant(c, 1, 0, 16)
  s, cn, (ty, f, p) = peer(t.addr, g, sec, 16)                             # no Thello, no Tauth
  assert (ty, f["mac"]) == (P.RPEER, P.peer_mac(sec, P.PEER_DST, g, 16, cn)), (ty, f, p)
  s.sendall(b"tokenless peer!!")
  ty, f, _ = frame(s)
  assert (ty, f["count"]) == (P.RPEER, 16), (ty, f)
  assert closed_socket(s)
  assert c.read(1, 0, 16) == b"tokenless peer!!"

@section("Copies between runners")
def test_a_session_sending_to_itself_gets_epeer_after_the_frame_timeout(target):
  t = target.with_options("--frame-timeout", "2")
  c = t.connect()
  c.alloc(1, 64); c.alloc(2, 64)
  g, sec = grant(c, 2, 0, 64)
  t0 = time.monotonic()
  tag, ty, f, p = peersend(c, 1, 0, 64, t.addr, g, sec)
  assert (ty, f["tag"], f.get("code")) == (P.RERROR, tag, P.EPEER), (ty, f, p)
  assert time.monotonic() - t0 < 8
  ok(c)

@section("Tpeersend, Rpeersend")
def test_a_destination_name_that_does_not_resolve_is_epeer(c):
  c.alloc(1, 64)
  tag, t, f, p = peersend(c, 1, 0, 64, "no-such-host.invalid:7", 1 << 32 | 1, bytes(32))   # .invalid never resolves (RFC 2606)
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.EPEER), (t, f, p)
  ok(c)

@section("Tgrant, Rgrant")
def test_tgrant_is_answered_after_the_earlier_requests(c):
  c.alloc(1, 64)
  bad = c.req(P.TFREE, handle=2)
  tag = c.req(P.TGRANT, handle=1, offset=0, count=8, ttl=60)
  expect_error(c, bad, P.EHANDLE)                                          # the earlier failure comes first
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RGRANT, tag), (t, f)

@section("Tpeer, Rpeer")
def test_a_tpeer_is_read_under_the_handshake_deadline(target):
  t = target.with_options("--handshake-timeout", "1")
  host, port = t.addr.rsplit(":", 1)
  s = socket.create_connection((host, int(port)), timeout=10)
  s.sendall(P.pack(P.TPEER, 5, magic=P.MAGIC, grant=1, count=1)[:40])      # half a Tpeer, then nothing
  t0 = time.monotonic()
  assert closed_socket(s, 8), "a peer connection that never finished its Tpeer stayed open"
  assert time.monotonic() - t0 < 6

@section("Tpeer, Rpeer")
def test_a_tpeer_of_count_0_runs_the_exchange_and_uses_the_grant_up(target, c):
  c.alloc(1, 16); c.write(1, 0, b"\x33" * 16)
  g, sec = grant(c, 1, 0, 16)
  s, cn, (t, f, p) = peer(target.addr, g, sec, 0)
  assert (t, f["count"], f["mac"]) == (P.RPEER, 0, P.peer_mac(sec, P.PEER_DST, g, 0, cn)), (t, f, p)
  t, f, _ = frame(s)                                                        # no bytes to send: the second Rpeer follows at once
  assert (t, f["count"], f["mac"]) == (P.RPEER, 0, P.peer_mac(sec, P.PEER_DONE, g, 0, cn)), (t, f)
  assert closed_socket(s)
  s, _, (t, f, p) = peer(target.addr, g, sec, 16)                           # used up
  assert (t, f.get("code")) == (P.RERROR, P.EGRANT), (t, f, p)
  assert c.read(1, 0, 16) == b"\x33" * 16

@section("Tpeer, Rpeer")
@pytest.mark.parametrize("sent", [0, 20], ids=["before-any-byte", "mid-transfer"])
def test_a_stalled_peer_is_closed_without_an_rerror_and_the_range_holds_what_arrived(target, sent):
  t = target.with_options("--frame-timeout", "2")
  c = t.connect()
  c.alloc(1, 64); c.write(1, 0, bytes(64))
  g, sec = grant(c, 1, 0, 64)
  s, _, (ty, f, p) = peer(t.addr, g, sec, 64)
  assert ty == P.RPEER, (ty, f, p)
  s.sendall(b"\x66" * sent)
  s.settimeout(8)
  got, t0 = b"", time.monotonic()
  try:
    while (x := s.recv(4096)): got += x
  except ConnectionResetError: pass
  except TimeoutError: pytest.fail("a stalled peer connection stayed open")
  assert time.monotonic() - t0 < 7
  assert got == b"", f"a stalled peer got {got[:64]!r} before the close"
  assert c.read(1, 0, 64) == b"\x66" * sent + bytes(64 - sent)
  s, _, (ty, f, p) = peer(t.addr, g, sec, 64)                               # used up
  assert (ty, f.get("code")) == (P.RERROR, P.EGRANT), (ty, f, p)
