# remote_metal.py: tinygrad devices whose kernels run on a metal_runner daemon. `import client.remote_metal` installs them:
#   METAL  -> a runner with the Metal backend (MetalRenderer; metallib compiled here on macOS, else Metal source the runner compiles)
#   REMOTE -> a runner with the CPU backend (ClangRenderer; clang on this host builds a relocated image for the runner's CPU)
# METAL_RUNNER=host:port[,host:port...] gives one runner per device index (DEV:0, DEV:1, ...); unset, a local runner is started.
# With METAL_RUNNER set and DEV unset, the import connects to the first runner and makes its device tinygrad's default (DEV=METAL or
# REMOTE, for child processes too): a program's work goes to the runner it names or nowhere, never to tinygrad's CPU device instead.
# A runner that is named but cannot be used raises RunnerUnavailable; uncaught, it ends the program with its one line (no traceback), as
# does a runner lost mid-run (RunnerConnectionError); DEBUG>=1 shows the traceback of the latter.
from __future__ import annotations
import _thread, atexit, contextlib, hashlib, os, platform, re, signal, socket, sys, threading, types
from typing import cast
from tinygrad.device import BufferSpec, Compiled, Compiler, Device, LRUAllocator, Program, TinyELF, _Device
from tinygrad.helpers import DEBUG, DEV, PROFILE, TracingKey, cpu_profile, getenv, suppress_finalizing
from tinygrad.renderer import cstyle
from client.connection import Runner
from client.errors import NotARunnerError, RunnerConnectionError, RunnerError, RunnerUnavailable, TokenFileError
from client.protocol import CAP_CPU_IMAGE, CAP_METALLIB, CAP_METAL_SOURCE, NO_CORE, PROG_CPU_IMAGE, PROG_METALLIB, PROG_METAL_SOURCE
from client.protocol import CAP_PROFILE, CAP_PEER, EAUTH, EPEER, launch_dims
from client.profile import RunnerProfiler
from client.cpu_image import clang_arch, cpu_image
from client.discovery import runner_addrs
from client.settings import SettingsError, apply_names, from_env
from client.graph import RemoteGraph, peer_addr, unreachable
from client.local_runner import local_runners, start_local_runner, stop_runner

# *** a runner that cannot be used (RunnerUnavailable): one line that names it, says why and what to check. Uncaught, it ends the
# program with that line alone: a traceback would show tinygrad's device set-up, not the mistake, which is in the environment.
# A runner lost mid-run, or a link that could not be resumed (RunnerConnectionError), is one line too: its text names the runner and
# what happened, and the chained tracebacks of the socket's errors say nothing more to the program's user (DEBUG>=1 shows them).

def _one_line(prev):
  def hook(t, e, tb):
    if isinstance(e, RunnerUnavailable): print(e, file=sys.stderr)   # exit code 1, as for any uncaught exception
    elif isinstance(e, RunnerConnectionError) and DEBUG < 1: print(f"metal_runner: {e}", file=sys.stderr)
    else: prev(t, e, tb)
  return hook
sys.excepthook = _one_line(sys.excepthook)

# Ctrl-C: a KeyboardInterrupt raised while a finalizer runs (UOp.__del__, a buffer's) is printed as "Exception ignored" and dropped, and
# the program runs on (one Ctrl-C in ten or so with a runner: its finalizers queue frees). Delivered again, from a timer thread so that
# it comes once the finalizer has returned, it lands in the program's own code, as a Ctrl-C should (the program's own SIGINT handler,
# if it set one, is the one that runs).
def _interrupt_again(prev):
  def hook(u):
    if u.exc_type is KeyboardInterrupt and threading.current_thread() is threading.main_thread():
      (t:=threading.Timer(0.02, _thread.interrupt_main)).daemon = True   # 20 ms: past this hook and the finalizer
      t.start()
    else: prev(u)
  return hook
sys.unraisablehook = _interrupt_again(sys.unraisablehook)

def unusable(addr:str, e:Exception) -> RunnerUnavailable:
  """The one line for a runner that cannot be used: its address, the reason and, where the reason does not say it, what to check."""
  s = from_env()   # the names its user gave the settings: --runner or METAL_RUNNER, what to pass or set for a token
  where = f"check the address ({s.setting('METAL_RUNNER')}) and that the runner is running there"
  if isinstance(e, NotARunnerError): return RunnerUnavailable(f"metal_runner: {e}; {where}")   # "HOST:PORT is not a metal_runner (...)"
  if isinstance(e, RunnerConnectionError):   # "cannot connect: " and the reason, in connection.py's words (probe says the same)
    return RunnerUnavailable(f"metal_runner: cannot use the runner at {addr}: {e.reason().removeprefix('cannot connect: ')}; {where}")
  if isinstance(e, RunnerError) and e.code == EAUTH:   # the token: the library's text names the file, its setting and what to do
    text = e.text
    if e.request == "Tauth" and text.startswith("the runner requires a token"):   # the library's text names token=, not for a program
      text = (f"the runner requires a token: {s.give('METAL_RUNNER_TOKEN_FILE', 'FILE')}, the runner's token file (the file its "
              "--token-file names), or save that file as ~/.metal_runner_token")
    return RunnerUnavailable(f"metal_runner: cannot use the runner at {addr}: {text}")
  if isinstance(e, RunnerError): return RunnerUnavailable(f"metal_runner: cannot use the runner at {addr}: {e.reason()}")
  if isinstance(e, ValueError): return RunnerUnavailable(f"metal_runner: cannot use the runner at {addr}: {e}; {where}")   # not host:port
  return RunnerUnavailable(f"metal_runner: cannot use the runner at {addr}: {e}")

# sessions opened to check every runner named before the program starts (use_runner_by_default), each taken by the device that then
# opens on its address: one connection per device, never a check and then another (a relay or a firewall may allow only one)
connected: dict[str, list[Runner]] = {}

def connect(addr:str) -> Runner:
  """A session on the runner at addr (the token from METAL_RUNNER_TOKEN_FILE); RunnerUnavailable if it cannot be used."""
  if connected.get(addr): return connected[addr].pop(0)   # one the runner dropped meanwhile (--idle-timeout) resumes at its first use
  try: return Runner(addr)
  except (RunnerError, ValueError, OSError) as e: raise unusable(addr, e) from e

# devices opened for a runner that came back after its session was lost (client/rejoin.py): device -> the runner's address. A new device
# index, so a new session and nothing of what tinygrad keeps per device (compiled programs, the random seeds' buffers, freed buffers), whose
# handles named things of the old session; an index past METAL_RUNNER's addresses, at the address of the device it replaces
reopened: dict[str, str] = {}

# *** local runner (client/local_runner.py): started on first use when METAL_RUNNER is unset, stopped by pid at exit

# *** SIGTERM and SIGHUP (kill, systemctl stop, docker stop, a closed terminal) skip atexit: the sessions would wait out their resume grace
# on the runners (a minute, holding their memory) and a local runner would outlive the program. So the program ends as on Ctrl-C, a
# SystemExit unwinding it, and atexit ends the sessions at once and stops the local runners; then it dies by the signal, as it would
# have. Only where the program left the signal's default action, only from the main thread (a handler can be set only there). A SIGKILL
# cannot be caught: it ends the local runners by closing their stdin (--exit-with-stdin). Not in a multiprocessing child (tinygrad's
# compile workers import this module to unpickle the renderer's compiler): Pool.terminate() SIGTERMs its workers and joins them, and a
# worker that unwound instead of dying could leave the pool's shared queue lock taken, so that the next one, and the program's exit,
# waited forever (seen at exit after a Metal runner compiled in parallel, about 1 run in 6 on a loaded 2-core machine).
terminated: list[int] = []

def _unwind(signum, frame):
  if terminated:   # a second one while unwinding: at once
    for proc in local_runners: stop_runner(proc)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
  terminated.append(signum)
  raise SystemExit(128 + signum)

def multiprocessing_child() -> bool:
  """A process multiprocessing started. A spawned one runs `python -c ... --multiprocessing-fork`, and `client run`'s sitecustomize
  imports this module before multiprocessing has set its parent_process(); a forked one has it set."""
  if sys.argv[1:2] == ["--multiprocessing-fork"]: return True
  return (mp:=sys.modules.get("multiprocessing")) is not None and mp.parent_process() is not None

def end_cleanly_on_signals():
  if threading.current_thread() is not threading.main_thread() or multiprocessing_child(): return
  for sig in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(sig) is signal.SIG_DFL: signal.signal(sig, _unwind)

def _default_signals_in_a_fork():   # a forked child (a fork or forkserver worker, os.fork) inherits the handler: it is the parent's
  terminated.clear()
  for sig in (signal.SIGTERM, signal.SIGHUP):
    with contextlib.suppress(ValueError):
      if signal.getsignal(sig) is _unwind: signal.signal(sig, signal.SIG_DFL)
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_default_signals_in_a_fork)

@atexit.register
def _die_by_the_signal():   # registered before _shutdown, so it runs after it
  if terminated:
    signal.signal(terminated[0], signal.SIG_DFL)
    os.kill(os.getpid(), terminated[0])

# *** Metal: rendered here; compiled here only where Apple's compiler is (macOS)

CAP_NAMES = {CAP_CPU_IMAGE: "CPU images", CAP_METALLIB: "metallibs", CAP_METAL_SOURCE: "Metal source"}

class MetalSourceCompiler(Compiler):
  """The "binary" is the Metal source, which the runner compiles at its own language version (PROG_METAL_SOURCE): no Metal compiler on
  this host, or a runner whose macOS is older than this host's, or not known (metal_kind)."""
  def __init__(self): super().__init__(None)

if not (METAL_SOURCE:=sys.platform != "darwin" or bool(getenv("METAL_RUNNER_SOURCE"))):
  from tinygrad.runtime.ops_metal import MetalCompiler   # the real module, before the device shim below takes its name
else: MetalCompiler = MetalSourceCompiler  # type: ignore[misc]

def macos_version(s:str) -> tuple[int, int, int]|None:
  """'14.5' or '14.5.1' as (14, 5, 1), else None. macOS 26 says 16 to programs built with an older SDK (as Big Sur said 10.16): 26."""
  if not re.fullmatch(r"\d+(\.\d+){0,2}", s): return None
  major, minor, patch = [int(x) for x in s.split(".")] + [0] * (2 - s.count("."))
  if major == 16: major = 26
  if (major, minor) == (10, 16): major, minor = 11, 0
  return (major, minor, patch)

def host_macos() -> tuple[int, int, int]|None:
  """This host's macOS version when it compiles metallibs (tinygrad's MetalCompiler picks their language version from it), else None."""
  return None if METAL_SOURCE else macos_version(platform.mac_ver()[0])

def metal_kind(host:tuple[int, int, int]|None, runner:tuple[int, int, int]|None, caps:int) -> int|None:
  """What this host sends a Metal runner. A metallib (compiled here) only when this host compiles them (host: its macOS version) and the
  runner's macOS (Rhello.cpu) is known to be at least as new: tinygrad compiles at the language version of this host's macOS, which an
  older macOS refuses ("This library is using language version 4.0 which is not supported on this OS"). Otherwise Metal source, which the
  runner compiles at its own version; a runner that takes only one kind gets that one. None: the runner takes neither that this host has."""
  lib, src = caps & CAP_METALLIB, caps & CAP_METAL_SOURCE
  if host is not None and lib and (not src or (runner is not None and runner >= host)): return PROG_METALLIB
  return PROG_METAL_SOURCE if src else None

class MetalRenderer(cstyle.MetalRenderer):
  """tinygrad's MetalRenderer. Defined here so a pickled renderer (parallel compile and BEAM workers) imports this module, and with it the
  tinygrad.runtime.ops_metal shim whose MetalCompiler the renderer uses: the real ops_metal cannot be imported off macOS."""

# *** the three runtime classes

class RemoteProgram(Program['RemoteDevice']):
  def __init__(self, dev:RemoteDevice, obj:TinyELF):
    self.dev, self.name, self.signature = dev, obj.name, obj.signature
    # signature: buffers (shaped) then integer values (shape ()), in argument order
    self.nbufs = sum(1 for *_, shape in obj.signature if shape != ())
    self.nvals = len(obj.signature) - self.nbufs
    if dev.is_metal:
      # a Metal program's entry is its value widths (protocol.md): bit i set, value i is 64-bit (MetalRenderer's `constant long&` for a
      # variable whose range passes int32), bound with 8 bytes as ops_metal.py binds dt.itemsize
      wide = sum(1 << i for i, (*_, dt, _) in enumerate(obj.signature[self.nbufs:]) if dt.itemsize == 8)
      kind, arch, data, entry, corearg = PROG_METALLIB if obj.lib[:4] == b"MTLB" else PROG_METAL_SOURCE, 0, obj.lib, wide, NO_CORE
    else:
      kind, (arch, data, entry) = PROG_CPU_IMAGE, cpu_image(obj.lib, obj.name)
      corearg = next((i for i, (nm, *_) in enumerate(obj.signature) if nm == "core_id"), NO_CORE)
    self.key, self.prog = dev.load(kind, obj.name, data, self.nbufs, self.nvals, corearg, entry, arch)
    if dev.profiler is not None: dev.profiler.program(self.prog, obj.name, obj.profile_key)

  def __call__(self, *bufs, global_size:tuple[int,...]=(1,1,1), local_size:tuple[int,...]|None=(1,1,1), vals:tuple[int|None, ...]=(),
               wait=False, timeout:int|None=None) -> float|None:
    # bufs are (handle, offset, size) opaques, which launch() indexes directly; a None value is core_id, which the runner fills in
    if self.dev.profiler is not None: self.dev.profiler.issued()
    return self.dev.runner.launch(self.prog, bufs, [v or 0 for v in vals] if None in vals else vals, launch_dims(global_size),
                                  launch_dims(local_size or (1,1,1)), wait=wait)

  # tinygrad drops Programs it no longer needs (BEAM candidates, time_call's uncached runtimes); the method cache and a RemoteGraph's
  # runtimes hold the ones in use. The last RemoteProgram of a content key unloads its runner program.
  @suppress_finalizing
  def __del__(self):
    if (key:=getattr(self, "key", None)) is not None: self.dev.release(key)   # no key: __init__ failed before loading

class RemoteAllocator(LRUAllocator['RemoteDevice']):
  # opaque buffer: (handle, offset, size); an offset view shares its base's handle
  # Talloc has no reply, so the runner's ELIMIT would arrive a request later. The client counts against the limit the runner reported
  # and raises MemoryError at once instead, which lets LRUAllocator free its cache and retry.
  used = 0
  def alloc(self, size:int, options:BufferSpec|None=None):
    # tinygrad turns any RuntimeError of _alloc into "MemoryError: Allocation of N B failed", the reason only in its cause: a connection
    # that cannot be used (a forked child's, a lost runner's) is raised as itself, so the last line a user sees is the reason
    try: return super().alloc(size, options)
    except MemoryError as e:
      if isinstance(e.__cause__, RunnerConnectionError): raise e.__cause__ from None
      raise
  def _alloc(self, size:int, options:BufferSpec):
    if options.external_ptr is not None: raise RuntimeError(f"{self.dev.device}: runner memory cannot wrap a host pointer")
    if size > (info:=self.dev.runner.info).maxbuf or self.used + size > info.memory:
      raise MemoryError(f"{self.dev.device}: {size} bytes would pass the runner's limit ({self.used} of {info.memory} bytes in use, "
                        f"largest buffer {info.maxbuf})")
    self.dev.runner.alloc(h:=self.dev.new_handle(), size)
    self.used += size
    return (h, 0, size)
  @suppress_finalizing
  def _free(self, opaque, options:BufferSpec):
    self.used -= opaque[2]
    self.dev.later("free", opaque[0])   # often from Buffer.__del__: see RemoteDevice.later
  def _copyin(self, dest, src:memoryview):
    if self.dev.profiler is None: return self.dev.runner.write(dest[0], dest[1], src)
    # profiling: the host's side of the transfer on <device>:NET, next to the runner's on <device>:COPY
    self.dev.profiler.issued(frames(src.nbytes, self.dev.runner.maxmsg - 32))
    with cpu_profile(TracingKey(f"TINY -> {self.dev.device}", ret=src.nbytes, tb=None), f"{self.dev.device}:NET"):
      self.dev.runner.write(dest[0], dest[1], src)
  def _copyout(self, dest:memoryview, src):
    if self.dev.profiler is None: return self.dev.runner.read(src[0], src[1], dest)
    self.dev.profiler.issued(frames(dest.nbytes, self.dev.runner.maxmsg - 16))
    with cpu_profile(TracingKey(f"{self.dev.device} -> TINY", ret=dest.nbytes, tb=None), f"{self.dev.device}:NET"):
      self.dev.runner.read(src[0], src[1], dest)
  def _offset(self, buf, size:int, offset:int): return (buf[0], buf[1] + offset, size)
  def _transfer(self, dest, src, sz:int, src_dev:RemoteDevice, dest_dev:RemoteDevice):
    if src_dev is dest_dev:
      if dest_dev.profiler is not None: dest_dev.profiler.issued()
      dest_dev.runner.copy(dest[0], dest[1], src[0], src[1], sz)
    elif not peer_copy(dest, src, sz, src_dev, dest_dev):  # two runners that cannot reach each other: through this host
      src_dev.runner.read(src[0], src[1], mv:=memoryview(bytearray(sz)))
      dest_dev.runner.write(dest[0], dest[1], mv)

# *** copies between runners (protocol.md, Copies between runners): METAL_RUNNER_PEER=0 sends them through this host

PEER = getenv("METAL_RUNNER_PEER", 1)
# A direct copy waits for a grant, then for the source to connect and both sides to prove the grant: several round trips, against one
# (a read) through this host. It pays off only when the bytes, not the round trips, dominate; smaller copies go through this host.
PEER_MIN = getenv("METAL_RUNNER_PEER_MIN", 1 << 20)

def peer_copy(dest, src, sz:int, src_dev:RemoteDevice, dest_dev:RemoteDevice) -> bool:
  """Copy sz bytes straight from the source runner to the destination runner: a one-time grant from the destination's session, which the
  source's session uses to push the bytes. The destination has them when this returns. False: they cannot reach each other (DEBUG>=1 says
  so), copy through this host."""
  s, d = src_dev.runner, dest_dev.runner
  if not PEER or sz < PEER_MIN or not s.info.caps & d.info.caps & CAP_PEER or (s.addr, d.addr) in unreachable: return False
  grant, secret = d.grant(dest[0], dest[1], sz)
  host, port = peer_addr(d.addr)   # where the source reaches the destination (client/graph.py); unreachable: the copy falls back
  # profiling: the whole copy as the host waits for it, on <destination>:NET (the runners record no COPY event for it)
  prof = cpu_profile(TracingKey(f"{src_dev.device} -> {dest_dev.device}", ret=sz, tb=None), f"{dest_dev.device}:NET") \
    if dest_dev.profiler is not None else contextlib.nullcontext()
  try:
    with prof: s.peer_send(src[0], src[1], sz, host, port, grant, secret)
  except RunnerError as e:
    if e.code != EPEER: raise
    unreachable.add((s.addr, d.addr))
    if DEBUG >= 1: print(f"{src_dev.device} -> {dest_dev.device}: {e}; copying through this host", file=sys.stderr)
    return False
  return True

class RemoteDevice(Compiled):
  def __init__(self, device:str):
    self.is_metal, idx = device.split(":")[0] == "METAL", int(device.split(":")[1]) if ":" in device else 0
    want = "metal" if self.is_metal else "cpu"
    addrs = runner_addrs(want, s:=from_env())   # METAL_RUNNER: addresses, or "auto" (DNS-SD, client/discovery.py)
    if addrs and idx >= len(addrs) and device not in reopened:
      raise RunnerUnavailable(f"{device}: {s.named('METAL_RUNNER', ','.join(addrs))} has no runner for index {idx}")
    # a runner that demands a token gets it from METAL_RUNNER_TOKEN_FILE, else ~/.metal_runner_token (client/settings.py)
    addr = reopened.get(device) or (addrs[idx] if addrs else start_local_runner(want))
    self.runner, self.runner_closed = connect(addr), False
    self.profiler: RunnerProfiler|None = None
    self.programs: dict[bytes, list[int]] = {}   # content key -> [handle, number of RemotePrograms using it]
    self.pending: list[tuple[str, int]] = []     # Tunload/Tfree/Tgraphfree requests not sent yet (see later())
    # the renderer follows the runner: a mismatch is an error now, not a kernel the runner rejects later
    info = self.runner.info
    # Metal: a metallib or source, per runner (metal_kind); its compiler is set in _select_renderer
    self.kind = metal_kind(host:=host_macos(), macos_version(info.cpu), info.caps) if self.is_metal else PROG_CPU_IMAGE
    if info.backend != want or self.kind is None or not self.is_metal and not info.caps & CAP_CPU_IMAGE:
      self.finalize()
      hint = f" (use {'REMOTE' if info.backend == 'cpu' else 'METAL'} for it)" if info.backend != want else ""
      what = CAP_NAMES[CAP_CPU_IMAGE] if not self.is_metal else "Metal source" if host is None else "metallibs or Metal source"
      raise RunnerUnavailable(f"{device} needs a runner with the {want} backend that accepts {what}; {self.runner.addr} has the "
                              f"{info.backend} backend{hint}")
    if self.is_metal and host is not None and self.kind == PROG_METAL_SOURCE and DEBUG >= 1:
      print(f"{device}: Metal source to {self.runner.addr}, which compiles it: its macOS ({info.cpu or 'not reported'}) is older than this "
            f"host's ({'.'.join(map(str, host))}) or not known, and would refuse this host's metallibs", file=sys.stderr)
    # PROFILE: the runner records every kernel and copy (client/profile.py); a runner without CAP_PROFILE is profiled on the host only
    if PROFILE and info.caps & CAP_PROFILE: self.profiler = RunnerProfiler(device, self.runner)
    elif PROFILE: print(f"{device}: runner {self.runner.addr} cannot profile (no CAP_PROFILE): its kernels are not in the profile", file=sys.stderr)
    if self.is_metal:
      arch = info.arch if re.fullmatch(r"(Apple|Mac)\d+", info.arch) else None   # the GPU family selects tensor cores in MetalRenderer
      super().__init__(device, RemoteAllocator(self), [MetalRenderer], RemoteProgram, RemoteGraph, arch=arch)
    else: super().__init__(device, RemoteAllocator(self), [cstyle.ClangRenderer], RemoteProgram, RemoteGraph,
                           arch=clang_arch(info.arch, info.cpu, info.features))

  def _select_renderer(self):
    # tinygrad keeps a renderer, and with it a compiler, per device: a runner that takes source gets source, another may get metallibs
    r = super()._select_renderer()
    if self.is_metal and self.kind == PROG_METAL_SOURCE and not isinstance(r.compiler, MetalSourceCompiler): r.compiler = MetalSourceCompiler()
    return r

  def load(self, kind:int, name:str, data:bytes, nbufs:int, nvals:int, corearg:int, entry:int, arch:int) -> tuple[bytes, int]:
    """Loads a program once per content on this connection; returns (content key, handle). Each call takes a reference that
    release(key) gives back."""
    key = hashlib.sha256(repr((kind, name, nbufs, nvals, corearg, entry, arch)).encode() + data).digest()
    if (ent:=self.programs.get(key)) is None:
      self.runner.load(h:=self.new_handle(), kind, name, data, nbufs, nvals, corearg=corearg, entry=entry, arch=arch)
      self.programs[key] = ent = [h, 0]
    ent[1] += 1
    return key, ent[0]

  def release(self, key:bytes):
    """Drops a reference from load(); the last one queues the program's Tunload."""
    if self.runner_closed or (ent:=self.programs.get(key)) is None: return
    ent[1] -= 1
    if ent[1] == 0:
      del self.programs[key]
      self.later("unload", ent[0])

  def later(self, request:str, handle:int):
    """Queue a Tunload, Tfree or Tgraphfree (the Runner method's name) for handle. They are asked for from __del__, which the garbage
    collector may run in the middle of a Runner call that is writing a frame: sent then, the request would land inside that frame. So
    they go out with the next request that takes a handle (new_handle()) or at synchronize(); none needs a reply."""
    if not self.runner_closed: self.pending.append((request, handle))

  def new_handle(self) -> int:
    """A handle for a buffer, program or graph (one counter for all three, so a number is never reused). The runner limits each
    namespace to Rhello.maxhandles; the pending releases go out first, so no namespace holds more than it must."""
    self.send_pending()
    return self.runner.new_handle()
  def send_pending(self):
    while self.pending:
      request, handle = self.pending.pop(0)
      getattr(self.runner, request)(handle)

  def synchronize(self):
    if self.runner_closed: return   # at exit: _shutdown closed the connection before tinygrad's profile finalizer syncs
    self.send_pending()
    if self.profiler is not None: self.profiler.fetch()   # waits as Tsync does, and takes the runner's records
    else: self.runner.sync()
  def finalize(self):
    if not self.runner_closed: self.runner.close()
    self.runner_closed = True

def runner_device() -> str:
  """The device to use for the (first) runner: METAL for a Metal backend, REMOTE for a CPU one. Asks the runner; no address means the
  local runner this module would start, which is Metal on macOS."""
  if not (addrs:=runner_addrs()): return "METAL" if sys.platform == "darwin" else "REMOTE"
  with connect(addrs[0]) as r: return "METAL" if r.info.backend == "metal" else "REMOTE"

def check_runners(addrs:list[str]) -> list[Runner]:
  """A session on each runner, all connecting at once; RunnerUnavailable with one line for each runner that cannot be used."""
  got: dict[int, Runner|RunnerUnavailable] = {}
  def one(i:int):
    try: got[i] = connect(addrs[i])
    except RunnerUnavailable as e: got[i] = e
  threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(addrs))]
  for t in threads: t.start()
  for t in threads: t.join()
  bad, said = [], set()   # in the order named; a token file's fault (the settings', not a runner's) once
  for e in (got[i] for i in range(len(addrs))):
    if isinstance(e, RunnerUnavailable) and not (isinstance(c:=e.__cause__, TokenFileError) and c.text in said):
      bad.append(str(e))
      if isinstance(c, TokenFileError): said.add(c.text)
  if bad:
    for r in got.values():
      if isinstance(r, Runner): r.close()
    raise RunnerUnavailable("\n".join(bad))
  return [cast(Runner, got[i]) for i in range(len(addrs))]

def use_runner_by_default():
  """With METAL_RUNNER set and DEV unset: the first runner's device (METAL for a Metal backend, REMOTE for a CPU one) becomes tinygrad's
  default, here and in child processes, and is opened now, so a runner that cannot be used stops the program before it computes
  anything (RunnerUnavailable) instead of leaving its work to tinygrad's CPU device. Every other runner named is checked at the same
  time: its session waits for the device that opens on it (connected). DEV, when set, is the user's choice."""
  if DEV.device or os.environ.get("DEV"): return
  if not (addrs:=runner_addrs()): return
  runners = check_runners(addrs)
  for a, r in zip(addrs, runners): connected.setdefault(a, []).append(r)
  DEV.value = os.environ["DEV"] = dev = "METAL" if runners[0].info.backend == "metal" else "REMOTE"   # as tinygrad sets DEV for children
  Device[dev]

def frames(nbytes:int, step:int) -> int: return max(1, -(-nbytes // step))   # Twrite/Tread frames (and so profile records) of a copy

# *** install: Device["METAL"] and Device["REMOTE"] import tinygrad.runtime.ops_<name> and take its <NAME>Device class

def _shim(name:str, **attrs):
  (mod:=types.ModuleType(f"tinygrad.runtime.ops_{name}", f"installed by {__name__}")).__dict__.update(attrs)
  sys.modules[mod.__name__] = mod

_shim("metal", MetalDevice=RemoteDevice, MetalCompiler=MetalCompiler, MetalRenderer=MetalRenderer)
_shim("remote", RemoteDevice=RemoteDevice)
_Device.get_class.cache_clear()
from tinygrad.schedule.rangeify import DEVICE_MAX_BUFS  # noqa: E402
DEVICE_MAX_BUFS.setdefault("REMOTE", 31)  # kernels have at most 63 arguments on a runner; keep tinygrad's CPU limit on buffers

@atexit.register
def _shutdown():  # runs before tinygrad's own atexit (registered earlier): close connections, then stop the runners this process started
  for dn in list(Device._opened_devices):
    if isinstance(dev:=Device[dn], RemoteDevice):
      if dev.profiler is not None and not dev.runner_closed:   # the last records, before tinygrad's finalizer writes the profile
        try: dev.synchronize()
        except RuntimeError as e: print(f"{dn}: the runner's last profile records are lost: {e}", file=sys.stderr)
      dev.finalize()
  for left in connected.values():   # checked at the start, never used by a device
    for r in left: r.close()
  for proc in local_runners: stop_runner(proc)

try: apply_names()   # runners by name (~/.metal_runner_config, client/settings.py): addresses from here on, for children too
except SettingsError as e: raise RunnerUnavailable(f"metal_runner: {e}") from None
end_cleanly_on_signals()
use_runner_by_default()   # last: a runner that cannot be used raises from the import itself
