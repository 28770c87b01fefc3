"""Sessions that survive a dropped link (protocol.md, "Resuming a session"): the client's side of it.

When the runner offers CAP_RESUME, a Runner asks for the session's resume key as it connects (Tresumekey: one round trip, so that
a link dropped in the first upload can be resumed too) and from then on keeps two counts and a log:
  - every request handed to the socket, until a reply shows the runner processed it: a reply or Rerror to request t means every
    request up to t was processed, since the runner takes them one at a time, in order. The log holds references, not copies: the
    send buffers it hands over, immutable bytes, and the caller's own memory (a write's data) while the caller's call runs. Before
    such a call returns, what of the caller's memory the runner may not have processed yet is copied if that is quicker than a round
    trip, else the runner is asked to confirm it first (Runner._release): so a bulk upload costs no copy, and no pause but one round
    trip at its end. A long burst of requests that wait for nothing (launches) gets a Tping when the log passes WINDOW bytes, and waits
    for its Rping past twice that, so the log stays bounded;
  - the bytes of whole frames received since the handshake. After a large Rread the client acknowledges them (Tack, with CAP_ACK),
    so the runner, which keeps that data by reference to the buffer, never has to copy it.
When the socket fails (an error or end of stream; a timeout is not a dropped link and still raises), resume() connects again with
backoff, does the handshake (Thello, Tauth with the same token), proves it holds the key with Tresume, and on Rresume sends again
the requests the runner had not processed; the runner sends again the reply bytes the client had not received. It raises
RunnerConnectionError only when the runner refuses (ERESUME: the session ended or its grace period passed; EAUTH) or the grace
period the runner announced is over.
"""
from __future__ import annotations
import collections, hashlib, hmac, os, socket, struct, time
from . import protocol as P
from .protocol import AUTH_CLIENT, AUTH_SERVER
from .errors import RunnerError
from .address import parse_addr

WINDOW = 16 << 20   # bytes of copies and send buffers not known to be processed before a Tping asks how far the runner got
LABEL_CLIENT, LABEL_SERVER = b"metal_runner-resume-v1 client", b"metal_runner-resume-v1 server"
# Copying the caller's memory that the runner has not confirmed costs about n / COPY_RATE seconds; waiting for the confirmation costs a
# round trip. The log copies up to the bytes a round trip is worth (measured on the Tresumekey exchange, and again on each resume, which
# often follows a change of network), within these bounds.
COPY_RATE, COPY_MIN, COPY_MAX = 4e9, 64 << 10, 64 << 20
def copy_max(rtt:float) -> int: return int(min(COPY_MAX, max(COPY_MIN, rtt * COPY_RATE)))

class Replay:
  """The requests sent since the last one known to be processed, and the counts a Tresume carries. Requests are numbered from the
  stream's first (Tresumekey), one tag each: nothing is recorded per request, so that a pipelined burst costs nothing here; the log
  keeps whole send buffers, each with the number of the request its last byte belongs to, and finds request boundaries by their
  frame headers only when a resume needs them."""
  def __init__(self, tag:int):
    self.tag0 = tag      # the tag of request number 0
    self.key: dict|None = None   # the Rresumekey fields (secret, grace, log) once it arrived
    self.chunks: collections.deque = collections.deque()  # [bytes-like, lent, last]: the request bytes handed to the socket, from base on
    self.base = self.sent = 0   # sent: request bytes handed to the socket
    self.held = self.lent = 0   # bytes in chunks: the log's own, and the caller's memory (lent: valid only until its call returns)
    self.first = 0      # the number of the first request in the log
    self.acked = 0      # requests known to be processed
    self.nsent = 0      # requests handed to the socket
    self.received = 0   # bytes of whole frames received
    self.ping: int|None = None  # the tag of the Tping sent to trim the log, until the runner has processed it (its number: pingn)
    self.pingn = 0
    self.copy_max = COPY_MIN    # lent bytes Runner._release copies rather than wait a round trip for

  def issued(self, newest:int) -> int:
    """Requests issued, newest being the tag of the newest (fewer than 2^32 of them not known processed)."""
    return self.acked + ((newest + 1 - self.tag0 - self.acked) & 0xffffffff)

  def log(self, bufs, newest:int):
    """bufs went to the socket, ending with the bytes of request tag newest: send buffers and immutable bytes are the log's own, other
    memoryviews the caller's."""
    self.nsent = last = self.issued(newest)
    last -= 1
    for b in bufs:
      if not (n := b.nbytes if isinstance(b, memoryview) else len(b)): continue
      lent = isinstance(b, memoryview) and not isinstance(b.obj, bytes)
      self.chunks.append([b, lent, last])
      self.sent += n
      if lent: self.lent += n
      else: self.held += n

  def sent_own(self, b:bytearray, newest:int):
    """log([b], newest) for the usual flush: one send buffer, the log's own."""
    self.nsent = n = self.issued(newest)
    self.chunks.append([b, False, n - 1])
    self.sent += (n := len(b))
    self.held += n

  def own(self):
    """The caller takes its memory back: copy what of it the log still holds."""
    for c in self.chunks:
      if c[1]: c[0], c[1] = bytes(c[0]), False
    self.held, self.lent = self.held + self.lent, 0

  def frame(self, t:int, size:int, tag:int, f:dict, newest:int):
    """A whole frame arrived: count it, and drop the requests it shows were processed (a reply or Rerror to request n: all up to n).
    newest: the tag of the newest request issued."""
    self.received += size
    if t == P.RRESUMEKEY and f.get("grace"): self.key = f
    if (d := (tag - self.tag0 - self.acked) & 0xffffffff) >= (newest + 1 - self.tag0 - self.acked) & 0xffffffff: return  # not outstanding
    self.acked += d + 1
    if self.ping is not None and self.pingn < self.acked: self.ping = None
    if self.acked >= self.nsent:   # the usual wait: everything handed to the socket is processed
      self.chunks.clear()
      self.base, self.held, self.lent, self.first = self.sent, 0, 0, self.nsent
    else: self.drop(self.acked)

  def drop(self, upto:int):
    """Drop the send buffers all of whose requests are numbered below upto."""
    ch = self.chunks
    while ch and ch[0][2] < upto:
      b, lent, last = ch.popleft()
      n = _len(b)
      self.base, self.first = self.base + n, last + 1
      if lent: self.lent -= n
      else: self.held -= n

  def rewind(self, processed:int) -> list:
    """The runner processed this many requests: drop those, and return the bytes of the others that were sent, to send again."""
    if not self.acked <= processed <= self.nsent:
      raise ValueError(f"the runner says it processed {processed} requests; the client sent {self.nsent} and knew {self.acked} processed")
    self.acked = processed
    self.drop(processed)
    k, ci, off = 0, 0, 0   # bytes of the processed - first requests still in the log: found by their frame headers (each in one buffer)
    for _ in range(processed - self.first):
      while off >= _len(self.chunks[ci][0]): off, ci = off - _len(self.chunks[ci][0]), ci + 1
      size = int.from_bytes(memoryview(self.chunks[ci][0])[off:off + 4], "little")
      k, off = k + size, off + size
    while k:
      c = self.chunks[0]
      n = min(k, _len(c[0]))
      if n == _len(c[0]): self.chunks.popleft()
      else: c[0] = memoryview(c[0])[n:]
      self.base, k = self.base + n, k - n
      if c[1]: self.lent -= n
      else: self.held -= n
    self.first = processed
    return [c[0] for c in self.chunks]

def _len(b) -> int: return b.nbytes if isinstance(b, memoryview) else len(b)

def _exchange(r, frame:bytes, rtype:int, name:str) -> dict:
  """One request of the resume handshake on r.sock, and its reply; an Rerror is raised."""
  r.sock.sendall(frame)
  r._bsent, r._nreq, r._nrt, r._nwait = r._bsent + len(frame), r._nreq + 1, r._nrt + 1, r._nwait + 1
  t, f, data = r._recv_frame(time.monotonic() + r.connect_timeout, None)
  if t == P.RERROR:
    raise RunnerError(r.addr, f["code"], data.decode("utf-8", "replace"), f["tag"], name)
  if t != rtype: raise ValueError(f"{P.TYPE_NAMES[t]} in answer to {name}")
  return f

def _attempt(r, rs:Replay, deadline:float) -> list:
  """Connect, handshake and Tresume once; returns the request bytes to send again."""
  key = rs.key
  r.sock = socket.create_connection(parse_addr(r.addr), timeout=max(0.1, min(r.connect_timeout, deadline - time.monotonic())))
  r.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  r._rpos = r._rlen = 0
  r._set_timeout(r.connect_timeout)
  h = _exchange(r, P.pack(P.THELLO, 0, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG), P.RHELLO, "Thello")
  if h["magic"] != P.MAGIC or not h["caps"] & P.CAP_RESUME:
    raise RunnerError(r.addr, P.ERESUME, "the server at this address does not resume sessions (any more)", None, "Tresume")
  if h["caps"] & P.CAP_AUTH:
    cn = os.urandom(P.NONCE_SIZE)
    if r._token is None: raise RunnerError(r.addr, P.EAUTH, "the runner now requires a token; this connection had none", None, "Tauth")
    a = _exchange(r, P.pack(P.TAUTH, 0, cnonce=cn, mac=hmac.new(r._token, AUTH_CLIENT + h["nonce"] + cn, hashlib.sha256).digest()),
                  P.RAUTH, "Tauth")
    if not hmac.compare_digest(a["mac"], hmac.new(r._token, AUTH_SERVER + cn + h["nonce"], hashlib.sha256).digest()):
      raise RunnerError(r.addr, P.EAUTH, "the runner's Rauth mac is wrong: it does not hold the token", None, "Tauth")
  elif r._token is not None:   # as on the first connection (protocol.md, Authentication): nothing to a runner that asks for no token
    raise RunnerError(r.addr, P.EAUTH, "the runner now asks for no token, so it cannot prove it holds ours", None, "Thello")
  cnonce, sent = os.urandom(P.NONCE_SIZE), rs.nsent
  mac = hmac.new(key["secret"], LABEL_CLIENT + h["nonce"] + cnonce + struct.pack("<IQQ", r.info.session, sent, rs.received),
                 hashlib.sha256).digest()
  t = time.perf_counter()
  f = _exchange(r, P.pack(P.TRESUME, 0, session=r.info.session, sent=sent, received=rs.received, cnonce=cnonce, mac=mac),
                P.RRESUME, f"Tresume session={r.info.session}")
  rs.copy_max = copy_max(time.perf_counter() - t)
  if not hmac.compare_digest(f["mac"], hmac.new(key["secret"], LABEL_SERVER + cnonce + h["nonce"], hashlib.sha256).digest()):
    raise RunnerError(r.addr, P.EAUTH, "the runner's Rresume mac is wrong: it does not hold the session's key", None, "Tresume")
  try: return rs.rewind(f["processed"])
  except ValueError as e: raise RunnerError(r.addr, P.ERESUME, str(e), None, "Tresume") from None

def resume(r, why, desc):
  """r's link failed with why: resume the session on a new connection, or raise RunnerConnectionError."""
  rs = r._rs
  if rs.key is None: r._lost(why, desc)   # the runner's key had not arrived: nothing to resume with
  try: r.sock.close()
  except OSError: pass
  grace, why = rs.key["grace"], r._why(why)
  deadline, delay, last = time.monotonic() + grace, 0.05, why
  while True:
    r._rs = None   # the handshake's frames are not the session's stream
    try:
      again = _attempt(r, rs, deadline)
      r._rs = rs
      r._set_timeout(r.timeout)
      for c in again:
        r.sock.sendall(c)
        r._bsent += len(c)
      r._nresume += 1
      return
    except RunnerError as e:
      if e.code != P.ELIMIT:  # refused: the session is gone, or the proof failed
        r.sock.close()
        r.sock, r._rs = None, rs   # nothing more on a handshake that failed (close() would send Tresumekey OFF on it)
        r._lost(f"the link dropped ({why}) and the runner refused to resume the session: {e.code_name}: {e.text}", desc)
      last = e
    except ConnectionRefusedError as e:
      r._rs = rs
      r._lost(f"the link dropped ({why}) and the runner no longer listens ({e}): the session is lost", desc)
    except (OSError, EOFError, ValueError) as e: last = e
    r._rs = rs
    try: r.sock.close()
    except (OSError, AttributeError): pass
    if (left := deadline - time.monotonic()) <= 0:
      r._lost(f"the link dropped ({why}) and the session was not resumed within the runner's {grace} s grace period "
              f"(last attempt: {last})", desc)
    time.sleep(min(delay, left))
    delay = min(2 * delay, 1.0)
