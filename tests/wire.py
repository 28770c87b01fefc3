"""A raw-frame client for black-box daemon tests: sends exactly the bytes a test builds, reads frames back."""
from __future__ import annotations
import socket, struct, subprocess, zlib
from client import protocol as P
from client.cpu_image import cpu_image

class Raw:
  def __init__(self, addr:str, hello:bool=True, timeout:float=10):
    host, port = addr.rsplit(":", 1)
    self.s = socket.create_connection((host, int(port)), timeout=timeout)
    self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    self.tag = 100
    if hello: self.info = self.hello()

  def send(self, b:bytes): self.s.sendall(b)

  def req(self, type:int, payload:bytes=b"", flags:int=0, **fields) -> int:
    """Send one well-formed request; returns its tag."""
    self.tag += 1
    self.send(P.pack(type, self.tag, flags, payload_len=len(payload), **fields) + payload)
    return self.tag

  def recv_exact(self, n:int) -> bytes:
    b = bytearray()
    while len(b) < n:
      c = self.s.recv(n - len(b))
      if not c: raise EOFError(f"connection closed after {len(b)} of {n} bytes")
      b += c
    return bytes(b)

  def frame(self) -> tuple[int, dict, bytes]:
    """The next frame: (type, fields, payload)."""
    h = self.recv_exact(P.HDR_SIZE)
    size = struct.unpack_from("<I", h)[0]
    b = h + self.recv_exact(size - P.HDR_SIZE)
    t, f = P.unpack(b)
    return t, f, b[P.MSGS[t].size:]

  def error(self) -> tuple[int, int, str]:
    """Expect an Rerror next: (code, tag, text)."""
    t, f, p = self.frame()
    assert t == P.RERROR, f"expected Rerror, got {P.TYPE_NAMES.get(t, t)} {f}"
    return f["code"], f["tag"], p.decode()

  def errors(self, n:int) -> list[tuple[int, int, str]]:
    """Errors of requests without a reply arrive ahead of the next reply: send a ping, collect n errors, expect the pong."""
    tag = self.req(P.TPING, count=0)
    errs = [self.error() for _ in range(n)]
    t, f, _ = self.frame()
    assert (t, f["tag"]) == (P.RPING, tag), f"expected the Rping after {n} errors, got {P.TYPE_NAMES.get(t, t)} {f}"
    return errs

  def until_pong(self) -> list[tuple[int, int, str]]:
    """Send a ping and return whatever errors arrive before its reply."""
    tag, errs = self.req(P.TPING, count=0), []
    while True:
      t, f, p = self.frame()
      if t == P.RPING and f["tag"] == tag: return errs
      assert t == P.RERROR, f"unexpected {P.TYPE_NAMES.get(t, t)} {f}"
      errs.append((f["code"], f["tag"], p.decode()))

  def closed(self) -> bool:
    """True if the daemon has closed the connection (EOF with nothing more to read)."""
    try: return self.s.recv(1) == b""
    except ConnectionResetError: return True

  def hello(self, **over) -> dict:
    self.req(P.THELLO, **{"magic": P.MAGIC, "version": P.VERSION, "maxmsg": P.DEFAULT_MAXMSG, **over})
    t, f, _ = self.frame()
    assert t == P.RHELLO, (t, f)
    return f

  def ping(self, data:bytes=b"") -> bytes:
    tag = self.req(P.TPING, data, count=len(data))
    t, f, p = self.frame()
    assert (t, f["tag"]) == (P.RPING, tag), (t, f)
    return p

  def alloc(self, h:int, size:int): return self.req(P.TALLOC, handle=h, bufsize=size)
  def write(self, h:int, off:int, data:bytes): return self.req(P.TWRITE, data, handle=h, offset=off, count=len(data))
  def read(self, h:int, off:int, n:int) -> bytes:
    tag = self.req(P.TREAD, handle=h, offset=off, count=n)
    t, f, p = self.frame()
    assert (t, f["tag"]) == (P.RREAD, tag), (t, f, p)
    return p

  def load(self, prog:int, image:bytes, name:str="k", nbufs:int=1, nvals:int=0, arch:int|None=None, entry:int=0,
           kind:int=P.PROG_CPU_IMAGE, corearg:int=P.NO_CORE, crc:int|None=None) -> int:
    n = name.encode()
    return self.req(P.TLOAD, n + image, prog=prog, kind=kind, arch=P.ARCH_X86_64 if arch is None else arch, nbufs=nbufs, nvals=nvals,
                    corearg=corearg, entry=entry, crc=zlib.crc32(image) if crc is None else crc, namelen=len(n), datalen=len(image))

  def launch(self, prog:int, bufs, vals=(), global_size=(1, 1, 1), local_size=(1, 1, 1), wait:bool=False) -> int:
    return self.req(P.TLAUNCH, P.launch_args(bufs, vals), P.FWAIT if wait else 0, **P.launch_fields(prog, bufs, vals, global_size, local_size))

  def sync(self):
    tag = self.req(P.TSYNC)
    t, f, p = self.frame()
    assert (t, f["tag"]) == (P.RSYNC, tag), (t, f, p)

  def close(self): self.s.close()

def f32(*v) -> bytes: return struct.pack(f"<{len(v)}f", *v)

def still_serving(r):
  """Another client connects, allocates, writes and reads back: the daemon survived whatever came before."""
  assert r.alive(), "daemon exited"
  c = Raw(r.addr)
  c.alloc(1, 8); c.write(1, 0, b"survived")
  assert c.read(1, 0, 8) == b"survived"
  c.close()

def compile_kernel(src:str, name:str, cpu:str="x86-64-v2") -> tuple[int, bytes, int]:
  """clang-compile a C kernel the way tinygrad's ClangCompiler does; returns (arch code, image, entry)."""
  obj = subprocess.check_output(["clang", "-c", "-x", "c", "-O2", "-fPIC", "-ffreestanding", "-fno-math-errno", "-nostdlib", "-fno-ident",
                                 "--target=x86_64-none-unknown-elf", f"-march={cpu}", "-", "-o", "-"], input=src.encode())
  return cpu_image(obj, name)

ADD1 = "void add1(float* restrict out, float* restrict a, long n) { for (long i = 0; i < n; i++) out[i] = a[i] + 1.0f; }"
CRASH = "void crash(float* restrict out) { *(volatile int*)0 = 1; out[0] = 1; }"
SPIN = "void spin(float* restrict out) { for (;;) { __asm__ volatile(\"\"); } }"
# one call per core id: out[core_id] = core_id * 10
CORES = "void cores(int* restrict out, long core_id) { out[core_id] = (int)core_id * 10; }"
