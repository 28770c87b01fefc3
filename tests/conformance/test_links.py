"""Links between runners: Tlisten, Tdial, Tunlink and the link programs (Tload kinds 4 and 5). The cases use two sessions of the
runner under test (a sending and a receiving session may be on the same runner), and this suite itself as either end of a link:
as the dialing peer (Dialer: a Tpeer of count 0 with the link labels, then the link messages the suite writes) and as the
receiving runner (Acceptor: a 127.0.0.1 socket a session dials, which answers the Tpeer and reads the link messages)."""
import os, socket, struct, threading, time
import pytest
from conformance.spec import P, section, ok, one_error, fatal, kernel
from wire import f32

cpu_only = pytest.mark.cpu_only
SEND, RECV = P.PROG_LINK_SEND, P.PROG_LINK_RECV
U64 = (1 << 64) - 1

# *** helpers: requests

def listen(c, link:int, ttl:int=60) -> tuple[int, bytes]:
  tag = c.req(P.TLISTEN, link=link, ttl=ttl)
  t, f, p = c.frame()
  assert (t, f["tag"], f["size"], f["pad"], p) == (P.RLISTEN, tag, 56, 0, b""), (P.TYPE_NAMES.get(t, t), f, p[:300])
  return f["grant"], f["secret"]

def dial_req(c, link:int, addr:str, g:int, sec:bytes, host:bytes|None=None, port:int|None=None) -> int:
  h, pt = addr.rsplit(":", 1)
  hb = h.encode() if host is None else host
  return c.req(P.TDIAL, hb, link=link, port=int(pt) if port is None else port, hostlen=len(hb), grant=g, secret=sec)

def dial(c, link:int, addr:str, g:int, sec:bytes) -> dict:
  tag = dial_req(c, link, addr, g, sec)
  t, f, p = c.frame()
  assert (t, f["tag"], f["size"]) == (P.RDIAL, tag, 24), (P.TYPE_NAMES.get(t, t), f, p[:300])
  return f

def refused(c, tag:int, code:int) -> str:
  """The reply of request tag is Rerror code; the connection stays open. Returns its text."""
  t, f, p = c.frame()
  assert (t, f["tag"], P.ERRORS.get(f.get("code"), f.get("code"))) == (P.RERROR, tag, P.ERRORS[code]), (P.TYPE_NAMES.get(t, t), f, p[:300])
  return p.decode()

def load_link(c, prog:int, kind:int, link:int, name:bytes=b"link", data:bytes=b"", **over) -> int:
  f = {"prog": prog, "kind": kind, "arch": P.ARCH_NONE, "nbufs": 1, "nvals": 2, "corearg": P.NO_CORE, "entry": link,
       "crc": P.crc32(data) if data else 0, "namelen": len(name), "datalen": len(data), **over}
  return c.req(P.TLOAD, name + data, **f)

def xfer(c, prog:int, buf:int, off:int, count:int, channel:int, wait:bool=True, g=(1, 1, 1), l=(1, 1, 1)) -> int:
  """A Tlaunch of link program prog: buffer buf at off, value[0] count, value[1] channel."""
  bufs, vals = [(buf, off)], [count, channel]
  return c.req(P.TLAUNCH, P.launch_args(bufs, vals), P.FWAIT if wait else 0, **P.launch_fields(prog, bufs, vals, g, l))

def launched(c, tag:int) -> dict:
  t, f, p = c.frame()
  assert (t, f["tag"]) == (P.RLAUNCH, tag), (P.TYPE_NAMES.get(t, t), f, p[:300])
  return f

def run(c, prog:int, buf:int, off:int, count:int, channel:int): return launched(c, xfer(c, prog, buf, off, count, channel))

def link_rec(prog:int, buf:int, off:int, count:int, channel:int) -> bytes: return P.launch_record(prog, [(buf, off)], [count, channel])

def add1_rec(prog:int, out:int, a:int, n:int) -> bytes: return P.launch_record(prog, [(out, 0), (a, 0)], [n])

def graph(c, g:int, *records:bytes) -> int: return c.req(P.TGRAPH, b"".join(records), graph=g, count=len(records))

def graphrun(c, g:int, patches:bytes=b"", wait:bool=True) -> int:
  return c.req(P.TGRAPHRUN, patches, P.FWAIT if wait else 0, graph=g, count=len(patches) // 24)

def graph_done(c, tag:int) -> dict:
  t, f, p = c.frame()
  assert (t, f["tag"]) == (P.RGRAPHRUN, tag), (P.TYPE_NAMES.get(t, t), f, p[:300])
  return f

def pair(target, snd, rcv, sl:int=1, rl:int=2, sprog:int|None=None, rprog:int|None=None):
  """A link from session snd (link sl) to session rcv (link rl), with link programs sprog/rprog loaded on it."""
  g, sec = listen(rcv, rl)
  dial(snd, sl, target.addr, g, sec)
  if sprog is not None: load_link(snd, sprog, SEND, sl)
  if rprog is not None: load_link(rcv, rprog, RECV, rl)

def recv_text(link:int) -> str: return f"link {link} (receives from the runner that dials it): "
def send_text(link:int, addr:str) -> str: return f"link {link} (sends to {addr}): "

# *** helpers: this suite as the other runner

def exact(s, n:int) -> bytes:
  b = bytearray()
  while len(b) < n:
    if not (x := s.recv(min(n - len(b), 1 << 20))): raise EOFError(f"closed after {len(b)} of {n} bytes")
    b += x
  return bytes(b)

def frame(s) -> tuple[int, dict, bytes]:
  h = exact(s, 12)
  b = h + exact(s, struct.unpack_from("<I", h)[0] - 12)
  t, f = P.unpack(b)
  return t, f, b[P.MSGS[t].size:]

def eof(s, timeout:float=5) -> bool:
  """The other end closed s within timeout, with nothing more sent."""
  s.settimeout(timeout)
  try: return s.recv(1) == b""
  except ConnectionResetError: return True
  except TimeoutError: return False

def quiet(s, timeout:float=0.3) -> bool:
  """Nothing arrives on s within timeout, and it stays open."""
  s.settimeout(timeout)
  try: s.recv(1, socket.MSG_PEEK)
  except TimeoutError: return True
  return False

def linkmsg(seq:int, channel:int, data:bytes, count:int|None=None, magic:int=P.LINK_MAGIC) -> bytes:
  return P.LINKHDR.pack(magic=magic, seq=seq, channel=channel & U64, count=len(data) if count is None else count) + data

class Dialer:
  """This suite as the sending runner: a peer connection to the runner under test proving link grant g, as Tdial would."""
  def __init__(self, addr:str, g:int, sec:bytes, label:bytes=P.LINK_SRC, count:int=0, mac:bytes|None=None):
    host, port = addr.rsplit(":", 1)
    self.s = socket.create_connection((host, int(port)), timeout=10)
    self.cnonce = os.urandom(32)
    self.s.sendall(P.pack(P.TPEER, 5, magic=P.MAGIC, grant=g, count=count, cnonce=self.cnonce,
                          mac=P.peer_mac(sec, label, g, count, self.cnonce) if mac is None else mac))
    self.reply = frame(self.s)
    self.g, self.sec = g, sec

  def proved(self):
    """The first Rpeer came, with count 0 and the link dst proof."""
    t, f, p = self.reply
    assert (t, f["tag"], f["size"], f["count"], f["mac"]) == (P.RPEER, 5, 56, 0, P.peer_mac(self.sec, P.LINK_DST, self.g, 0, self.cnonce)), \
      (P.TYPE_NAMES.get(t, t), f, p[:300])
    return self

  def send(self, b:bytes): self.s.sendall(b)
  def close(self): self.s.close()

def dialer(c, link:int, addr:str|None=None) -> Dialer:
  """Link `link` of session c receives from this suite."""
  g, sec = listen(c, link)
  d = Dialer(addr or "%s:%d" % c.s.getpeername()[:2], g, sec).proved()
  ok(c)   # the session took the connection between two requests
  return d

class Acceptor:
  """This suite as the receiving runner: a 127.0.0.1 socket that a session of the runner under test dials with grant g.
  answer: 'dst' the right proof; 'wrong' a wrong mac; 'copy' a copy's proof (the label "metal_runner peer dst"); an int, an Rerror with that code; 'close' closes at once."""
  def __init__(self, answer="dst", rcvbuf:int|None=None, delay:float=0.0):
    self.lst = socket.socket()
    if rcvbuf: self.lst.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)   # inherited by the accepted socket
    self.lst.bind(("127.0.0.1", 0))
    self.lst.listen(4)
    self.addr = "127.0.0.1:%d" % self.lst.getsockname()[1]
    self.g, self.sec = 0x7ffffff0 << 32 | 3, os.urandom(32)
    self.answer, self.delay, self.s, self.tpeer, self.err = answer, delay, None, None, None
    self.th = threading.Thread(target=self._serve, daemon=True)
    self.th.start()

  def _serve(self):
    try:
      self.lst.settimeout(10)
      s, _ = self.lst.accept()
      s.settimeout(10)
      self.s = s
      self.tpeer = frame(s)
      time.sleep(self.delay)
      tag = self.tpeer[1]["tag"]
      if self.answer == "dst": s.sendall(P.pack(P.RPEER, tag, count=0, mac=P.peer_mac(self.sec, P.LINK_DST, self.g, 0, self.tpeer[1]["cnonce"])))
      elif self.answer == "wrong": s.sendall(P.pack(P.RPEER, tag, count=0, mac=os.urandom(32)))
      elif self.answer == "copy": s.sendall(P.pack(P.RPEER, tag, count=0, mac=P.peer_mac(self.sec, P.PEER_DST, self.g, 0, self.tpeer[1]["cnonce"])))
      elif self.answer == "close": s.close()
      else:
        text = b"refused by the suite"
        s.sendall(P.pack(P.RERROR, tag, payload_len=len(text), code=self.answer, count=len(text)) + text)
    except Exception as e: self.err = e

  def dial(self, c, link:int) -> tuple[int, int, dict, bytes]:
    """Tdial on session c to this socket; (tag, reply type, fields, payload)."""
    tag = dial_req(c, link, self.addr, self.g, self.sec)
    t, f, p = c.frame()
    self.th.join(10)
    assert self.err is None, self.err
    return tag, t, f, p

  def connected(self, c, link:int) -> "Acceptor":
    tag, t, f, p = self.dial(c, link)
    assert (t, f["tag"]) == (P.RDIAL, tag), (P.TYPE_NAMES.get(t, t), f, p[:300])
    return self

  def msg(self) -> tuple[dict, bytes]:
    """The next link message: its header's fields and its data."""
    self.s.settimeout(10)
    h = P.LINKHDR.unpack(exact(self.s, P.LINK_HDR_SIZE))
    return h, exact(self.s, h["count"]) if h["magic"] == P.LINK_MAGIC and h["count"] < 1 << 30 else b""

  def close(self):
    if self.s is not None: self.s.close()
    self.lst.close()

# *** Thello, Rhello; Tload

@section("Thello, Rhello")
def test_rhello_has_cap_link(c):
  assert c.info["caps"] & P.CAP_LINK, f"caps {c.info['caps']:#x} lacks CAP_LINK (1024)"

@section("Links between runners", "Tload")
def test_link_programs_load_with_any_name_and_no_link_yet(c):
  """A link program has nbufs 1, nvals 2, corearg NO_CORE, arch 0, datalen 0 and crc 0, any name; its link is looked up at launch."""
  load_link(c, 1, SEND, 77, name=b"send to shard 2")
  load_link(c, 2, RECV, 77, name="recv \u00e9".encode())
  ok(c)

LINK_SHAPES = {"nbufs-0": dict(nbufs=0), "nbufs-2": dict(nbufs=2), "nvals-1": dict(nvals=1), "nvals-3": dict(nvals=3),
               "corearg-0": dict(corearg=0), "corearg-2": dict(corearg=2), "arch-x86_64": dict(arch=P.ARCH_X86_64),
               "arch-arm64": dict(arch=P.ARCH_ARM64), "datalen-1": dict(data=b"\x90"), "datalen-16": dict(data=b"\x90" * 16)}
@section("Tload")
@pytest.mark.parametrize("kind", [SEND, RECV], ids=["send", "recv"])
@pytest.mark.parametrize("over", LINK_SHAPES.values(), ids=LINK_SHAPES.keys())
def test_a_link_program_of_another_shape_is_einval(c, kind, over):
  tag = load_link(c, 1, kind, 1, **over)
  one_error(c, P.EINVAL, tag)
  load_link(c, 1, kind, 1)   # and the handle was not taken
  ok(c)

# *** Tlisten, Rlisten

@section("Links between runners")
def test_rlisten_is_a_grant_numbered_by_the_session_with_a_fresh_secret(c):
  (g1, s1), (g2, s2) = listen(c, 1), listen(c, 2)
  c.alloc(1, 8)
  tag = c.req(P.TGRANT, handle=1, offset=0, count=8, ttl=60)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RGRANT, tag)
  g3 = f["grant"]
  assert g1 >> 32 == g2 >> 32 == c.info["session"], (hex(g1), hex(g2), c.info["session"])
  assert g1 & 0xffffffff and g2 & 0xffffffff and len({g1, g2, g3}) == 3, (hex(g1), hex(g2), hex(g3))
  assert len(s1) == len(s2) == 32 and s1 != s2 and bytes(32) not in (s1, s2)

@section("Links between runners")
@pytest.mark.parametrize("ttl", [0, P.MAX_GRANT_TTL + 1, 0xffffffff])
def test_tlisten_ttl_0_or_above_600_is_einval_and_makes_no_link(c, ttl):
  tag = c.req(P.TLISTEN, link=3, ttl=ttl)
  refused(c, tag, P.EINVAL)
  listen(c, 3, ttl=P.MAX_GRANT_TTL)   # 600 is allowed, and the handle was free
  ok(c)

@section("Links between runners", "Handles")
def test_tlisten_of_a_link_handle_in_use_is_eexist(target, c):
  listen(c, 4)
  tag = c.req(P.TLISTEN, link=4, ttl=60)
  refused(c, tag, P.EEXIST)
  d = target.connect()
  pair(target, c, d, sl=5, rl=5)       # a sending link's handle is in the same namespace
  tag = c.req(P.TLISTEN, link=5, ttl=60)
  refused(c, tag, P.EEXIST)
  listen(d, 4)                         # handles belong to one session
  ok(c)
  d.close()

@section("Links between runners", "Handles", "Limits")
def test_a_session_holds_at_most_maxhandles_links(target):
  t = target.with_options("--max-handles", "8")
  c, d = t.connect(), t.connect()
  assert c.info["maxhandles"] == 8
  for h in range(7): listen(c, h)
  pair(t, c, d, sl=7, rl=1)                                   # 8 links, one of them sending
  tag = c.req(P.TLISTEN, link=100, ttl=60)
  refused(c, tag, P.ELIMIT)
  g, sec = listen(d, 2)
  tag = dial_req(c, 101, t.addr, g, sec)
  refused(c, tag, P.ELIMIT)
  for h in range(8): c.alloc(h, 8)                             # other namespaces are counted apart
  ok(c)
  c.req(P.TUNLINK, link=0)
  dial(c, 101, t.addr, g, sec)                                 # a failed Tdial changed nothing: the grant was not used
  tag = c.req(P.TLISTEN, link=100, ttl=60)
  refused(c, tag, P.ELIMIT)
  c.close(); d.close()

@section("Links between runners", "Tgrant, Rgrant")
def test_link_grants_count_among_the_64_until_used_freed_or_expired(target, c):
  d = target.connect()
  c.alloc(1, 64)
  for i in range(P.MAX_GRANTS - 2):
    tag = c.req(P.TGRANT, handle=1, offset=0, count=8, ttl=1)
    assert c.frame()[0] == P.RGRANT
  g, sec = listen(c, 1)
  listen(c, 2)                                                  # 64 unused grants
  tag = c.req(P.TLISTEN, link=3, ttl=60)
  refused(c, tag, P.ELIMIT)
  tag = c.req(P.TGRANT, handle=1, offset=0, count=8, ttl=60)
  refused(c, tag, P.ELIMIT)
  dial(d, 1, target.addr, g, sec)                               # used: it no longer counts
  listen(c, 3)
  c.req(P.TUNLINK, link=2)                                      # freed: its unused grant is forgotten
  listen(c, 4)
  tag = c.req(P.TLISTEN, link=5, ttl=60)
  refused(c, tag, P.ELIMIT)
  time.sleep(1.3)                                               # the 62 Tgrants expired
  listen(c, 5)
  ok(c)
  d.close()

@section("Links between runners")
def test_an_expired_link_grant_is_refused_and_the_link_stays(target, c):
  d = target.connect()
  g, sec = listen(c, 1, ttl=1)
  load_link(c, 1, RECV, 1)
  c.alloc(1, 16)
  time.sleep(1.3)
  tag = dial_req(d, 1, target.addr, g, sec)
  assert refused(d, tag, P.EGRANT).startswith("destination runner: ")
  tag = c.req(P.TLISTEN, link=1, ttl=60)                        # the link stays until Tunlink
  refused(c, tag, P.EEXIST)
  tag = xfer(c, 1, 1, 0, 16, 1)                                 # nobody connected to it
  assert refused(c, tag, P.EPEER).startswith(recv_text(1))
  ok(c); ok(d)
  d.close()

@section("Links between runners", "Pipelining and error delivery")
def test_tlisten_and_tdial_are_answered_after_the_earlier_requests(target, c):
  d = target.connect()
  bad = c.req(P.TFREE, handle=9)
  tag = c.req(P.TLISTEN, link=1, ttl=60)
  assert refused(c, bad, P.EHANDLE)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RLISTEN, tag)
  bad = d.req(P.TFREE, handle=9)
  tag = dial_req(d, 1, target.addr, f["grant"], f["secret"])
  assert refused(d, bad, P.EHANDLE)
  t, f, _ = d.frame()
  assert (t, f["tag"]) == (P.RDIAL, tag)
  d.close()

@section("Links between runners")
def test_a_link_grant_dies_with_its_session(target, c):
  d = target.connect()
  g, sec = listen(d, 1)
  d.close()
  time.sleep(0.3)
  tag = dial_req(c, 1, target.addr, g, sec)
  assert refused(c, tag, P.EGRANT).startswith("destination runner: ")
  listen(c, 1)   # the handle is not in use after the error
  ok(c)

# *** Tdial, Rdial

@section("Links between runners")
def test_rdial_comes_once_the_receiving_side_proved_the_grant(c):
  a = Acceptor(delay=0.5)
  t0 = time.monotonic()
  tag, t, f, p = a.dial(c, 1)
  took = time.monotonic() - t0
  assert (t, f["tag"], f["size"]) == (P.RDIAL, tag, 24), (P.TYPE_NAMES.get(t, t), f, p)
  assert took >= 0.45, f"Rdial came {took:.2f} s after the Tdial, before the Rpeer (sent after 0.5 s)"
  assert 0.45e9 <= f["ns"] <= took * 1e9, (f["ns"], took)
  tt, tf, _ = a.tpeer                                            # the Tpeer: count 0, the link src proof
  assert (tt, tf["size"], tf["magic"], tf["grant"], tf["count"]) == (P.TPEER, 96, P.MAGIC, a.g, 0), tf
  assert tf["mac"] == P.peer_mac(a.sec, P.LINK_SRC, a.g, 0, tf["cnonce"]), "the Tpeer's mac is not the link src proof"
  assert quiet(a.s), "the sending runner sent something after the Tpeer before it had anything to send"
  a.close()

@section("Links between runners", "Tpeer, Rpeer")
@pytest.mark.parametrize("answer", ["wrong", "copy", "close"], ids=["wrong-mac", "a-copys-proof", "closes"])
def test_a_receiving_side_that_does_not_prove_the_grant_is_epeer(c, answer):
  a = Acceptor(answer=answer)
  tag, t, f, p = a.dial(c, 1)
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, P.EPEER), (P.TYPE_NAMES.get(t, t), f, p)
  if answer != "close": assert eof(a.s), "the sending runner kept a connection whose far end did not prove the link grant"
  listen(c, 1)   # the handle is not in use after the error
  ok(c)
  a.close()

@section("Links between runners")
@pytest.mark.parametrize("code", [P.EGRANT, P.EHANDLE, P.EINVAL])
def test_the_receiving_runners_refusal_is_the_reply_with_its_code_prefixed(c, code):
  a = Acceptor(answer=code)
  tag, t, f, p = a.dial(c, 1)
  assert (t, f["tag"], f.get("code")) == (P.RERROR, tag, code), (P.TYPE_NAMES.get(t, t), f, p)
  assert p.startswith(b"destination runner: "), p
  listen(c, 1)
  ok(c)
  a.close()

@section("Links between runners")
@pytest.mark.parametrize("host,port", [(b"", 7), (b"h" * 256, 7), (b"127.0.0.1\0", 7), (b"a\0b", 7), (b"127.0.0.1", 0)],
                         ids=["hostlen-0", "hostlen-256", "nul-at-end", "nul-inside", "port-0"])
def test_tdial_bad_host_or_port_is_einval_and_makes_no_link(c, host, port):
  tag = dial_req(c, 1, "x:1", 1 << 32 | 1, bytes(32), host=host, port=port)
  refused(c, tag, P.EINVAL)
  listen(c, 1)
  ok(c)

@section("Links between runners")
def test_tdial_host_of_255_bytes_is_not_einval(c):
  # 255 bytes are a host Tdial takes; a label over 63 bytes names no host, so the runner cannot be reached: EPEER, its own (not a
  # receiving runner's refusal), and the link handle is free after it
  tag = dial_req(c, 1, "x:1", 1 << 32 | 1, bytes(32), host=b"h" * 255, port=7)   # never asked of the network
  assert not refused(c, tag, P.EPEER).startswith("destination runner: ")
  listen(c, 1)
  ok(c)

@section("Links between runners", "Handles")
def test_tdial_of_a_link_handle_in_use_is_eexist(target, c):
  d = target.connect()
  listen(c, 1)
  g, sec = listen(d, 1)
  tag = dial_req(c, 1, target.addr, g, sec)
  refused(c, tag, P.EEXIST)
  ok(c)
  d.close()

@section("Links between runners")
def test_tdial_to_an_unreachable_runner_is_epeer(c):
  s = socket.socket()
  s.bind(("127.0.0.1", 0))   # bound, not listening: refused
  for addr in ("127.0.0.1:%d" % s.getsockname()[1], "no-such-host.invalid:7"):
    tag = dial_req(c, 1, addr, 1 << 32 | 1, bytes(32))
    refused(c, tag, P.EPEER)
    listen(c, 1)               # the handle is not in use after the error
    c.req(P.TUNLINK, link=1)
  s.close()
  ok(c)

@section("Links between runners")
def test_tdial_with_a_wrong_secret_is_egrant_and_does_not_use_the_grant(target, c):
  d = target.connect()
  g, sec = listen(d, 1)
  tag = dial_req(c, 1, target.addr, g, os.urandom(32))
  assert refused(c, tag, P.EGRANT).startswith("destination runner: ")
  dial(c, 1, target.addr, g, sec)                              # the handle was free, and the grant unused
  tag = dial_req(c, 2, target.addr, g, sec)                    # used now: once
  assert refused(c, tag, P.EGRANT).startswith("destination runner: ")
  tag = dial_req(c, 3, target.addr, 0xfffffffe << 32 | 1, sec)   # a session this runner does not have
  assert refused(c, tag, P.EGRANT).startswith("destination runner: ")
  ok(c); ok(d)
  d.close()

@section("Links between runners", "Tpeersend, Rpeersend")
def test_a_link_grant_and_a_copy_grant_are_never_taken_for_each_other(target, c):
  d = target.connect()
  c.alloc(1, 16); c.write(1, 0, b"copied by a peer")
  d.alloc(2, 16)
  tag = d.req(P.TGRANT, handle=2, offset=0, count=16, ttl=60)
  t, f, _ = d.frame()
  assert t == P.RGRANT
  cg, csec = f["grant"], f["secret"]
  tag = dial_req(c, 1, target.addr, cg, csec)                   # a copy's grant in a Tdial
  assert refused(c, tag, P.EGRANT).startswith("destination runner: ")
  lg, lsec = listen(d, 1)
  host, port = target.addr.rsplit(":", 1)
  tag = c.req(P.TPEERSEND, host.encode(), handle=1, offset=0, count=16, grant=lg, secret=lsec, port=int(port), hostlen=len(host))
  assert refused(c, tag, P.EGRANT).startswith("destination runner: ")   # a link's grant in a Tpeersend
  tag = c.req(P.TPEERSEND, host.encode(), handle=1, offset=0, count=16, grant=cg, secret=csec, port=int(port), hostlen=len(host))
  t, f, p = c.frame()
  assert (t, f["tag"]) == (P.RPEERSEND, tag), (P.TYPE_NAMES.get(t, t), f, p)   # neither wrong proof used the other's grant up
  dial(c, 1, target.addr, lg, lsec)
  assert d.read(2, 0, 16) == b"copied by a peer"
  d.close()

@section("Links between runners", "Robustness rules")
@pytest.mark.parametrize("type,fields", [(P.TLISTEN, dict(link=1, ttl=60)), (P.TUNLINK, dict(link=1))], ids=["Tlisten", "Tunlink"])
def test_tlisten_or_tunlink_with_bytes_over_is_eproto_and_closes(c, type, fields):
  c.tag += 1
  c.send(P.pack(type, c.tag, payload_len=4, **fields) + bytes(4))
  fatal(c, P.EPROTO, c.tag)

@section("Links between runners", "Copies between runners")
def test_a_receiving_runner_at_its_session_limit_makes_tdial_epeer(target, c):
  full = target.with_options("--max-sessions", "1")
  d = full.connect()
  g, sec = listen(d, 1)
  tag = dial_req(c, 1, full.addr, g, sec)
  refused(c, tag, P.EPEER)
  listen(c, 1)
  ok(c); ok(d)
  d.close()

@section("Links between runners", "Robustness rules")
@pytest.mark.parametrize("hostlen,host", [(9, b"127.0.0."), (3, b"127.0.0.1"), (0xffff, b"127.0.0.1")], ids=["short", "long", "hostlen-max"])
def test_tdial_whose_size_disagrees_with_hostlen_is_eproto_and_closes(c, hostlen, host):
  c.tag += 1
  c.send(P.pack(P.TDIAL, c.tag, payload_len=len(host), link=1, port=7, hostlen=hostlen, grant=1 << 32 | 1) + host)
  fatal(c, P.EPROTO, c.tag)

@section("Links between runners")
def test_a_session_dialing_its_own_grant_fails_with_epeer_after_the_frame_timeout(target):
  t = target.with_options("--frame-timeout", "2")
  c = t.connect()
  g, sec = listen(c, 1)
  t0 = time.monotonic()
  tag = dial_req(c, 2, t.addr, g, sec)
  refused(c, tag, P.EPEER)
  assert 1.5 <= time.monotonic() - t0 < 8, time.monotonic() - t0
  listen(c, 2)
  ok(c)
  c.close()

# *** the suite as the dialing peer: the receiving session's side of the exchange

@section("Links between runners", "Tpeer, Rpeer")
def test_the_suite_dials_a_link_and_its_messages_land_in_the_buffer(target, c):
  c.alloc(1, 64); c.write(1, 0, b"\xee" * 64)
  load_link(c, 1, RECV, 6)
  g, sec = listen(c, 6)
  d = Dialer(target.addr, g, sec).proved()
  assert quiet(d.s), "a second Rpeer (or anything else) followed the first on a link"
  d.send(linkmsg(1, 10, b"first message!!!") + linkmsg(2, 11, b"second"))
  run(c, 1, 1, 4, 16, 10)
  run(c, 1, 1, 40, 6, 11)
  assert c.read(1, 0, 64) == b"\xee" * 4 + b"first message!!!" + b"\xee" * 20 + b"second" + b"\xee" * 18
  d.send(linkmsg(3, -5, b"negative channel"))                     # a channel is any value[1]: -5 is 2^64-5 in the header
  run(c, 1, 1, 0, 16, -5)
  assert c.read(1, 0, 16) == b"negative channel"
  d.close()

@section("Links between runners", "Tpeer, Rpeer")
def test_a_copys_proof_for_a_link_grant_is_egrant_and_does_not_use_it(target, c):
  g, sec = listen(c, 1)
  d = Dialer(target.addr, g, sec, label=P.PEER_SRC)
  t, f, p = d.reply
  assert (t, f["tag"], f.get("code")) == (P.RERROR, 5, P.EGRANT), (P.TYPE_NAMES.get(t, t), f, p)
  assert eof(d.s)
  d = Dialer(target.addr, g, sec, mac=os.urandom(32))             # a wrong proof: the same
  assert (d.reply[0], d.reply[1].get("code")) == (P.RERROR, P.EGRANT), d.reply
  assert eof(d.s)
  Dialer(target.addr, g, sec).proved().close()                    # the grant was not used up
  d = Dialer(target.addr, g, sec)                                 # now it is
  assert (d.reply[0], d.reply[1].get("code")) == (P.RERROR, P.EGRANT), d.reply
  ok(c)

@section("Links between runners", "Tpeer, Rpeer")
def test_a_links_tpeer_with_a_count_is_refused_and_uses_the_grant(target, c):
  g, sec = listen(c, 1)
  d = Dialer(target.addr, g, sec, count=16)                       # the right proof over count 16: a link's count is 0
  t, f, p = d.reply
  assert (t, f["tag"], f.get("code")) == (P.RERROR, 5, P.EINVAL), (P.TYPE_NAMES.get(t, t), f, p)
  assert eof(d.s)
  d = Dialer(target.addr, g, sec)                                 # a right proof uses the grant up, whatever follows
  assert (d.reply[0], d.reply[1].get("code")) == (P.RERROR, P.EGRANT), d.reply
  ok(c)

@section("Links between runners", "Tlaunch, Rlaunch")
def test_a_receive_waits_for_the_message_and_later_requests_see_it(target, c):
  c.alloc(1, 32); c.write(1, 0, b"A" * 32); c.alloc(2, 32)
  load_link(c, 1, RECV, 1)
  d = dialer(c, 1)
  c.req(P.TCOPY, dst=2, src=1, count=32)                          # earlier work reading the range sees the old bytes
  xfer(c, 1, 1, 0, 32, 3, wait=False)                             # no reply: the Tread after it waits for it
  rtag = c.req(P.TREAD, handle=1, offset=0, count=32)
  time.sleep(0.3)
  d.send(linkmsg(1, 3, b"B" * 32))
  t, f, p = c.frame()
  assert (t, f["tag"], p) == (P.RREAD, rtag, b"B" * 32), (P.TYPE_NAMES.get(t, t), f, p)
  assert c.read(2, 0, 32) == b"A" * 32
  d.close()

@section("Links between runners", "Tgraphrun, Rgraphrun")
def test_rgraphrun_of_a_graph_with_a_link_entry_is_the_wall_time_links_included(target, c):
  c.alloc(1, 8)
  load_link(c, 1, RECV, 1)
  graph(c, 1, link_rec(1, 1, 0, 8, 1))
  d = dialer(c, 1)
  t0 = time.monotonic()
  tag = graphrun(c, 1)
  time.sleep(0.5)
  d.send(linkmsg(1, 1, b"12345678"))
  f = graph_done(c, tag)
  assert 0.45e9 <= f["ns"] <= (time.monotonic() - t0) * 1e9, f
  assert c.read(1, 0, 8) == b"12345678"
  d.close()

# *** ordering: a wrong message breaks the link; later uses fail; the session goes on

WRONG = {
  "channel": lambda: linkmsg(1, 6, b"x" * 16),
  "count-less": lambda: linkmsg(1, 5, b"x" * 15),
  "count-more": lambda: linkmsg(1, 5, b"x" * 17),
  "seq-2-first": lambda: linkmsg(2, 5, b"x" * 16),
  "seq-0": lambda: linkmsg(0, 5, b"x" * 16),
  "magic": lambda: linkmsg(1, 5, b"x" * 16, magic=P.LINK_MAGIC ^ 1),
  "garbage": lambda: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\0\0\0\0\0" + b"x" * 16,
}
@section("Links between runners")
@pytest.mark.parametrize("wrong", WRONG.values(), ids=WRONG.keys())
def test_a_message_out_of_turn_breaks_the_link_with_epeer_and_the_session_goes_on(target, c, wrong):
  c.alloc(1, 16); c.write(1, 0, b"\x11" * 16); c.alloc(2, 16)
  load_link(c, 1, RECV, 1)
  load_link(c, 2, RECV, 2)
  d, other = dialer(c, 1), dialer(c, 2)
  d.send(wrong())
  tag = xfer(c, 1, 1, 0, 16, 5)
  assert refused(c, tag, P.EPEER).startswith(recv_text(1))
  assert c.read(1, 0, 16) == b"\x11" * 16, "a message out of turn was taken"
  assert eof(d.s), "the runner kept a broken link's connection open"
  tag = xfer(c, 1, 1, 0, 16, 5)                                    # and every later use fails
  assert refused(c, tag, P.EPEER).startswith(recv_text(1))
  other.send(linkmsg(1, 5, b"o" * 16))                            # its other links go on
  run(c, 2, 2, 0, 16, 5)
  assert c.read(2, 0, 16) == b"o" * 16
  ok(c)
  d.close(); other.close()

@section("Links between runners")
def test_a_repeated_seq_breaks_the_link(target, c):
  c.alloc(1, 16)
  load_link(c, 1, RECV, 1)
  d = dialer(c, 1)
  d.send(linkmsg(1, 5, b"y" * 16) + linkmsg(1, 5, b"z" * 16))
  run(c, 1, 1, 0, 16, 5)
  tag = xfer(c, 1, 1, 0, 16, 5)
  assert refused(c, tag, P.EPEER).startswith(recv_text(1))
  assert c.read(1, 0, 16) == b"y" * 16
  d.close()

@section("Links between runners")
@pytest.mark.parametrize("sent", [0, 20, 40], ids=["nothing", "half-a-header", "half-the-data"])
def test_a_peer_that_closes_breaks_the_link(target, c, sent):
  c.alloc(1, 16)
  load_link(c, 1, RECV, 1)
  d = dialer(c, 1)
  d.send(linkmsg(1, 5, b"w" * 16)[:sent])
  d.close()
  tag = xfer(c, 1, 1, 0, 16, 5)
  assert refused(c, tag, P.EPEER).startswith(recv_text(1))
  tag = xfer(c, 1, 1, 0, 16, 5)
  refused(c, tag, P.EPEER)
  ok(c)

@section("Links between runners")
@pytest.mark.parametrize("sent", [0, 40], ids=["nothing", "half-the-data"])
def test_a_peer_that_stalls_past_the_frame_timeout_breaks_the_link(target, sent):
  t = target.with_options("--frame-timeout", "2")
  c = t.connect()
  c.alloc(1, 16)
  load_link(c, 1, RECV, 1)
  d = dialer(c, 1)
  d.send(linkmsg(1, 5, b"w" * 16)[:sent])
  t0 = time.monotonic()
  tag = xfer(c, 1, 1, 0, 16, 5)
  assert refused(c, tag, P.EPEER).startswith(recv_text(1))
  assert 1.5 <= time.monotonic() - t0 < 8, time.monotonic() - t0
  assert eof(d.s)
  tag = xfer(c, 1, 1, 0, 16, 5)
  refused(c, tag, P.EPEER)
  ok(c)
  c.close()

# *** the suite as the receiving runner: the link message as sent

@section("Links between runners", "Tlaunch, Rlaunch", "Tgraphrun, Rgraphrun")
def test_link_messages_carry_magic_seq_channel_count_and_exactly_the_bytes(c):
  a = Acceptor().connected(c, 3)
  data = os.urandom(100)
  c.alloc(1, 100); c.write(1, 0, data)
  load_link(c, 7, SEND, 3)
  xfer(c, 7, 1, 10, 50, 7, wait=False, g=(5, 2, 3), l=(4, 1, 2))   # after the Twrite; dimensions are ignored: one message
  launched(c, xfer(c, 7, 1, 99, 1, -1))
  graph(c, 1, link_rec(7, 1, 0, 100, 1 << 40))
  graphrun(c, 1, wait=False)
  c.write(1, 0, bytes(100))
  ok(c)
  for seq, ch, body in [(1, 7, data[10:60]), (2, U64, data[99:]), (3, 1 << 40, data)]:
    h, b = a.msg()
    assert (h["magic"], h["pad"], h["seq"], h["channel"], h["count"]) == (P.LINK_MAGIC, 0, seq, ch, len(body)), h
    assert b == body, f"message {seq}: the bytes differ"
  assert quiet(a.s), "more than the three messages came"
  a.close()

@section("Links between runners")
def test_a_send_ends_only_when_the_link_took_every_byte(c):
  a = Acceptor(rcvbuf=65536).connected(c, 1)
  n = 12 << 20
  c.alloc(1, n); c.write(1, 0, b"\x5a" * n)
  load_link(c, 1, SEND, 1)
  got = {}
  def reader():
    time.sleep(1.0)
    got["msg"] = a.msg()
    got["t"] = time.monotonic()
  th = threading.Thread(target=reader, daemon=True)
  t0 = time.monotonic()
  th.start()
  run(c, 1, 1, 0, n, 9)
  took = time.monotonic() - t0
  th.join(10)
  assert took >= 0.9, f"Rlaunch came after {took:.2f} s, before the receiving side (which starts reading after 1 s) took the bytes"
  h, b = got["msg"]
  assert (h["seq"], h["channel"], h["count"], b == b"\x5a" * n) == (1, 9, n, True), h
  a.close()

@section("Links between runners", "Tgraphrun, Rgraphrun")
@cpu_only
def test_a_sent_range_is_kept_as_it_was_when_later_kernels_change_it(target, c):
  a = Acceptor(rcvbuf=65536).connected(c, 1)
  n = 12 << 20
  kernel(target, "add1").load(c, 2)
  c.alloc(1, n); c.write(1, 0, f32(7.0) * (n // 4)); c.alloc(2, 64)
  load_link(c, 1, SEND, 1)
  graph(c, 1, link_rec(1, 1, 0, n, 2), add1_rec(2, 1, 2, 16))      # the kernel after the send overwrites the range's start
  got = {}
  def reader():
    time.sleep(0.5)
    got["msg"] = a.msg()
  th = threading.Thread(target=reader, daemon=True)
  th.start()
  graph_done(c, graphrun(c, 1))
  th.join(20)
  h, b = got["msg"]
  assert h["count"] == n and b[:64] == f32(7.0) * 16 and b == f32(7.0) * (n // 4), "the message holds bytes written after the send"
  assert c.read(1, 0, 64) == f32(1.0) * 16
  a.close()

@section("Links between runners")
def test_a_receiving_side_that_takes_nothing_breaks_a_send_after_the_frame_timeout(target):
  t = target.with_options("--frame-timeout", "2")
  c = t.connect()
  a = Acceptor(rcvbuf=65536).connected(c, 1)
  n = 12 << 20
  c.alloc(1, n)
  load_link(c, 1, SEND, 1)
  t0 = time.monotonic()
  tag = xfer(c, 1, 1, 0, n, 1)
  text = refused(c, tag, P.EPEER)
  assert text.startswith(send_text(1, a.addr)), text
  assert 1.5 <= time.monotonic() - t0 < 10, time.monotonic() - t0
  tag = xfer(c, 1, 1, 0, 16, 1)
  assert refused(c, tag, P.EPEER).startswith(send_text(1, a.addr))
  ok(c)
  assert c.read(1, 0, 4) == bytes(4)
  a.close(); c.close()

@section("Links between runners")
def test_a_receiving_side_that_closes_fails_the_next_send(c):
  a = Acceptor().connected(c, 1)
  c.alloc(1, 16)
  load_link(c, 1, SEND, 1)
  run(c, 1, 1, 0, 16, 1)
  assert a.msg()[0]["seq"] == 1
  a.s.close()
  time.sleep(0.2)
  tag = xfer(c, 1, 1, 0, 16, 1)
  assert refused(c, tag, P.EPEER).startswith(send_text(1, a.addr))
  tag = xfer(c, 1, 1, 0, 16, 1)
  refused(c, tag, P.EPEER)
  ok(c)
  a.close()

# *** two sessions of the runner under test

@section("Links between runners", "Tlaunch, Rlaunch")
def test_data_goes_from_a_sending_to_a_receiving_session(target, c):
  d = target.connect()
  pair(target, c, d, sl=1, rl=2, sprog=3, rprog=4)
  data = os.urandom(4096)
  c.alloc(1, 4096); c.write(1, 0, data)
  d.alloc(1, 8192); d.write(1, 0, b"\x55" * 8192)
  for ch, off in [(1, 0), (2, 100), (3, 4000)]:                     # three sends before any receive: a send never waits for it
    run(c, 3, 1, off, 96, ch)
  for ch, off in [(1, 0), (2, 100), (3, 4000)]:
    run(d, 4, 1, off + 1000, 96, ch)
  want = bytearray(b"\x55" * 8192)
  for off in (0, 100, 4000): want[off + 1000:off + 1096] = data[off:off + 96]
  assert d.read(1, 0, 8192) == bytes(want)
  d.close()

@section("Links between runners")
def test_two_sessions_that_send_to_each_other_before_they_receive_never_wait(target, c):
  d = target.connect()
  pair(target, c, d, sl=1, rl=2, sprog=1, rprog=2)
  pair(target, d, c, sl=1, rl=2, sprog=1, rprog=2)
  n = 40 << 20                                                        # more than both sockets' buffers take at once
  x, y = b"\x01" * n, b"\x02" * n
  c.alloc(1, n); c.write(1, 0, x); c.alloc(2, n)
  d.alloc(1, n); d.write(1, 0, y); d.alloc(2, n)
  for s in (c, d): graph(s, 1, link_rec(1, 1, 0, n, 1), link_rec(2, 2, 0, n, 1))
  for s in (c, d): s.s.settimeout(30)
  tc, td = graphrun(c, 1), graphrun(d, 1)
  graph_done(c, tc); graph_done(d, td)
  assert c.read(2, 0, 16) == b"\x02" * 16 and c.read(2, n - 16, 16) == b"\x02" * 16
  assert d.read(2, 0, 16) == b"\x01" * 16 and d.read(2, n - 16, 16) == b"\x01" * 16
  d.close()

@section("Links between runners", "Tgraphrun, Rgraphrun", "Tgraph")
@cpu_only
def test_graphs_with_kernels_before_and_after_link_entries_and_patches(target, c):
  d = target.connect()
  k = kernel(target, "add1")
  pair(target, c, d, sl=1, rl=1, sprog=2, rprog=2)
  k.load(c, 1); k.load(d, 1)
  c.alloc(1, 64); c.write(1, 0, f32(*range(16))); c.alloc(2, 64); c.alloc(3, 64); c.write(3, 0, bytes(range(64)))
  d.alloc(1, 64); d.alloc(2, 64); d.alloc(3, 64)
  graph(c, 1, add1_rec(1, 2, 1, 16), link_rec(2, 2, 0, 64, 1))     # the kernel before the send
  graph(d, 1, link_rec(2, 1, 0, 64, 1), add1_rec(1, 2, 1, 16))     # the kernel after the receive
  f = graph_done(c, graphrun(c, 1))
  assert f["ns"] > 0
  graph_done(d, graphrun(d, 1))
  assert d.read(2, 0, 64) == f32(*(i + 2 for i in range(16)))
  # PATCH_BUF and PATCH_VAL on the link records: another buffer and offset, count and channel
  graph_done(c, graphrun(c, 1, P.patch(1, P.PATCH_BUF, 0, 3, 16) + P.patch(1, P.PATCH_VAL, 0, value=32) + P.patch(1, P.PATCH_VAL, 1, value=9)))
  graph_done(d, graphrun(d, 1, P.patch(0, P.PATCH_BUF, 0, 3, 8) + P.patch(0, P.PATCH_VAL, 0, value=32) + P.patch(0, P.PATCH_VAL, 1, value=9)))
  assert d.read(3, 0, 64) == bytes(8) + bytes(range(16, 48)) + bytes(24)
  # the patches stay applied: a third run uses them, without FWAIT
  c.write(3, 16, b"\xab" * 32)
  graphrun(c, 1, wait=False); graphrun(d, 1, wait=False)
  ok(c)
  assert d.read(3, 8, 32) == b"\xab" * 32
  d.close()

@section("Links between runners", "Tgraphrun, Rgraphrun")
@cpu_only
def test_a_link_entry_that_fails_stops_the_run_at_that_entry(target, c):
  k = kernel(target, "add1")
  k.load(c, 1)
  load_link(c, 2, RECV, 1)
  c.alloc(1, 64); c.write(1, 0, f32(*([1.0] * 16))); c.alloc(2, 64); c.alloc(3, 64)
  graph(c, 1, add1_rec(1, 2, 1, 16), link_rec(2, 1, 0, 64, 5), add1_rec(1, 3, 1, 16))
  d = dialer(c, 1)
  d.send(linkmsg(1, 6, b"\0" * 64))                                 # another channel
  tag = graphrun(c, 1)
  assert refused(c, tag, P.EPEER).startswith(recv_text(1))
  assert c.read(2, 0, 64) == f32(*([2.0] * 16)), "the kernel before the failed link entry did not run"
  assert c.read(3, 0, 64) == bytes(64), "the kernel after the failed link entry ran"
  d.close()

# *** what is checked before a link program runs

@section("Links between runners", "Tlaunch, Rlaunch")
def test_a_link_program_checks_its_link_buffer_and_range_first(target, c):
  d = target.connect()
  c.alloc(1, 64)
  load_link(c, 1, RECV, 1)   # link 1 receives, nobody connected
  load_link(c, 2, SEND, 1)
  load_link(c, 3, RECV, 9)   # no link 9
  load_link(c, 4, RECV, 2)   # link 2 will send
  load_link(c, 5, SEND, 2)
  listen(c, 1)
  pair(target, c, d, sl=2, rl=1)
  for args, code in [((3, 1, 0, 16, 1), P.EHANDLE),                # no such link
                     ((2, 1, 0, 16, 1), P.EINVAL),                 # a send program on a receiving link
                     ((4, 1, 0, 16, 1), P.EINVAL),                 # a receive program on a sending link
                     ((1, 9, 0, 16, 1), P.EHANDLE),                # no such buffer
                     ((5, 9, 0, 16, 1), P.EHANDLE),
                     ((1, 1, 0, 0, 1), P.ERANGE),                  # value[0] is not above 0
                     ((5, 1, 0, 0, 1), P.ERANGE),
                     ((1, 1, 0, -1, 1), P.ERANGE),
                     ((5, 1, 0, -(1 << 63), 1), P.ERANGE),
                     ((1, 1, 0, 65, 1), P.ERANGE),                 # more than the buffer
                     ((5, 1, 60, 5, 1), P.ERANGE),
                     ((1, 1, 65, 1, 1), P.ERANGE),                 # an offset past the end
                     ((5, 1, 1 << 63, (1 << 63) - 1, 1), P.ERANGE),   # a range whose end would wrap
                     ((1, 1, 0, 64, 1), P.EPEER)]:                 # all good, but no runner has connected to link 1
    tag = xfer(c, *args)
    text = refused(c, tag, code)
    if code == P.EPEER: assert text.startswith(recv_text(1)), text
  tags = [xfer(c, 3, 1, 0, 16, 1, wait=False), xfer(c, 5, 1, 0, 0, 1, wait=False)]   # without FWAIT: queued
  assert [e[:2] for e in c.until_pong()] == [(P.EHANDLE, tags[0]), (P.ERANGE, tags[1])]
  run(c, 5, 1, 0, 64, 1)                                            # a send on link 2 still works
  d.alloc(1, 64)
  load_link(d, 8, RECV, 1)
  run(d, 8, 1, 0, 64, 1)
  d.close()

@section("Links between runners", "Tlaunch, Rlaunch")
def test_a_link_launch_with_a_dimension_0_or_other_argument_counts_is_einval(c):
  c.alloc(1, 16)
  load_link(c, 1, RECV, 1)
  listen(c, 1)
  for g, l in [((0, 1, 1), (1, 1, 1)), ((1, 1, 0), (1, 1, 1)), ((1, 1, 1), (0, 1, 1)), ((1, 1, 1), (1, 0, 1))]:
    tag = xfer(c, 1, 1, 0, 16, 1, g=g, l=l)
    refused(c, tag, P.EINVAL)
  bufs, vals = [(1, 0), (1, 0)], [16, 1]
  tag = c.req(P.TLAUNCH, P.launch_args(bufs, vals), P.FWAIT, **P.launch_fields(1, bufs, vals))
  refused(c, tag, P.EINVAL)
  bufs, vals = [(1, 0)], [16]
  tag = c.req(P.TLAUNCH, P.launch_args(bufs, vals), P.FWAIT, **P.launch_fields(1, bufs, vals))
  refused(c, tag, P.EINVAL)
  ok(c)

@section("Links between runners", "Tgraphrun, Rgraphrun")
@cpu_only
def test_a_graph_runs_nothing_when_a_link_entrys_range_is_wrong(target, c):
  kernel(target, "add1").load(c, 1)
  load_link(c, 2, RECV, 1)
  c.alloc(1, 64); c.alloc(2, 64)
  d = dialer(c, 1)
  graph(c, 1, add1_rec(1, 2, 1, 16), link_rec(2, 1, 0, 64, 1))
  for pat, code in [(P.patch(1, P.PATCH_VAL, 0, value=0), P.ERANGE), (P.patch(1, P.PATCH_VAL, 0, value=65), P.ERANGE),
                    (P.patch(1, P.PATCH_BUF, 0, 9, 0), P.EHANDLE)]:
    tag = graphrun(c, 1, pat)
    refused(c, tag, code)
    assert c.read(2, 0, 64) == bytes(64), "a kernel ran before a link entry that failed its checks"
  d.send(linkmsg(1, 1, b"m" * 64))                                  # the link is not broken by checks that failed
  graph_done(c, graphrun(c, 1, P.patch(1, P.PATCH_BUF, 0, 1, 0) + P.patch(1, P.PATCH_VAL, 0, value=64)))
  assert c.read(1, 0, 64) == b"m" * 64 and c.read(2, 0, 64) == f32(*([1.0] * 16))
  d.close()

# *** Tunlink

@section("Links between runners", "Handles")
def test_tunlink_of_no_such_link_is_ehandle_and_a_freed_handle_is_reusable_at_once(target, c):
  tag = c.req(P.TUNLINK, link=5)
  one_error(c, P.EHANDLE, tag)
  listen(c, 5)
  c.req(P.TUNLINK, link=5)
  tag = c.req(P.TUNLINK, link=5)
  one_error(c, P.EHANDLE, tag)
  listen(c, 5)
  d = target.connect()
  tag = d.req(P.TUNLINK, link=5)                                     # another session's link is not this session's
  one_error(d, P.EHANDLE, tag)
  d.close()

@section("Links between runners")
def test_tunlink_forgets_the_unused_grant(target, c):
  d = target.connect()
  g, sec = listen(c, 1)
  c.req(P.TUNLINK, link=1)
  tag = dial_req(d, 1, target.addr, g, sec)
  assert refused(d, tag, P.EGRANT).startswith("destination runner: ")
  g2, sec2 = listen(c, 1)                                           # a new link under the handle: a new grant; the old stays dead
  tag = dial_req(d, 1, target.addr, g, sec)
  assert refused(d, tag, P.EGRANT).startswith("destination runner: ")
  dial(d, 1, target.addr, g2, sec2)
  d.close()

@section("Links between runners")
def test_tunlink_of_a_receiving_link_fails_its_senders_next_use(target, c):
  d = target.connect()
  pair(target, c, d, sl=1, rl=2, sprog=1, rprog=1)
  c.alloc(1, 16); d.alloc(1, 16)
  run(c, 1, 1, 0, 16, 1); run(d, 1, 1, 0, 16, 1)
  d.req(P.TUNLINK, link=2)
  ok(d)
  time.sleep(0.1)
  tag = xfer(c, 1, 1, 0, 16, 2)
  assert refused(c, tag, P.EPEER).startswith(send_text(1, target.addr))
  tag = xfer(d, 1, 1, 0, 16, 2)                                     # its program stays loaded, and fails with EHANDLE
  refused(d, tag, P.EHANDLE)
  ok(c); ok(d)
  d.close()

@section("Links between runners")
def test_tunlink_of_a_sending_link_fails_its_receivers_next_use_and_a_new_link_serves_its_programs(target, c):
  d = target.connect()
  pair(target, c, d, sl=1, rl=2, sprog=1, rprog=1)
  c.alloc(1, 16); c.write(1, 0, b"sixteen bytes!!!"); d.alloc(1, 16)
  c.req(P.TUNLINK, link=1)
  ok(c)
  tag = xfer(d, 1, 1, 0, 16, 1)
  text = refused(d, tag, P.EPEER)
  assert text.startswith(recv_text(2)), text
  tag = xfer(c, 1, 1, 0, 16, 1)
  refused(c, tag, P.EHANDLE)                                        # the program stays, its link is gone
  d.req(P.TUNLINK, link=2)
  pair(target, c, d, sl=1, rl=2)                                    # a new link under both handles: the programs serve again
  run(c, 1, 1, 0, 16, 1)
  run(d, 1, 1, 0, 16, 1)
  assert d.read(1, 0, 16) == b"sixteen bytes!!!"
  d.close()

@section("Links between runners")
def test_tunlink_closes_the_sending_links_connection(c):
  a = Acceptor().connected(c, 1)
  c.req(P.TUNLINK, link=1)
  ok(c)
  assert eof(a.s), "the link's connection stayed open after Tunlink"
  a.close()

@section("Links between runners", "Handles")
def test_a_links_session_ending_fails_the_other_sides_next_use(target, c):
  d = target.connect()
  pair(target, c, d, sl=1, rl=1, sprog=1, rprog=1)
  c.alloc(1, 16); d.alloc(1, 16)
  c.write(1, 0, b"s" * 16)
  run(c, 1, 1, 0, 16, 1)
  run(d, 1, 1, 0, 16, 1)                                            # received, all of it: the session's end closes the link cleanly,
  assert d.read(1, 0, 16) == b"s" * 16                              # with no unread data that would make it a reset
  d.close()
  time.sleep(0.3)
  tag = xfer(c, 1, 1, 0, 16, 2)                                     # a send into the closed connection would still succeed once
  assert refused(c, tag, P.EPEER).startswith(send_text(1, target.addr))
  ok(c)

@section("Handles")
def test_one_number_names_a_buffer_a_program_a_graph_and_a_link(c):
  c.alloc(9, 16)
  load_link(c, 9, RECV, 9)
  graph(c, 9, link_rec(9, 9, 0, 16, 1))
  d = dialer(c, 9)
  d.send(linkmsg(1, 1, b"9" * 16))
  graph_done(c, graphrun(c, 9))
  assert c.read(9, 0, 16) == b"9" * 16
  d.close()
