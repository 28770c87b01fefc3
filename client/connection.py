"""One TCP connection to a metal_runner daemon (protocol.md): class Runner (the errors it raises: client/errors.py).

Requests without a reply (alloc, free, write, copy, load, unload, graph, graph_free, and launch/graph_run without wait) are
appended to a send buffer, which is flushed when a waiting call is made (read, sync, ping, launch/graph_run with wait),
after a graph_run (a whole JIT batch, worth starting at once) or once it passes 64 KiB. The runner sends the errors of
such requests just before its next reply, so a waiting call raises the first of them, after consuming its own reply.
Bulk data (write, large program images) is sent from the caller's buffer without copying and read() receives straight
into the caller's memoryview.

When the runner offers CAP_RESUME, a dropped link does not end the session: the Runner reconnects by itself and resumes it
(client/resume.py; protocol.md, Resuming a session), raising RunnerConnectionError only when the runner refuses or its grace
period is over. close() tells the runner the session ends now.

Environment:
  METAL_RUNNER_TIMEOUT     seconds to wait for one reply, and for one send to make progress (default 300)
  METAL_RUNNER_TOKEN_FILE  the token file(s), when no token= is given; unset, ~/.metal_runner_token if it exists: client/settings.py
                           reads it, and the Runner asks it (held_token). A client that holds a token refuses a runner that does not
                           prove it holds the same (protocol.md, Authentication): one that asks for no token may be anyone
"""
from __future__ import annotations
import contextlib, dataclasses, hashlib, hmac, os, re, select, socket, struct, time, weakref
from . import protocol as P
from .protocol import AUTH_CLIENT, AUTH_SERVER
from .address import DEFAULT_PORT, parse_addr, full_addr   # importable from here too
from .errors import RunnerError, RunnerConnectionError, PeerLostError, NotARunnerError, TokenFileError   # importable from here too
from .settings import held_token
# importable from here too: the token files and the user's names for settings were read here before client/settings.py held them
from .settings import DEFAULT_TOKEN_FILE, DEFAULT_SETTING, RUN_OPTIONS, setting, named, token_file, read_token
from .resume import Replay, resume, WINDOW, copy_max
from .progress import uploads

FLUSH_SIZE = 64 * 1024  # flush pipelined requests once the send buffer passes this
COPY_SIZE = 16 * 1024   # smaller payloads are copied into the send buffer, larger ones go out from the caller's memory
# Bulk data goes in frames of at most this size, and reads with this many parts in flight: on loopback, where copies are the whole cost,
# bytes in flight that fit the CPUs' caches move faster than 64 MiB frames (bench/run.py); on a network the depth keeps the pipe full.
# Two parts in flight fill every emulated link of bench/netbench.py as four do; four cost a third of a 64 MiB read when client and runner
# share one CPU (perf-guard), where more bytes in flight only mean more switches between them.
WRITE_FRAME, READ_PART, READ_DEPTH = 512 << 10, 512 << 10, 2
# With a runner that has a cache (CAP_CACHE), writes of CACHE_MIN bytes or more go by content: in CACHE_CHUNK pieces, each named by
# its SHA-256, so a piece the runner already holds costs a 64-byte Twritehash instead of its bytes. METAL_RUNNER_CACHE=0 turns it off.
CACHE_MIN = CACHE_CHUNK = 1 << 20
CACHE_GROUP = 8   # chunks per Thave once a write is under way (write_cached)
# A cached write of PROBE_MIN chunks or more first asks about a sample of PROBE of them: when the runner holds none, the write is taken
# for new content, and its chunks go at once, unhashed, without a Thave each (write_cached, _write_new).
PROBE_MIN, PROBE = 8, 5
HELLO_TAG = int.from_bytes(b"\r\n\r\n", "little")   # the Thello's tag (see _hello)

@dataclasses.dataclass(frozen=True)
class RunnerInfo:
  backend: str      # "cpu" or "metal"
  caps: int         # P.CAP_* bits
  ncores: int       # CPU threads a kernel's core_id ranges over
  memory: int       # bytes a session may allocate in all
  maxbuf: int       # largest single buffer
  maxhandles: int   # handles per namespace per session
  session: int      # session number, as the runner logs it
  name: str         # device name
  arch: str         # "x86_64", "arm64" or the GPU family
  cpu: str          # CPU backends: the -march/-mcpu to compile for; Metal: the runner's macOS "14.5.0" ("": not known)
  features: str     # CPU backends: extra target features "+a,-b"; Metal: the newest Metal language version it has, "3.1"
  maxmsg: int       # the largest frame either side sends on this connection
  unified: bool     # device memory is host memory

def _connect_error(e:OSError, host:str) -> str:
  """Why a connection could not be made, in the same words for every command (run, probe, a program's import)."""
  if isinstance(e, socket.gaierror): return f"the host name {host} does not resolve ({e.strerror})"
  if isinstance(e, ConnectionRefusedError): return "nothing listens on that port"
  if isinstance(e, TimeoutError): return "no answer (timed out): the host is down, or a firewall drops the port"
  return str(e)

def _printable(b:bytes) -> str:
  """The first line of what a peer sent, short and printable, for a message."""
  line = b.split(b"\n", 1)[0].rstrip(b"\r")
  return "".join(chr(c) if 32 <= c < 127 and c != 39 else f"\\x{c:02x}" for c in line[:48]) + ("..." if len(line) > 48 else "")

# Every open Runner of this process: a child made by fork() shares their sockets with the parent, and a frame it sent would land in the
# parent's session. So in the child each is closed (its copy of the descriptor only: the parent's connection stays as it was) and refuses
# further use with a reason that says what to do.
_runners: weakref.WeakSet = weakref.WeakSet()

def _after_fork_in_child():
  global _pool
  _pool = None   # its thread is not in this process: an executor that believes it has one idle would never run the work
  for r in list(_runners):
    if r.sock is not None:
      with contextlib.suppress(OSError): r.sock.close()
      r.sock = None
    if r._dead is None:
      r._dead = (f"this process is a fork of the one that opened the connection to {r.addr}, which it shares: start processes that use "
                 "the runner with multiprocessing's spawn or forkserver method, not fork")
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork_in_child)

_pool = None
def _hasher():
  """The thread that hashes a cached write's chunks ahead of the sending thread (write_cached); started on first use."""
  global _pool
  if _pool is None:
    import concurrent.futures
    _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metal_runner-hash")
  return _pool
def _hash_groups(groups:list, known:list) -> list:
  """Futures of each group's digests (write_cached): the later groups hashed by the hashing thread, ahead of the sender, the first here,
  meanwhile, as the sender needs it at once; here too once the interpreter has shut its thread pools down (a write from a thread that
  outlives the main one, or at exit), when the pool takes no more work. known: each group's digests the caller knows (None: hash it)."""
  import concurrent.futures
  def here(parts, kn):
    f: concurrent.futures.Future = concurrent.futures.Future()
    f.set_result(_digests(parts, kn))
    return f
  def ahead(parts, kn):
    if None not in kn: return here(parts, kn)
    try: return _hasher().submit(_digests, parts, kn)
    except RuntimeError: return here(parts, kn)
  rest = [ahead(parts, kn) for parts, kn in zip(groups[1:], known[1:])]
  return [here(groups[0], known[0]), *rest] if groups else []

def _digests(parts, known) -> list[bytes]:
  # each chunk is copied into a buffer the CPU caches hold and hashed there: on the 2-vCPU VM of docs/cache.md, 1.4 GB/s against 1.1
  # hashing the caller's memory in place (hashing alone leaves the memory's latency unhidden; a copy streams)
  out, tmp = [], bytearray(max((len(c) for c, k in zip(parts, known) if k is None), default=0))
  for c, k in zip(parts, known):
    if k is None:
      tmp[:len(c)] = c
      k = hashlib.sha256(memoryview(tmp)[:len(c)]).digest()
    out.append(k)
  return out

def _nbytes(b) -> int: return b.nbytes if isinstance(b, memoryview) else len(b)

def _describe(d) -> str:
  """Request descriptions are kept as (format, args...) and formatted only when an error needs them."""
  return d if isinstance(d, str) else d[0].format(*d[1:])
_TLOAD = "Tload prog={} ({})"

# Tlaunch is the hot path: one precompiled struct for header + launch record, one per (nbufs, nvals) for the arguments
_TLAUNCH = struct.Struct("<IHHIIIHH3I3I")
_HDR, _HDR_COUNT, _TACK = struct.Struct("<IHHI"), struct.Struct("<IHHII"), struct.Struct("<IHHIIQ")
# the bulk paths: Twrite and Tread share one layout, header + handle[4] offset[8] count[8]
_IO, _TWRITE_DESC, _TREAD_DESC = struct.Struct("<IHHIIQQ"), "Twrite handle={} offset={} count={}", "Tread handle={} offset={} count={}"
_ARGS: dict[tuple[int, int], struct.Struct] = {}
def _args_struct(nbufs:int, nvals:int) -> struct.Struct:
  if (st := _ARGS.get((nbufs, nvals))) is None: st = _ARGS[(nbufs, nvals)] = struct.Struct("<" + "IIQ" * nbufs + "q" * nvals)
  return st

class Runner:
  """A session on one runner, at addr "host:port" (a host alone: port 6667). connect_timeout bounds the TCP connect and the hello/auth
  exchange, timeout (default: METAL_RUNNER_TIMEOUT, else 300 s) each later reply. token is the shared auth token (default: read from the
  file METAL_RUNNER_TOKEN_FILE names for addr, else from ~/.metal_runner_token if it exists); token_source says how the caller's user
  gave it, for messages ("--token-file F"). A client that holds a token refuses a runner that does not prove it holds it too (RunnerError
  EAUTH). Handles are client-chosen: new_handle() gives one for any namespace. Raises ValueError for an address that is not HOST[:PORT],
  TokenFileError for a token file that cannot be used, NotARunnerError when what answers is not a metal_runner."""
  def __init__(self, addr:str, timeout:float|None=None, connect_timeout:float=5.0, token:bytes|str|None=None, cache:bool|None=None,
               token_source:str|None=None):
    hostport, addr = parse_addr(addr), full_addr(addr)
    self.addr, self.sock, self.info, self.maxmsg = addr, None, None, P.DEFAULT_MAXMSG
    self.cache = os.environ.get("METAL_RUNNER_CACHE", "1") != "0" if cache is None else cache
    self.progress = uploads()   # None unless stderr is a terminal: then uploads that take a while show a bar (client/progress.py)
    self._held: set[bytes] = set()    # contents the runner said it holds for this session (Thave): they stay until it ends
    self.timeout = float(os.environ.get("METAL_RUNNER_TIMEOUT", 300)) if timeout is None else float(timeout)
    self.link_faults = 0   # EPEER errors seen: copies or links between runners that failed
    self.link_peers: dict[int, Runner] = {}   # link handle -> the runner at its other end (client/graph.py), to name a lost one
    self._tag, self._handle, self._out, self._dead = 0, 0, bytearray(), None
    self._rbuf, self._rpos, self._rlen = bytearray(65536), 0, 0
    self._rview = memoryview(self._rbuf)
    self._sent: dict[int, str] = {}   # tag -> description, for requests not yet known to be done (in send order)
    self._skip: set[int] = set()      # tags whose reply or error nobody waits for any more
    self._names: dict[int, str] = {}  # prog -> kernel name, for error messages
    self._failed: set[int] = set()    # programs whose Tload the runner rejected: nothing to unload
    # counters for stats(); _rtmark is the request count when the last round trip began (see stats)
    self._nreq = self._nrt = self._nwait = self._rtmark = self._bsent = self._brecv = self._nresume = 0
    self._rs: Replay|None = None      # with CAP_RESUME: what a resume after a dropped link needs (client/resume.py)
    self._stash: list = []            # errors read while waiting for a resume-window Tping, for the next waiting call
    self.connect_timeout = connect_timeout
    self._token, self._token_from = held_token(token, token_source, addr)
    try: self.sock = socket.create_connection(hostport, timeout=connect_timeout)
    except OSError as e: raise RunnerConnectionError(addr, f"cannot connect: {_connect_error(e, hostport[0])}") from None
    _runners.add(self)
    try:
      self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      self.timeout, timeout = connect_timeout, self.timeout  # hello and auth are part of connecting
      self._hello()
      self.timeout = timeout
      self._set_timeout(timeout)  # from now on the kernel enforces it; the connect timeout no longer applies
    except BaseException:
      self.close()
      raise

  def _set_timeout(self, seconds:float):
    """Blocking socket, with the kernel enforcing the timeout on each send and recv (SO_SNDTIMEO, SO_RCVTIMEO)."""
    self.sock.settimeout(None)
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO): self.sock.setsockopt(socket.SOL_SOCKET, opt, tv)

  def __repr__(self): return f"<Runner {self.addr} {self.info.backend if self.info else '?'}{' closed' if self._dead else ''}>"
  def __enter__(self): return self
  def __exit__(self, *exc): self.close()

  def close(self):
    """Close the connection. Requests still in the send buffer are dropped; call sync() first to see their errors."""
    if self._dead is None and self._rs is not None and self.sock is not None:
      # a resumable session would otherwise wait out its grace period on the runner: say this close is meant
      try:
        self.sock.sendall(P.pack(P.TRESUMEKEY, 0, mode=P.RESUME_OFF))
        self._nreq, self._bsent = self._nreq + 1, self._bsent + P.MSGS[P.TRESUMEKEY].size
      except OSError: pass
    if self._dead is None: self._dead = "the connection was closed by the client"
    if self.sock is not None:
      try: self.sock.close()
      except OSError: pass
      self.sock = None

  # *** the session ***

  def _hello(self):
    # The Thello's tag is "\r\n\r\n", so a line-based server (HTTP, SMTP, ...) reached by mistake answers at once (protocol.md,
    # Thello); the tags after it count from 1 as before.
    self._tag = HELLO_TAG - 1
    try: f = self._wait(self._send(P.THELLO, "Thello", magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG), P.RHELLO)
    except RunnerConnectionError as e: raise self._not_a_runner(e) from None
    finally: self._tag = 1
    if f["magic"] != P.MAGIC or f["version"] != P.VERSION or f["maxmsg"] < P.MIN_MAXMSG:
      self.close()
      raise NotARunnerError(self.addr, f"is not a metal_runner version {P.VERSION} (its Rhello has magic {f['magic']:#x}, version "
                                       f"{f['version']}, maxmsg {f['maxmsg']})")
    self.maxmsg = min(P.DEFAULT_MAXMSG, f["maxmsg"])
    self.info = RunnerInfo(P.BACKENDS.get(f["backend"], f"backend {f['backend']}"), f["caps"], f["ncores"], f["memory"], f["maxbuf"],
                           f["maxhandles"], f["session"], P.cstr(f["name"]), P.cstr(f["arch"]), P.cstr(f["cpu"]),
                           P.cstr(f["features"]), self.maxmsg, bool(f["caps"] & P.CAP_UNIFIED))
    if f["caps"] & P.CAP_AUTH: self._auth(f["nonce"])
    elif self._token is not None:   # it asks for no token, so it cannot prove it holds ours: send it nothing
      self.close()
      self._dead = "the runner did not authenticate"
      raise RunnerError(self.addr, P.EAUTH, f"the runner did not authenticate: it asks for no token, so it cannot prove it holds ours "
                        f"({self._token_from}). It is an impostor, or a runner started without --token-file: start it with "
                        f"--token-file and the same token, or connect to it without one", None, "Thello")
    if f["caps"] & P.CAP_RESUME:  # the resume key, before anything a dropped link could lose (one round trip while connecting)
      self._rs, t = Replay((self._tag + 1) & 0xffffffff), time.perf_counter()
      try:
        self._wait(self._small(P.TRESUMEKEY, _HDR_COUNT, "Tresumekey", P.RESUME_ON), P.RRESUMEKEY)
        self._rs.copy_max = copy_max(time.perf_counter() - t)
      except RunnerError as e:
        if e.code in P.FATAL_ERRORS: raise
        self._rs = None   # e.g. ENOMEM for the runner's reply log: a session like any other, ended by a dropped link

  def _auth(self, snonce:bytes):
    if (token := self._token) is None:
      raise RunnerError(self.addr, P.EAUTH, "the runner requires a token: pass token= or set METAL_RUNNER_TOKEN_FILE to the runner's "
                        "token file (the file its --token-file names), or save that file as ~/.metal_runner_token", None, "Tauth")
    cnonce = os.urandom(P.NONCE_SIZE)
    mac = hmac.new(token, AUTH_CLIENT + snonce + cnonce, hashlib.sha256).digest()
    try: f = self._wait(self._send(P.TAUTH, "Tauth", cnonce=cnonce, mac=mac), P.RAUTH)
    except RunnerError as e:
      if e.code == P.EAUTH:   # say which token: the runner cannot
        e.text = f"{e.text}: the runner refused the token from {self._token_from}; use the runner's token (the file its --token-file names)"
      raise
    # the runner proves it holds the token too, so a client never ships kernels or data to an impostor
    if not hmac.compare_digest(f["mac"], hmac.new(token, AUTH_SERVER + cnonce + snonce, hashlib.sha256).digest()):
      self.close()
      self._dead = "the runner failed to prove it holds the token"
      raise RunnerError(self.addr, P.EAUTH, f"the runner's Rauth mac is wrong: it does not hold the token from {self._token_from} (an "
                        "impostor, or a runner with another token)", None, "Tauth")

  def _not_a_runner(self, e:RunnerConnectionError) -> RunnerConnectionError:
    """A connection that failed before its Rhello: say what the peer did, which is all there is to know about what it is."""
    got, cause = bytes(self._rbuf[:self._rlen]), e.__context__   # _lost raises while handling the cause
    if got: return NotARunnerError(self.addr, f"is not a metal_runner (it answered '{_printable(got)}')")
    if isinstance(cause, (TimeoutError, BlockingIOError)):
      return NotARunnerError(self.addr, f"accepted the connection but never answered the handshake within {self.timeout:g} s "
                                        "(connect_timeout): probably not a metal_runner")
    if isinstance(cause, (EOFError, ConnectionResetError, BrokenPipeError)):   # a reset: it closed with our Thello unread
      return NotARunnerError(self.addr, "closed the connection without answering the handshake: probably not a metal_runner "
                                        "(a runner that refuses a connection says why)")
    return e

  def new_handle(self) -> int:
    self._handle += 1
    return self._handle

  def stats(self) -> dict[str, int]:
    """This connection's totals since it opened (hello and auth included):
      requests        frames sent
      replies         replies waited for (each R-message or Rerror a call blocked on)
      round_trips     waits that had to send a request and block for its answer: a call that flushes the requests queued since the
                      last reply and then blocks on the socket. The later parts of a split read (sent together with the first, so
                      already in flight) wait without adding one: a round trip is the link's latency paid once, not a reply
      bytes_sent      bytes written to the socket
      bytes_received  bytes read from the socket
      resumes         times the session was resumed on a new connection after the link dropped (client/resume.py); the resume
                      handshakes and what was sent again on them are counted above too
    Requests without a reply (alloc, write, launch and graph_run without wait, ...) cost none: they ride with the next flush."""
    return {"round_trips": self._nrt, "requests": self._nreq, "replies": self._nwait, "bytes_sent": self._bsent, "bytes_received": self._brecv,
            "resumes": self._nresume}

  # *** requests ***

  def alloc(self, h:int, size:int): self._send(P.TALLOC, f"Talloc handle={h} size={size}", handle=h, bufsize=size)
  def free(self, h:int): self._send(P.TFREE, f"Tfree handle={h}", handle=h)
  def copy(self, dst:int, dstoff:int, src:int, srcoff:int, count:int):
    self._send(P.TCOPY, f"Tcopy dst={dst}+{dstoff} src={src}+{srcoff} count={count}", dst=dst, src=src, dstoff=dstoff, srcoff=srcoff, count=count)

  def write(self, h:int, offset:int, data, at:int=0, known=None) -> list[tuple[int, int, bytes]]|None:
    """Copy data (bytes-like) into buffer h at offset, in frames of at most WRITE_FRAME bytes; large data is not copied.
    With a runner cache, large data goes by content (write_cached; at, known and what it returns are its)."""
    mv, step = memoryview(data).cast("B"), min(WRITE_FRAME, self.maxmsg - P.MSGS[P.TWRITE].size)
    if len(mv) < COPY_SIZE:   # one small frame, copied into the send buffer: nothing of the caller's memory is kept
      self._send(P.TWRITE, (_TWRITE_DESC, h, offset, len(mv)), 0, [mv], handle=h, offset=offset, count=len(mv))
      return None
    if self.progress is None: return self._write(h, offset, mv, step, at, known)
    with self.progress.write(self, len(mv)): return self._write(h, offset, mv, step, at, known)

  def _write(self, h:int, offset:int, mv:memoryview, step:int, at:int=0, known=None) -> list[tuple[int, int, bytes]]|None:
    if self.cache and len(mv) >= CACHE_MIN and self.info.caps & P.CAP_CACHE: return self.write_cached(h, offset, mv, at=at, known=known)
    with self._lending():
      for i in range(0, max(len(mv), 1), step):
        c = mv[i:i+step]
        if len(c) >= COPY_SIZE: self._send_bulk(c, h, offset + i)
        else: self._send(P.TWRITE, (_TWRITE_DESC, h, offset + i, len(c)), 0, [c], handle=h, offset=offset+i, count=len(c))
    return None

  def write_cached(self, h:int, offset:int, data, chunk:int=CACHE_CHUNK, at:int=0, known=None) -> list[tuple[int, int, bytes]]:
    """Write data by content: each chunk the runner holds goes as a Twritehash, each other one as a Twrite that the runner also keeps
    (FCACHE). Chunks go in groups (1, 2, 4, then CACHE_GROUP chunks): a thread hashes the groups ahead (hashlib lets go of the GIL) while
    this one sends, and each group's Thave goes out before the previous group's data, so its Rhave is back when that data has gone and
    the link never waits for a hash or a round trip but the first. A group whose chunks this session has seen held asks nothing.
    at: where data starts in its source (a file): chunks are cut at the source's multiples of the chunk size, so the same bytes are
    the same chunks whichever range of the file is written; known(pos, length): a chunk's digest the caller recorded (None: hashed
    here). Returns each chunk's (pos, length, digest), pos in the source, for the caller to record (client/file_digests.py)."""
    mv, chunk = memoryview(data).cast("B"), min(chunk, self.maxmsg - P.MSGS[P.TWRITE].size)
    cuts = [0, *range(-at % chunk or chunk, len(mv), chunk)] if len(mv) else []
    parts = [mv[a:b] for a, b in zip(cuts, [*cuts[1:], len(mv)])]
    groups, a, g = [], 0, 1
    while a < len(parts): groups, a, g = groups + [(a, min(a + g, len(parts)))], a + g, min(2 * g, CACHE_GROUP)
    kn = [None] * len(parts) if known is None else [known(at + c, len(p)) for c, p in zip(cuts, parts)]
    if self._none_held(parts, kn): return self._write_new(h, offset, parts, cuts, kn, at)
    hashes = _hash_groups([parts[a:b] for a, b in groups], [kn[a:b] for a, b in groups])
    asked: list[tuple[int, list[bytes]]|None] = [None] * len(groups)   # each group's Thave: its tag and what it asked; None: nothing
    try:
      with self._lending():
        if groups: asked[0] = self._ask(hashes[0].result())
        for k, (a, b) in enumerate(groups):
          if k + 1 < len(groups): asked[k + 1] = self._ask(hashes[k + 1].result())
          if (q := asked[k]) is not None: self._held.update(d for d, x in zip(q[1], self._wait(q[0], P.RHAVE)["data"]) if x == 1)
          for i, (c, d) in enumerate(zip(parts[a:b], hashes[k].result()), a):
            if d in self._held:
              self._send(P.TWRITEHASH, ("Twritehash handle={} offset={} count={}", h, offset+cuts[i], len(c)), handle=h,
                         offset=offset+cuts[i], count=len(c), hash=d)
            else: self._send(P.TWRITE, (_TWRITE_DESC, h, offset+cuts[i], len(c)), P.FCACHE, [c], handle=h, offset=offset+cuts[i], count=len(c))
    except BaseException:
      for f in hashes: f.cancel()
      self._skip.update(q[0] for q in asked if q is not None and q[0] in self._sent)
      raise
    return [(at + c, len(p), d) for c, p, d in zip(cuts, parts, (d for f in hashes for d in f.result()))]

  def _none_held(self, parts:list, kn:list) -> bool:
    """Whether a cached write of PROBE_MIN chunks or more looks all new to the runner: it holds none of PROBE chunks spread evenly over
    it, the first and the last among them (a run of a file that moved between runners keeps most of its chunks). The sample's digests
    that were not known are computed here, into kn."""
    if len(parts) < PROBE_MIN: return False
    sample = sorted({round(i * (len(parts) - 1) / (PROBE - 1)) for i in range(PROBE)})
    new = [i for i in sample if kn[i] is None]
    for i, d in zip(new, _digests([parts[i] for i in new], [None] * len(new))): kn[i] = d
    return not any(self.have([kn[i] for i in sample]))

  def _write_new(self, h:int, offset:int, parts:list, cuts:list, kn:list, at:int) -> list[tuple[int, int, bytes]]:
    """write_cached's chunks when the runner holds none of them (_none_held): each a Twrite with FCACHE, sent at once, none hashed
    here (hashing would save no byte: the host hashes a chunk only where that can save sending it, which a later write of the same
    bytes finds, as the runner then holds them). Returns the digests that are known, for the caller to record."""
    with self._lending():
      for i, c in enumerate(parts):
        self._send(P.TWRITE, (_TWRITE_DESC, h, offset+cuts[i], len(c)), P.FCACHE, [c], handle=h, offset=offset+cuts[i], count=len(c))
    return [(at + c, len(p), d) for c, p, d in zip(cuts, parts, kn) if d is not None]

  def _ask(self, digests:list[bytes]) -> tuple[int, list[bytes]]|None:
    """Send a Thave, not waited for, about those of digests not known held: its tag and what it asks; None if there is nothing to ask."""
    if not (ask := [d for d in dict.fromkeys(digests) if d not in self._held]): return None
    return self._send(P.THAVE, ("Thave count={}", len(ask)), 0, [b"".join(ask)], count=len(ask)), ask

  def have(self, digests:list[bytes]) -> list[bool]:
    """Thave: which of these contents (SHA-256 digests) the runner holds. Those it holds stay available to this session."""
    held, step = [], (self.maxmsg - P.MSGS[P.THAVE].size) // P.HASH_SIZE
    for i in range(0, len(digests), step):
      part = digests[i:i+step]
      f = self._wait(self._send(P.THAVE, ("Thave count={}", len(part)), 0, [b"".join(part)], count=len(part)), P.RHAVE)
      held += [b == 1 for b in f["data"]]
    self._held.update(d for d, x in zip(digests, held) if x)
    return held

  def read(self, h:int, offset:int, dest):
    """Fill dest (a writable bytes-like object) from buffer h at offset; waits. A large read goes in parts of READ_PART bytes with
    READ_DEPTH in flight: the pipe stays full (one round trip), and the bytes in flight stay within the CPUs' caches, which on
    loopback is much faster than one large Rread. In a resumable session each part of more than RREAD_INLINE bytes is acknowledged
    (Tack, riding with the next request) once it arrived, so that the runner, which keeps an Rread's data by reference to the buffer
    to send it again after a dropped link, lets go of it before anything can change the buffer. A runner without CAP_ACK keeps only
    its last Rresumekey.log bytes of replies: there parts are at most a quarter of that, two in flight."""
    if self.progress is not None: self.progress.stop()
    mv, rs = memoryview(dest).cast("B"), self._rs
    step, depth, ack = min(READ_PART, self.maxmsg - P.MSGS[P.RREAD].size), READ_DEPTH, False
    if rs is not None:
      if not (ack := bool(self.info.caps & P.CAP_ACK)):
        if rs.key is None: self.ping()   # learn the runner's reply log, once
        step, depth = min(step, max(4096, rs.key["log"] // 4)), 2
      # settle the resume window first (an upload may have left it open): a window Rping must never be waited for behind an Rread
      if rs.ping is not None or rs.held > WINDOW: self.ping()
    parts, tags, k = [mv[i:i+step] for i in range(0, max(len(mv), 1), step)], [], 0
    try:
      for i, c in enumerate(parts):
        tags.append(self._small(P.TREAD, _IO, (_TREAD_DESC, h, offset + i * step, len(c)), h, offset + i * step, len(c)))
        while k < len(parts) and (k <= i - depth + 1 or i == len(parts) - 1):   # the pipe is full, or all parts are out: take the oldest
          if k: self._rtmark = self._nreq   # its reply was on its way before the later Treads went out: no new round trip
          self._wait(tags[k], P.RREAD, parts[k])
          if ack and len(parts[k]) > P.RREAD_INLINE: self._small(P.TACK, _TACK, "Tack", 0, rs.received)
          k += 1
    except RunnerError as e:
      self._skip.update(t for t in tags if t != e.tag and t in self._sent)
      raise

  def load(self, prog:int, kind:int, name:str, data, nbufs:int, nvals:int, corearg:int=P.NO_CORE, entry:int=0, arch:int=0):
    nm, data = name.encode(), memoryview(data).cast("B")
    self._names[prog] = name
    with self._lending():
      self._send(P.TLOAD, (_TLOAD, prog, name), 0, [nm, data], prog=prog, kind=kind, arch=arch, nbufs=nbufs, nvals=nvals,
                 corearg=corearg, entry=entry, crc=P.crc32(data), namelen=len(nm), datalen=len(data))

  def unload(self, prog:int):
    """Release program prog. One whose Tload failed (the error was raised already) holds nothing on the runner: no request is sent."""
    if prog in self._failed: self._failed.discard(prog)
    else: self._send(P.TUNLOAD, f"Tunload prog={prog} ({self._names.get(prog, '?')})", prog=prog)
    self._names.pop(prog, None)

  def launch(self, prog:int, bufs, vals, global_size=(1, 1, 1), local_size=(1, 1, 1), wait:bool=False) -> float|None:
    """Run kernel prog over bufs [(handle, offset)] and integer vals; with wait, block and return the device time in seconds."""
    if self._dead is not None: self._check(f"Tlaunch prog={prog}")
    nb, nv = len(bufs), len(vals)
    if nb + nv > P.MAX_ARGS: raise RunnerError(self.addr, P.EINVAL, f"{nb + nv} kernel arguments, more than {P.MAX_ARGS}", None, "Tlaunch")
    g, l = (global_size if len(global_size) == 3 else P.dims(global_size)), (local_size if len(local_size) == 3 else P.dims(local_size))
    tag = self._tag = (self._tag + 1) & 0xffffffff
    self._nreq += 1
    self._sent[tag] = ("Tlaunch prog={} ({})", prog, self._names.get(prog, "?"))
    flat = [x for b in bufs for x in (b[0], 0, b[1])]
    self._out += _TLAUNCH.pack(_TLAUNCH.size + 16 * nb + 8 * nv, P.TLAUNCH, P.FWAIT if wait else 0, tag, 0, prog, nb, nv, *g, *l)
    self._out += _args_struct(nb, nv).pack(*flat, *vals)
    if wait: return self._wait(tag, P.RLAUNCH)["ns"] * 1e-9
    if len(self._out) > FLUSH_SIZE: self._flush(self._sent[tag])
    return None

  def graph(self, gid:int, records):
    """Define graph gid from launch records [(prog, bufs, vals, global_size, local_size)]."""
    body = b"".join(P.launch_record(*r) for r in records)
    self._send(P.TGRAPH, f"Tgraph graph={gid} ({len(records)} kernels)", 0, [body], graph=gid, count=len(records))

  def graph_run(self, gid:int, patches=(), wait:bool=False, body:tuple[bytes, int]|None=None, flush:bool=True) -> float|None:
    """Apply patches [(entry, kind, index, handle, value)] (they persist) and run graph gid; with wait, return seconds. body: the patches
    already packed, (bytes, count). flush=False: queued, for a caller that starts several runners' graphs at once (flush())."""
    data, count = body if body is not None else (b"".join(P.patch(*p) for p in patches), len(patches))
    tag = self._send(P.TGRAPHRUN, ("Tgraphrun graph={}", gid), P.FWAIT if wait else 0, [data], graph=gid, count=count)
    if wait: return self._wait(tag, P.RGRAPHRUN)["ns"] * 1e-9
    # a graph is a whole JIT batch: send it now, so the runner works (and a slow link carries it) while the program prepares the next
    if flush: self._flush(self._sent[tag])
    return None

  def flush(self):
    """Send what is queued now."""
    if self._out: self._flush("queued requests")

  def grant(self, h:int, offset:int, count:int, ttl:int=60) -> tuple[int, bytes]:
    """A one-time grant for another runner to write count bytes into buffer h at offset, for ttl seconds: (grant, secret).
    Pass both to the source runner's peer_send (protocol.md, Copies between runners)."""
    f = self._wait(self._send(P.TGRANT, f"Tgrant handle={h} offset={offset} count={count}", handle=h, ttl=ttl, offset=offset, count=count),
                   P.RGRANT)
    return f["grant"], f["secret"]

  def peer_send(self, h:int, offset:int, count:int, host:str, port:int, grant:int, secret:bytes) -> float:
    """Send count bytes of buffer h at offset straight to the runner at host:port, into the range of its grant; waits until that runner
    has them and returns the seconds it took. RunnerError EPEER: this runner cannot reach that one (copy through the host instead)."""
    hb = host.encode()
    tag = self._send(P.TPEERSEND, f"Tpeersend handle={h} offset={offset} count={count} to {host}:{port}", 0, [hb], handle=h, port=port,
                     hostlen=len(hb), offset=offset, count=count, grant=grant, secret=secret)
    return self._wait(tag, P.RPEERSEND)["ns"] * 1e-9

  def listen(self, link:int, ttl:int=60) -> tuple[int, bytes]:
    """Link `link` of this session will receive from the one runner that dials it with the returned (grant, secret) within ttl seconds
    (protocol.md, Links between runners)."""
    f = self._wait(self._send(P.TLISTEN, f"Tlisten link={link}", link=link, ttl=ttl), P.RLISTEN)
    return f["grant"], f["secret"]

  def dial(self, link:int, host:str, port:int, grant:int, secret:bytes) -> float:
    """Link `link` of this session sends to the session at host:port that issued the grant (Tlisten); returns the seconds the connection
    took. RunnerError EPEER: this runner cannot reach that one."""
    hb = host.encode()
    tag = self._send(P.TDIAL, f"Tdial link={link} to {host}:{port}", 0, [hb], link=link, port=port, hostlen=len(hb), grant=grant, secret=secret)
    return self._wait(tag, P.RDIAL)["ns"] * 1e-9

  def unlink(self, link:int): self._send(P.TUNLINK, f"Tunlink link={link}", link=link)
  def graph_free(self, gid:int): self._send(P.TGRAPHFREE, f"Tgraphfree graph={gid}", graph=gid)
  def sync(self): self._wait(self._small(P.TSYNC, _HDR, "Tsync"), P.RSYNC)

  def ping(self, data=b"") -> bytes:
    if len(data) >= COPY_SIZE: return self._wait(self._send(P.TPING, ("Tping count={}", len(data)), 0, [data], count=len(data)), P.RPING)["data"]
    tag = self._small(P.TPING, _HDR_COUNT, ("Tping count={}", len(data)), len(data))
    self._out += data
    return self._wait(tag, P.RPING)["data"]

  def clock(self) -> tuple[int, int, int]:
    """One Tclock, with nothing else in flight: (host perf_counter_ns when sent, the runner's profile clock, host ns when the Rclock
    arrived). protocol.md, Tclock: the runner clock was read within that interval."""
    self._flush("Tclock")
    tag = self._small(P.TCLOCK, _HDR, "Tclock")
    t0 = time.perf_counter_ns()
    f = self._wait(tag, P.RCLOCK)
    return t0, f["clock"], time.perf_counter_ns()

  def profile(self, mode:int, count:int=0xffffffff) -> tuple[list[dict], int, int, int]:
    """One Tprofile (it waits for the session's work, as sync does): ([P.PROF records], left, lost, cap)."""
    f = self._wait(self._send(P.TPROFILE, f"Tprofile mode={mode}", mode=mode, count=count), P.RPROFILE)
    return [P.PROF.unpack(f["data"], P.PROF.size * i) for i in range(f["count"])], f["left"], f["lost"], f["cap"]

  def _small(self, type:int, st:struct.Struct, desc, *fields) -> int:
    """Queue a request of no payload but Tping's, with a precompiled struct of its fixed part (the waiting requests' hot path)."""
    if self._dead is not None: self._check(desc)
    tag = self._tag = (self._tag + 1) & 0xffffffff
    self._nreq += 1
    self._sent[tag] = desc
    self._out += st.pack(st.size + (fields[0] if type == P.TPING else 0), type, 0, tag, *fields)
    return tag

  # *** frames ***

  def _check(self, desc):
    if self._dead is not None: raise RunnerConnectionError(self.addr, f"the connection is unusable: {self._dead}", _describe(desc))

  def _why(self, why) -> str:
    """What happened to the link, in words: why is an exception (an EOFError's str() is empty) or text."""
    if isinstance(why, (TimeoutError, BlockingIOError)):
      return f"no reply within {self.timeout:g} s ({'connect_timeout' if self.info is None else 'METAL_RUNNER_TIMEOUT'})"
    if isinstance(why, EOFError): return "the runner closed the connection"
    if isinstance(why, OSError): return f"connection failed: {why}"
    return str(why)   # e.g. the ValueError of a malformed frame: RunnerConnectionError's text is a str

  def _lost(self, why, desc, errors=()):
    """The connection is dead: say why (an exception or text), with the request in flight, and refuse all further use."""
    why = self._why(why)
    if errors: why = f"{why}, after reporting {errors[0].request}: {errors[0].code_name}: {errors[0].text}"
    desc = _describe(desc) if desc else None
    self.close()
    self._dead = f"{why} (during {desc})" if desc else str(why)
    raise RunnerConnectionError(self.addr, why, desc)

  def _send(self, type:int, desc, flags:int=0, parts=(), **fields) -> int:
    """Queue a request (fixed part + payload parts); returns its tag. Large parts are sent at once, uncopied."""
    self._check(desc)
    parts = [p if isinstance(p, bytes) else memoryview(p).cast("B") for p in parts]   # memoryviews other than of bytes: lent (_release)
    n = sum(_nbytes(p) for p in parts)
    if P.MSGS[type].size + n > self.maxmsg:
      raise RunnerError(self.addr, P.ELIMIT, f"a {P.MSGS[type].size + n}-byte frame is over this connection's maxmsg {self.maxmsg}", None,
                        _describe(desc))
    tag = self._open(desc)
    self._out += P.pack(type, tag, flags, n, **fields)
    bufs = []
    for p in parts:
      if _nbytes(p) < COPY_SIZE: self._out += p
      else: bufs, self._out = bufs + [self._out, p], bytearray()
    if bufs: self._sendv(bufs + [self._out], desc)
    elif len(self._out) > FLUSH_SIZE: self._flush(desc)
    if self._rs is not None and self._rs.held > WINDOW: self._window()
    return tag

  def _open(self, desc) -> int:
    """A new request's tag, counted and remembered (_small and launch do the same inline: they are the hot paths)."""
    tag = self._tag = (self._tag + 1) & 0xffffffff
    self._nreq += 1
    self._sent[tag] = desc
    return tag

  def _send_bulk(self, data:memoryview, h:int, offset:int) -> int:
    """_send of one Twrite whose data (at least COPY_SIZE bytes, within maxmsg) goes out from the caller's memory: the bulk path."""
    desc = (_TWRITE_DESC, h, offset, n := data.nbytes)
    if self._dead is not None: self._check(desc)
    tag = self._open(desc)
    self._out += _IO.pack(_IO.size + n, P.TWRITE, 0, tag, h, offset, n)
    self._sendv([self._out, data], desc)
    if self._rs is not None and self._rs.held > WINDOW: self._window()
    return tag

  @contextlib.contextmanager
  def _lending(self):
    """Around a method that sends the caller's memory: the resume log may refer to it only until the method returns (_release)."""
    try: yield
    except BaseException:
      self._release(failed=True)
      raise
    self._release()

  def _release(self, failed:bool=False):
    """The calling method returns, and its caller may then change the memory it passed: the requests still in the resume log that point
    into it are copied when that is cheaper than a round trip (Replay.copy_max), else the runner is asked to confirm them first. A
    method that failed (or was interrupted) copies them: it must not wait on a stream in an unknown state."""
    rs = self._rs
    if rs is None or not rs.lent: return
    if not failed and self._dead is None and rs.lent > rs.copy_max:
      self._wait(self._small(P.TPING, _HDR_COUNT, "Tping (resume log)", 0), P.RPING, stash=True)
    rs.own()

  def _window(self):
    """The resume log passed WINDOW bytes of its own: ask the runner how far it got with a Tping, and past twice that wait for its Rping."""
    rs = self._rs
    if rs.ping is None:
      rs.ping = self._small(P.TPING, _HDR_COUNT, "Tping (resume window)", 0)
      rs.pingn = rs.issued(rs.ping) - 1
      self._skip.add(rs.ping)
      self._flush("Tping (resume window)")
    elif rs.held > 2 * WINDOW:
      tag = rs.ping
      self._skip.discard(tag)
      self._wait(tag, P.RPING, stash=True)

  def _flush(self, desc):
    if self._out: self._sendv([self._out], desc)

  def _sendv(self, bufs, desc):
    self._out = bytearray()
    if self._rs is not None:
      if len(bufs) == 1: self._rs.sent_own(bufs[0], self._tag)
      else: self._rs.log(bufs, self._tag)
    try:
      if len(bufs) == 1:  # the usual flush: one buffer of queued requests
        self.sock.sendall(bufs[0])
        self._bsent += len(bufs[0])
        return
      views = [memoryview(b).cast("B") for b in bufs if _nbytes(b)]
      while views:
        n = self.sock.sendmsg(views[:512])
        self._bsent += n
        while n:
          if n >= views[0].nbytes: n -= views.pop(0).nbytes
          else: views[0], n = views[0][n:], 0
    except OSError as e:
      # the runner may have said why before closing (EPROTO, ECRASH): report that rather than a broken pipe
      rs, self._rs = self._rs, None   # what it reads here is read again after a resume
      why = self._last_words()
      self._rs = rs
      if why is None and rs is not None and rs.key is not None and not isinstance(e, (TimeoutError, BlockingIOError)):
        return resume(self, e, desc)   # the bytes are in the resume log: they go again
      self._lost(why or e, desc)

  def _last_words(self) -> str|None:
    try:
      self._set_timeout(0.5)
      deadline = time.monotonic() + 0.5
      while True:
        t, f, data = self._recv_frame(deadline, None)
        if t == P.RERROR and (f["code"] in P.FATAL_ERRORS or f["tag"] == 0):
          return f"{P.ERRORS.get(f['code'], f['code'])}: {data.decode('utf-8', 'replace')}"
    except Exception: return None

  # Replies are read through a read-ahead buffer, so a small reply costs one recv; Rread data beyond what the buffer
  # holds goes straight into the caller's memory. The socket blocks, with SO_RCVTIMEO/SO_SNDTIMEO set once (see _hello):
  # a Python socket timeout would cost an ioctl and a poll per call.

  def _recv_some(self, view:memoryview, deadline:float) -> int:
    if time.monotonic() > deadline: raise TimeoutError
    try: n = self.sock.recv_into(view)
    except BlockingIOError: raise TimeoutError from None  # SO_RCVTIMEO passed
    if n == 0: raise EOFError
    self._brecv += n
    return n

  def _fill(self, n:int, deadline:float) -> memoryview:
    """Make n bytes available at the read position; returns a view of them (valid until the next fill)."""
    while self._rlen - self._rpos < n:
      if self._rpos and (self._rlen == len(self._rbuf) or len(self._rbuf) - self._rpos < n):  # compact
        self._rbuf[:self._rlen - self._rpos] = self._rbuf[self._rpos:self._rlen]
        self._rlen, self._rpos = self._rlen - self._rpos, 0
      if len(self._rbuf) < n:
        self._rview.release()   # a bytearray with a view cannot grow
        self._rbuf.extend(bytes(n - len(self._rbuf)))
        self._rview = memoryview(self._rbuf)
      self._rlen += self._recv_some(memoryview(self._rbuf)[self._rlen:], deadline)
    return memoryview(self._rbuf)[self._rpos:self._rpos + n]

  def _take_into(self, view:memoryview, deadline:float):
    """Fill view with the next bytes of the stream: first what is buffered, then straight from the socket."""
    k = min(view.nbytes, self._rlen - self._rpos)
    view[:k] = memoryview(self._rbuf)[self._rpos:self._rpos + k]
    self._rpos += k
    view = view[k:]
    while view.nbytes: view = view[self._recv_some(view, deadline):]

  def _recv_frame(self, deadline:float, dest:dict|None) -> tuple[int, dict, bytes|None]:
    """Read one frame from the runner, checked like the runner checks ours. Rread data goes into dest[tag] if given."""
    if self._rlen - self._rpos < P.HDR_SIZE: self._fill(P.HDR_SIZE, deadline)
    size, t, _, tag = _HDR.unpack_from(self._rbuf, self._rpos)
    if (m := P.MSGS.get(t)) is None or P.is_request(t) or not m.size <= size <= self.maxmsg:
      raise ValueError(f"malformed frame from the runner: type {t}, size {size}")
    if self._rlen - self._rpos < m.size: self._fill(m.size, deadline)
    f = m.unpack(self._rbuf, self._rpos)
    self._rpos += m.size
    if m.size + (n := P.payload_len(t, f)) != size: raise ValueError(f"malformed {m.name} from the runner: size {size} but count {n}")
    if t == P.RREAD and dest is not None and tag in dest:
      if n != dest[tag].nbytes: raise ValueError(f"Rread of {n} bytes for a Tread of {dest[tag].nbytes}")
      self._take_into(dest[tag], deadline)
      data = None
    elif n == 0: data = b""
    else:
      buf = bytearray(n)
      self._take_into(memoryview(buf), deadline)
      data = bytes(buf)
    if self._rs is not None: self._rs.frame(t, size, tag, f, self._tag)
    return t, f, data

  def _wait(self, tag:int, rtype:int, dest:memoryview|None=None, stash:bool=False) -> dict:
    """Flush, then read frames up to the reply to tag; raise the first error of this or any earlier request (with stash, keep
    them for the next waiting call instead). A dropped link is resumed on the way when the session allows it (client/resume.py)."""
    desc = self._sent.get(tag) or f"tag {tag}"
    if self._out: self._flush(desc)
    self._nwait += 1
    if self._rtmark != self._nreq: self._nrt, self._rtmark = self._nrt + 1, self._nreq
    errors, deadline, dests = self._stash, time.monotonic() + self.timeout, {tag: dest} if dest is not None else None
    self._stash = []
    while True:
      try:
        # the usual case: nothing buffered and the reply is a fixed-size frame that arrives whole; one recv, no parsing beyond the header
        if self._rpos == self._rlen and dest is None and not errors:
          self._rpos, self._rlen = 0, self._recv_some(self._rview, deadline)
          m = P.MSGS[rtype]
          if self._rlen >= m.size and _HDR.unpack_from(self._rbuf) == (m.size, rtype, 0, tag):
            self._rpos = m.size
            (f := m.unpack(self._rbuf))["data"] = b""
            if self._rs is not None: self._rs.frame(rtype, m.size, tag, f, self._tag)
            self._done(tag)
            return f
        while True:
          t, f, data = self._recv_frame(deadline, dests)
          if t == P.RERROR:
            # tag 0, no request's: the runner's last word on the connection (protocol.md, Metal programs: a lost GPU)
            last = f["tag"] == 0 and 0 not in self._sent
            d = self._sent.get(f["tag"], "the connection" if last else f"tag {f['tag']}")
            e = RunnerError(self.addr, f["code"], data.decode("utf-8", "replace"), None if last else f["tag"], _describe(d))
            if type(d) is tuple and d[0] is _TLOAD: self._failed.add(d[1])
            if e.code in P.FATAL_ERRORS or last:  # the runner closes the connection after these
              e.others = errors
              self.close()
              self._dead = e.reason()
              raise e
          if f["tag"] in self._skip and f["tag"] != tag:  # the reply or error of an abandoned part of a read
            self._skip.discard(f["tag"])
            continue
          if t == P.RERROR:
            errors.append(e)
            if e.code == P.EPEER: self.link_faults += 1   # a link of this session broke (client/graph.py makes new ones)
            if f["tag"] == tag: break
            continue
          if t != rtype or f["tag"] != tag:
            raise ValueError(f"unexpected {P.TYPE_NAMES[t]} with tag {f['tag']} while waiting for the {P.TYPE_NAMES[rtype]} to tag {tag}")
          f["data"] = data
          break
        break
      except RunnerError: raise
      except (TimeoutError, BlockingIOError, ValueError) as e: self._lost(e, desc, errors)
      except (OSError, EOFError) as e:
        if self._rs is None or self._rs.key is None: self._lost(e, desc, errors)
        resume(self, e, desc)   # then read on: the runner sends again what this side had not received whole
      except BaseException:  # interrupted half way through a frame: the stream cannot be trusted any more
        self.close()
        self._dead = f"interrupted while waiting for {_describe(desc)}"
        raise
    self._done(tag)
    if stash: self._stash = errors
    elif errors:
      errors[0].others = errors[1:]
      raise self._blame(errors[0])
    return f

  def _blame(self, e:RunnerError) -> RunnerError:
    """A link's EPEER whose other runner has stopped is that runner's loss, and says so first (PeerLostError); any other error as it is.
    Only on this error path: it may wait half a second for that runner's close to arrive."""
    if e.code != P.EPEER or not self.link_peers or (m:=re.match(r"link (\d+) ", e.text)) is None: return e
    if (peer:=self.link_peers.get(int(m.group(1)))) is None or (why:=peer.gone(0.5)) is None: return e
    return PeerLostError(peer.addr, why, e)

  def gone(self, wait:float=0.0) -> str|None:
    """Why this connection is gone (the runner closed it or it failed), or None while it stands; waits up to `wait` seconds for a close
    to arrive. Reads nothing, so replies and errors not yet taken stay for the next request; a close behind them shows all the same."""
    if self._dead is not None: return self._dead
    try:
      if hasattr(select, "POLLRDHUP"):   # Linux
        p = select.poll()
        p.register(self.sock, select.POLLRDHUP)
        ev = p.poll(int(wait * 1000))
        if ev and ev[0][1] & select.POLLERR: return "it dropped its connection"
        return "it closed its connection" if ev else None
      kq = select.kqueue()                # macOS, BSD: EV_EOF on the read filter (an unread reply ends the wait early)
      try: ev = kq.control([select.kevent(self.sock, select.KQ_FILTER_READ, select.KQ_EV_ADD)], 1, wait)
      finally: kq.close()
      return "it closed its connection" if ev and ev[0].flags & select.KQ_EV_EOF else None
    except (OSError, ValueError) as e: return f"its connection failed: {e}"

  def _done(self, tag:int):
    """Every request up to tag is done now, with or without an error; usually tag is the newest, so this is O(1)."""
    if self._sent and next(reversed(self._sent)) == tag: self._sent.clear()
    elif tag in self._sent:
      it = iter(self._sent)
      for k in it:
        if k == tag: break
      self._sent = {k: self._sent[k] for k in it}
