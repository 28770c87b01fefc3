"""What the conformance cases share: the @section decorator naming the protocol.md section a case checks, the runner under
test (Target), connections that say hello and authenticate, and the kernels a case loads (a CPU image built for the runner's
arch, or Metal source for a Metal runner)."""
from __future__ import annotations
import contextlib, functools, hashlib, hmac, os, pathlib, re, subprocess, sys, tempfile, zlib
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "tests"):
  if str(p) not in sys.path: sys.path.insert(0, str(p))
from client import protocol as P  # noqa: E402
from wire import Raw  # noqa: E402

PROTOCOL_MD = ROOT / "protocol.md"

@functools.cache
def sections() -> tuple[str, ...]:
  """protocol.md's `## ` sections, in order."""
  return tuple(m.group(1).strip() for m in re.finditer(r"^## (.+)$", PROTOCOL_MD.read_text(), re.M))

def section(*names:str):
  """Names the protocol.md sections (their `## ` titles) whose statements a case checks; an unknown name fails at import."""
  for n in names:
    if n not in sections(): raise ValueError(f"@section({n!r}): protocol.md has no section '## {n}' (it has {', '.join(sections())})")
  def mark(fn):
    fn._sections = names
    return pytest.mark.section(*names)(fn)
  return mark

# Sections with no case of their own, and why. tests/conformance/test_table.py fails for a section that has neither.
EXEMPT = {
}

# *** the runner under test

TOKEN = b"conformance suite token"
AUTH_CLIENT, AUTH_SERVER = b"metal_runner-auth-v1 client", b"metal_runner-auth-v1 server"
def client_mac(token:bytes, snonce:bytes, cnonce:bytes) -> bytes: return hmac.new(token, AUTH_CLIENT + snonce + cnonce, hashlib.sha256).digest()
def server_mac(token:bytes, snonce:bytes, cnonce:bytes) -> bytes: return hmac.new(token, AUTH_SERVER + cnonce + snonce, hashlib.sha256).digest()

def send_auth(c:Raw, token:bytes, cnonce:bytes|None=None, mac:bytes|None=None) -> tuple[int, bytes]:
  cnonce = os.urandom(32) if cnonce is None else cnonce
  return c.req(P.TAUTH, cnonce=cnonce, mac=client_mac(token, c.info["nonce"], cnonce) if mac is None else mac), cnonce

class Target:
  """One runner: its address, the token its clients need (or None), its isolation mode if known, and whether this suite started
  it (and so may start others with the options a case needs) or it was named by --runner."""
  def __init__(self, addr:str, token:bytes|None, isolation:str|None, pool:Pool|None):
    self.addr, self.token, self.isolation, self.pool = addr, token, isolation, pool
    self._info = None

  @property
  def external(self) -> bool: return self.pool is None

  @property
  def info(self) -> dict:
    """Rhello of a fresh connection (no Tauth sent)."""
    if self._info is None:
      c = Raw(self.addr)
      self._info = c.info
      c.close()
    return self._info

  @property
  def backend(self) -> str: return P.BACKENDS.get(self.info["backend"], str(self.info["backend"]))
  @property
  def auth(self) -> bool: return bool(self.info["caps"] & P.CAP_AUTH)

  def connect(self, timeout:float=10, maxmsg:int=P.DEFAULT_MAXMSG) -> Raw:
    """A connection ready for requests: Thello (with maxmsg) done, and Tauth when the runner asks for it."""
    c = Raw(self.addr, hello=False, timeout=timeout)
    c.info = c.hello(maxmsg=maxmsg)
    if c.info["caps"] & P.CAP_AUTH:
      if self.token is None: pytest.skip("the runner requires a token (CAP_AUTH) and none was given: pass --token-file")
      tag, cnonce = send_auth(c, self.token)
      t, f, p = c.frame()
      assert (t, f["tag"]) == (P.RAUTH, tag), f"Tauth with the given token: {P.TYPE_NAMES.get(t, t)} {f} {p[:200]!r}"
      assert f["mac"] == server_mac(self.token, c.info["nonce"], cnonce), "Rauth.mac is wrong: the runner does not hold the token"
    return c

  def with_options(self, *opts:str) -> Target:
    """A runner like this one (same isolation) started with extra runner options; shared by the cases that ask for the same."""
    if self.pool is None: pytest.skip(f"needs a runner started with {' '.join(opts)}; --runner names one already running")
    return self.pool.get(self.isolation, opts)

  @contextlib.contextmanager
  def fresh(self, *opts:str, nofile:int|None=None):
    """A runner of this case's own (nothing else connects to it), started with opts (and an open-file limit of nofile)."""
    if self.pool is None: pytest.skip(f"needs a runner of its own{' started with ' + ' '.join(opts) if opts else ''}; "
                                      "--runner names one already running")
    t, stop = self.pool.start(self.isolation, opts, nofile)
    try: yield t
    finally: stop()

  def authenticating(self) -> Target:
    """A runner that requires a token, and the token."""
    if self.pool is not None: return self.pool.get(self.isolation, ("--token-file", self.pool.token_file()))
    if not self.auth: pytest.skip("the runner was started without a token (no CAP_AUTH)")
    if self.token is None: pytest.skip("the runner requires a token and none was given: pass --token-file")
    return self

  def needs_process_isolation(self):
    if self.backend != "cpu": pytest.skip(f"a {self.backend} runner's kernels are GPU code: they cannot crash a session's process")
    if self.isolation is None: pytest.skip("needs a CPU runner known to use process isolation (pass --runner-isolation process): "
                                           "a crashing kernel would take down a thread-isolated runner")
    if self.isolation not in ("process", "spawn"): pytest.skip("needs process isolation; this runner uses thread isolation")

class Pool:
  """Runners this suite starts, on 127.0.0.1 with free ports, stopped by pid at the end of the test session."""
  def __init__(self, backend:str="cpu"):
    self.backend = backend
    self.runners: dict = {}
    self.procs: list = []
    self._dir = None

  def token_file(self) -> str:
    if self._dir is None: self._dir = tempfile.TemporaryDirectory(prefix="conformance")
    p = pathlib.Path(self._dir.name) / "token"
    p.write_bytes(TOKEN + b"\n")  # a trailing newline is not part of the token (Authentication)
    p.chmod(0o600)   # a runner refuses a token file others can read
    return str(p)

  def start(self, isolation:str, opts:tuple[str, ...], nofile:int|None=None):
    from runner_proc import RunnerProc
    args = ("--backend", self.backend, "--isolation", isolation, *opts)
    try: r = RunnerProc(*args, nofile=nofile)
    except (RuntimeError, OSError) as e: pytest.fail(f"cannot start metal_runner {' '.join(args)}: {e}")
    token = TOKEN if "--token-file" in opts else None
    t = Target(r.addr, token, isolation, self)
    t.pid = r.proc.pid   # for a case that signals its own runner (fresh): SIGHUP reads the token file again
    return t, r.stop

  def get(self, isolation:str, opts:tuple[str, ...]) -> Target:
    key = (isolation, tuple(opts))
    if key not in self.runners:
      t, stop = self.start(isolation, tuple(opts))
      self.runners[key] = t
      self.procs.append(stop)
    return self.runners[key]

  def close(self):
    for stop in self.procs: stop()
    if self._dir is not None: self._dir.cleanup()

# *** kernels

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
MIDS = "uint3 gid [[threadgroup_position_in_grid]]"
KERNELS = {
  # name: (nbufs, nvals, C source, Metal source or None, Metal 64-bit value mask)
  "add1": (2, 1, "void add1(float* restrict out, float* restrict a, long n) { for (long i = 0; i < n; i++) out[i] = a[i] + 1.0f; }",
           HEAD + f"kernel void add1(device float* out, device float* a, constant long& n, {MIDS}) "
           "{ for (long i = 0; i < n; i++) out[i] = a[i] + 1.0f; }\n", 1),
  "crash": (1, 0, "void crash(float* restrict out) { *(volatile int*)0 = 1; out[0] = 1; }", None, 0),
  "spin": (1, 0, "void spin(float* restrict out) { for (;;) { __asm__ volatile(\"\"); } }", None, 0),
  # one call per core id: out[core_id] = core_id * 10
  "cores": (1, 1, "void cores(int* restrict out, long core_id) { out[core_id] = (int)core_id * 10; }", None, 0),
  # socket(AF_INET, SOCK_STREAM, 0) made straight from the kernel (Linux system call numbers): out[0] its result
  "sock": (1, 0, "void sock(long* restrict out) {\n#if defined(__x86_64__)\n long r;"
           " __asm__ volatile(\"syscall\" : \"=a\"(r) : \"a\"(41L), \"D\"(2L), \"S\"(1L), \"d\"(0L) : \"rcx\", \"r11\", \"memory\");\n#else\n"
           " register long x8 __asm__(\"x8\") = 198, x0 __asm__(\"x0\") = 2, x1 __asm__(\"x1\") = 1, x2 __asm__(\"x2\") = 0;"
           " __asm__ volatile(\"svc #0\" : \"+r\"(x0) : \"r\"(x8), \"r\"(x1), \"r\"(x2) : \"memory\"); long r = x0;\n#endif\n"
           " out[0] = r; }", None, 0),
}

class Kernel:
  def __init__(self, name:str, kind:int, arch:int, data:bytes, entry:int, nbufs:int, nvals:int):
    self.name, self.kind, self.arch, self.data, self.entry, self.nbufs, self.nvals = name, kind, arch, data, entry, nbufs, nvals

  def load(self, c:Raw, prog:int, **over) -> int:
    """Send a Tload of this kernel under prog; over replaces fields (name=, nbufs=, crc=, ...)."""
    f = {"name": self.name.encode(), "data": self.data, "kind": self.kind, "arch": self.arch, "nbufs": self.nbufs, "nvals": self.nvals,
         "corearg": P.NO_CORE, "entry": self.entry, **over}
    name = f.pop("name")
    name = name.encode() if isinstance(name, str) else name
    data = f.pop("data")
    crc = f.pop("crc", zlib.crc32(data))
    return c.req(P.TLOAD, name + data, prog=prog, crc=crc, namelen=len(name), datalen=len(data), **f)

@functools.cache
def cpu_kernel(name:str, arch:str, cpu:str) -> Kernel:
  from client.cpu_image import cpu_image
  nbufs, nvals, src, _, _ = KERNELS[name]
  triple = {"x86_64": ("x86_64", "-march"), "arm64": ("aarch64", "-mcpu")}.get(arch)
  if triple is None: pytest.skip(f"this suite builds CPU kernels for x86_64 and arm64, not {arch}")
  cpu = cpu or ("x86-64" if arch == "x86_64" else "generic")
  try:
    obj = subprocess.check_output(["clang", "-c", "-x", "c", "-O2", "-fPIC", "-ffreestanding", "-fno-math-errno", "-nostdlib", "-fno-ident",
                                   f"--target={triple[0]}-none-unknown-elf", f"{triple[1]}={cpu}", "-", "-o", "-"], input=src.encode())
  except (OSError, subprocess.CalledProcessError) as e: pytest.skip(f"cannot compile the {name} kernel with clang: {e}")
  code, image, entry = cpu_image(obj, name)
  return Kernel(name, P.PROG_CPU_IMAGE, code, image, entry, nbufs, nvals)

def kernel(target:Target, name:str) -> Kernel:
  """The kernel name built for target: a CPU image for its arch and cpu, or Metal source for a Metal runner."""
  info = target.info
  if info["backend"] == P.BACKEND_CPU: return cpu_kernel(name, P.cstr(info["arch"]), P.cstr(info["cpu"]))
  nbufs, nvals, _, msl, wide = KERNELS[name]
  if msl is None: pytest.skip(f"the {name} kernel exists only for the CPU backend")
  if not info["caps"] & P.CAP_METAL_SOURCE: pytest.skip("the Metal runner does not accept Metal source (no CAP_METAL_SOURCE)")
  return Kernel(name, P.PROG_METAL_SOURCE, P.ARCH_NONE, msl.encode(), wide, nbufs, nvals)

# *** small helpers

def ok(c:Raw):
  """No error is queued and the connection is open: a Tping comes straight back."""
  errs = c.until_pong()
  assert errs == [], f"unexpected errors: {[(P.ERRORS.get(e, e), t, text) for e, t, text in errs]}"

def fatal(c:Raw, code:int, tag:int|None=None) -> str:
  """The next frame is an Rerror with code (and tag), then the runner closes the connection; returns its text."""
  got, etag, text = c.error()
  assert got == code, f"expected {P.ERRORS[code]}, got {P.ERRORS.get(got, got)} {text!r}"
  if tag is not None: assert etag == tag, f"{P.ERRORS[code]} with tag {etag}, expected {tag}"
  assert closed(c), f"the connection stayed open after {P.ERRORS[code]} {text!r}"
  return text

def closed(c:Raw, timeout:float=5) -> bool:
  """The runner closed the connection within timeout, with nothing more sent."""
  c.s.settimeout(timeout)
  try: return c.s.recv(1) == b""
  except ConnectionResetError: return True
  except TimeoutError: return False

def one_error(c:Raw, code:int, tag:int) -> str:
  """The next waiting request collects exactly one queued Rerror: code with tag; the connection stays open. Returns its text."""
  errs = c.until_pong()
  assert [(P.ERRORS.get(e, e), t) for e, t, _ in errs] == [(P.ERRORS[code], tag)], f"expected {P.ERRORS[code]} for tag {tag}, got {errs}"
  return errs[0][2]
