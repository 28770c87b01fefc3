"""Start and stop metal_runner daemons for tests: loopback only, ephemeral ports, stopped by pid."""
from __future__ import annotations
import contextlib, os, pathlib, resource, signal, subprocess, threading, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DAEMON = ROOT / "daemon" / "metal_runner"

def build() -> pathlib.Path:
  """Build the daemon (make is incremental); honours METAL_RUNNER_BIN for a prebuilt one, e.g. a sanitizer build."""
  if (b := os.environ.get("METAL_RUNNER_BIN")): return pathlib.Path(b)
  subprocess.run(["make", "-s", "-C", str(ROOT / "daemon")], check=True, stdout=subprocess.DEVNULL)
  return DAEMON

class RunnerProc:
  def __init__(self, *args:str, binary:pathlib.Path|None=None, env:dict[str, str]|None=None, nofile:int|None=None, stdin:int|None=None):
    """nofile: start the runner with that open-file limit, soft and hard (it cannot raise it); stdin: as subprocess.Popen's."""
    self.argv = [str(binary or build()), "--host", "127.0.0.1", "--port", "0", *args]
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
    self.proc = subprocess.Popen(self.argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, **env} if env else None, preexec_fn=limit)
    line = self.proc.stdout.readline()
    if not line.startswith("listening on "):
      self.stop()
      raise RuntimeError(f"metal_runner did not start: {line!r} {self.proc.stderr.read()}")
    self.port = int(line.rsplit(":", 1)[1])
    self.addr = f"127.0.0.1:{self.port}"
    self.log: list[str] = []
    self._reader = threading.Thread(target=self._read_log, daemon=True)
    self._reader.start()

  def _read_log(self):
    for line in self.proc.stderr: self.log.append(line.rstrip("\n"))

  def log_text(self, settle:float=0.2) -> str:
    time.sleep(settle)
    return "\n".join(self.log)

  def wait_log(self, *texts:str, timeout:float=10) -> str:
    """The log once it holds every one of texts (the accept loop logs a session's end up to half a second later); fails after timeout."""
    deadline = time.monotonic() + timeout
    while not all(t in (log:="\n".join(self.log)) for t in texts):
      assert time.monotonic() < deadline, f"runner log lacks {[t for t in texts if t not in log]}: {log}"
      time.sleep(0.05)
    return log

  def alive(self) -> bool: return self.proc.poll() is None

  def stop(self, timeout:float=10) -> int:
    """SIGTERM by pid, SIGKILL if it does not exit in time; returns the exit code."""
    if self.proc.poll() is None:
      os.kill(self.proc.pid, signal.SIGTERM)
      try: self.proc.wait(timeout)
      except subprocess.TimeoutExpired:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
    for f in (self.proc.stdin, self.proc.stdout):
      if f: f.close()
    return self.proc.returncode

@contextlib.contextmanager
def runner(*args:str, binary:pathlib.Path|None=None):
  r = RunnerProc(*args, binary=binary)
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
