# local_runner.py: the runner this host starts for a program when no runner address is given (METAL_RUNNER unset), from the binary
# local_build.py finds or builds: started on first use on a free loopback port, stopped by pid at exit (client/remote_metal.py stops
# every one in local_runners at exit and on SIGTERM), and ended by the closing of its stdin when this process dies any other way.
from __future__ import annotations
import os, re, select, subprocess, sys, threading
from tinygrad.helpers import DEBUG
from client.settings import token_file
from client.errors import RunnerUnavailable, TokenFileError
from client.local_build import runner_exe

local_runners: list[subprocess.Popen] = []
# a forked child's atexit must not stop its parent's runners (nor may its SIGTERM): they are the parent's to stop
def forget_local_runners():
  """A forked child (multiprocessing, compile workers) does not own its parent's runners: it drops them, and its copies of their stdin
  pipes, whose end is what ends each runner when the parent ends (--exit-with-stdin)."""
  for proc in local_runners:
    if proc.stdin is not None: proc.stdin.close()
  local_runners.clear()
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=forget_local_runners)

def stop_runner(proc:subprocess.Popen, timeout:float=5.0):
  if proc.poll() is None:
    proc.terminate()
    try: proc.wait(timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
  if proc.stdin is not None: proc.stdin.close()

def start_local_runner(backend:str) -> str:
  if backend == "metal" and sys.platform != "darwin":
    raise RunnerUnavailable("metal_runner: no METAL_RUNNER address, and a local Metal runner needs macOS")
  exe = runner_exe()   # the clone's daemon/, or a pip install's sources built once into a per-user cache (client/local_build.py)
  # a client that holds a token refuses a runner that does not prove it (client/connection.py): its own runner gets the token too
  try: token = ["--token-file", tf[0]] if (tf:=token_file()) else []
  except TokenFileError as e: raise RunnerUnavailable(f"metal_runner: no runner address, so a local runner: {e}") from None
  # its stdin is a pipe only this process holds: however the process ends, SIGKILL included, the pipe closes and the runner stops
  # (--exit-with-stdin); Linux's PR_SET_PDEATHSIG would fire when the thread that started it ends, and macOS has none
  local_runners.append(proc:=subprocess.Popen([str(exe), "--host", "127.0.0.1", "--port", "0", "--backend", backend, *token,
                                               "--exit-with-stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  # its log goes to our stderr with DEBUG>=1; the pipes are drained all along, a full pipe would block the runner
  log: list[bytes] = []
  def drain(f, keep:bool):
    for ln in f:
      if keep: log.append(ln)
      if DEBUG >= 1: sys.stderr.write(f"metal_runner[{proc.pid}]: {ln.decode(errors='replace')}")
  threading.Thread(target=drain, args=(proc.stderr, True), daemon=True).start()
  line = proc.stdout.readline() if select.select([proc.stdout], [], [], 30)[0] else b""  # type: ignore[union-attr]
  threading.Thread(target=drain, args=(proc.stdout, False), daemon=True).start()
  if (m:=re.match(r"listening on (\S+:\d+)", line.decode(errors="replace"))) is None:
    stop_runner(proc)
    raise RunnerUnavailable(f"metal_runner: local runner {exe} --backend {backend} did not start (exit code {proc.returncode}): "
                            f"{b''.join(log).decode(errors='replace').strip() or line!r}")
  return m.group(1)
