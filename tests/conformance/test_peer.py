"""Tgrant, Tpeersend, Tpeer: copies between runners. The cases use two sessions of the runner under test (a source and a destination
session may be on the same runner), and this suite itself as a peer, speaking Tpeer."""
import os, socket, struct
import pytest
from conformance.spec import P, section

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
  tag = c.req(P.TPEER, magic=P.MAGIC, grant=1, count=1)
  assert "first frame of a peer connection" in expect_error(c, tag, P.ESTATE)
  assert c.closed()
