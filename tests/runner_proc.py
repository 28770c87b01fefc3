"""Start and stop metal_runner daemons for tests: loopback only, ephemeral ports, stopped by pid. RunnerProc is the one way the tests
start a runner (conftest.runner() and conftest.metal_runner_proc() are RunnerProcs too); build() the one way they build the daemon."""
from __future__ import annotations
import contextlib, functools, os, pathlib, resource, select, signal, subprocess, sys, threading, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
# METAL_RUNNER_BIN names a prebuilt daemon (e.g. the sanitizer build, tests/fuzz/sanitize_run.sh); otherwise make builds it
DAEMON = pathlib.Path(os.environ.get("METAL_RUNNER_BIN") or ROOT / "daemon" / "metal_runner")
# the Metal runner: on macOS the daemon itself, elsewhere daemon/metal_runner_emu, the daemon on the Metal emulator (a test harness)
METAL_BIN = DAEMON if sys.platform == "darwin" else ROOT / "daemon" / "metal_runner_emu"

def build_error(metal:bool=False) -> str|None:
  """Builds the daemon (metal: the Metal runner) once per process; returns why it cannot be built, or None. With METAL_RUNNER_BIN set,
  the daemon is not built, only looked for."""
  if not metal and os.environ.get("METAL_RUNNER_BIN"): return None if DAEMON.exists() else f"METAL_RUNNER_BIN={DAEMON} does not exist"
  return _make("all" if not metal or sys.platform == "darwin" else "emu", METAL_BIN if metal else DAEMON)

@functools.cache
def _make(target:str, binary:pathlib.Path) -> str|None:
  try: r = subprocess.run(["make", "-C", str(ROOT / "daemon"), target], capture_output=True, text=True, timeout=600)
  except (OSError, subprocess.TimeoutExpired) as e: return f"make -C daemon {target} failed: {e}"
  if r.returncode != 0 or not binary.exists(): return f"make -C daemon {target} failed (exit {r.returncode}): {(r.stdout + r.stderr).strip()[-1500:]}"
  return None

def build(metal:bool=False) -> pathlib.Path:
  """The daemon's path (metal: the Metal runner's), built once per process; raises RuntimeError saying why it cannot be built."""
  if (why:=build_error(metal)) is not None: raise RuntimeError(f"the {'Metal runner' if metal else 'daemon'} cannot be built: {why}")
  return METAL_BIN if metal else DAEMON

def stop(proc:subprocess.Popen, timeout:float=10) -> int:
  """Stops a process we started, by its pid: SIGTERM, then SIGKILL if it has not exited within timeout; returns its exit code."""
  if proc.poll() is None:
    proc.terminate()
    try: proc.wait(timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait(timeout)
  return proc.returncode

class RunnerProc:
  def __init__(self, *args:str, backend:str|None=None, binary:pathlib.Path|None=None, env:dict[str, str]|None=None, nofile:int|None=None,
               stdin:int|None=None, log:bool=True, group:bool=False, start_timeout:float=20, prefix:list[str]|tuple[str, ...]=()):
    """A runner on 127.0.0.1 with a free port (.addr, .port, .proc). backend: its --backend (None: the daemon's default, metal on macOS);
    binary: instead of build()'s; env: added to the environment; nofile: start the runner with that open-file limit, soft and hard (it
    cannot raise it); stdin: as subprocess.Popen's; log: its stderr kept in .log (log_text, wait_log), else passed through to the
    test's stderr, which pytest shows when the test fails; group: it leads a process group of its own, so a test can kill it together
    with its session processes (os.killpg(proc.pid, ...)), and stop() kills what is left of the group; prefix: what runs the binary
    (qemu-user). Raises RuntimeError if it does not say it listens within start_timeout."""
    self.argv = [*prefix, str(binary or build()), "--host", "127.0.0.1", "--port", "0", *(("--backend", backend) if backend else ()), *args]
    self.group, self.log = group, []
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
    self.proc = subprocess.Popen(self.argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE if log else None, text=True,
                                 errors="replace", env={**os.environ, **env} if env else None, preexec_fn=limit, start_new_session=group)
    self._reader = threading.Thread(target=self._read_log, daemon=True) if log else None
    if self._reader: self._reader.start()
    line = self.proc.stdout.readline() if select.select([self.proc.stdout], [], [], start_timeout)[0] else ""
    if not line.startswith("listening on "):
      code = self.stop()
      self.proc.stdout.close()
      raise RuntimeError(f"metal_runner did not start (exit code {code}, first line {line!r}): " + "\n".join(self.log))
    self.port = int(line.rsplit(":", 1)[1])
    self.addr = f"127.0.0.1:{self.port}"
    threading.Thread(target=self._drain, daemon=True).start()

  def _read_log(self):
    for line in self.proc.stderr: self.log.append(line.rstrip("\n"))

  def _drain(self):
    # the runner writes nothing after its first line, but a kernel may: a full pipe would block it
    with self.proc.stdout as f:
      for _ in f: pass

  def log_text(self, settle:float=0.2) -> str:
    assert self._reader, "this runner's log goes to the test's stderr (RunnerProc(log=False))"
    time.sleep(settle)
    return "\n".join(self.log)

  def wait_log(self, *texts:str, timeout:float=10) -> str:
    """The log once it holds every one of texts (the accept loop logs a session's end up to half a second later); fails after timeout."""
    assert self._reader, "this runner's log goes to the test's stderr (RunnerProc(log=False))"
    deadline = time.monotonic() + timeout
    while not all(t in (log:="\n".join(self.log)) for t in texts):
      assert time.monotonic() < deadline, f"runner log lacks {[t for t in texts if t not in log]}: {log}"
      time.sleep(0.05)
    return log

  def alive(self) -> bool: return self.proc.poll() is None

  def stop(self, timeout:float=10) -> int:
    """SIGTERM by pid, SIGKILL if it does not exit in time (with group, then SIGKILL to what is left of its group: the session processes
    of a runner a test killed); returns the exit code. The log is whole after it, unless a process left behind holds the runner's stderr."""
    stop(self.proc, timeout)
    if self.group:
      with contextlib.suppress(ProcessLookupError, PermissionError): os.killpg(self.proc.pid, signal.SIGKILL)
    if self.proc.stdin: self.proc.stdin.close()
    if self._reader: self._reader.join(1)
    return self.proc.returncode

@contextlib.contextmanager
def runner(*args:str, **kw):
  """A RunnerProc (same arguments) for a with block, stopped at its end."""
  r = RunnerProc(*args, **kw)
  try: yield r
  finally: r.stop()

def until(cond, timeout:float=5.0) -> bool:
  """Whether cond() holds within timeout: for what a runner does after its reply (a store, a session's end), checked again until then."""
  deadline = time.monotonic() + timeout
  while not cond() and time.monotonic() < deadline: time.sleep(0.02)
  return cond()

def children(r:RunnerProc) -> list[int]:
  """The runner's child processes, from /proc (Linux)."""
  pid = r.proc.pid
  return [int(p) for p in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

def comm(pid:int) -> str: return pathlib.Path(f"/proc/{pid}/comm").read_text().strip()

def session_pids(r:RunnerProc) -> list[int]:
  """The runner's session processes: its children but the peer broker (protocol.md, Copies between runners). The broker
  names itself once forked, which may be just after the runner said it is listening: wait for the name."""
  until(lambda: "mr_peer_broker" in map(comm, children(r)))
  return [p for p in children(r) if comm(p) != "mr_peer_broker"]
