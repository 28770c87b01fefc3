"""What a Metal session in a process of its own costs, ON THE METAL EMULATOR: python3 bench/session_spawn.py [--repeat N] [--kernels K]

EMULATOR FIGURES. daemon/metal_runner_emu is daemon/runner.m on tests/metal_emulator, a TEST HARNESS that runs kernels on the CPU behind
Apple's declared Metal API; nothing here says what a Mac takes to start a process that opens its GPU (issue 26, item 6).

Session start is the time from connect() to the Rlaunch of the first launch: Thello/Rhello, Talloc, K Tloads of distinct kernels (Metal
source), one Tlaunch with FWAIT. Two runners, one per isolation mode, sessions alternating between them, each the median of --repeat
runs (min and max too):

  thread   --isolation thread: every session a thread of the runner. Its pipeline cache is warm after the first session, so a later
           session compiles nothing; the first session of each batch is dropped for that reason.
  spawn    --isolation process (the Metal default): the runner posix_spawns a fresh process of itself per connection and hands it the
           socket (daemon/isolate.c); that process opens the device (taking the runner's answer to the one-line probe kernel,
           mtl_programs.m's mtl_probe, rather than compiling it again) and compiles the session's kernels again (its pipeline cache
           starts empty). The emulator's compiled kernels come from its disk
           cache here in both modes (as a Mac's Metal shader cache would serve a second process).
"""
from __future__ import annotations
import argparse, os, pathlib, re, select, signal, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from client import protocol as P  # noqa: E402
from metal_emu import HEAD, Conn  # noqa: E402

EMU = ROOT / "daemon" / "metal_runner_emu"
ARGS = ["--host", "127.0.0.1", "--port", "0", "--backend", "metal", "-q"]

def kernel(i:int) -> str:
  return HEAD + f"kernel void k{i}(device int* out, uint3 gid [[threadgroup_position_in_grid]]) {{ out[0] = {i}; }}\n"

def session(addr:str, kernels:int) -> float:
  """Connect, allocate, load the kernels, one waited launch: seconds from connect to Rlaunch."""
  t = time.perf_counter()
  c = Conn(addr)
  c.send(c.frame(P.TALLOC, handle=1, bufsize=64))
  for i in range(kernels): c.load(i + 1, kernel(i), 1, 0)
  c.waited(kernels, [(1, 0)])
  dt = time.perf_counter() - t
  c.s.close()
  return dt

def spawn(*args:str) -> tuple[int, int]:
  """posix_spawn a runner with args; (pid, read end of its stdout)."""
  r, w = os.pipe()
  pid = os.posix_spawn(str(EMU), [str(EMU), *ARGS, *args], dict(os.environ),
                       file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_CLOSE, r), (os.POSIX_SPAWN_CLOSE, w),
                                     (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                     (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)])
  os.close(w)
  return pid, r

def listening(fd:int) -> str:
  """The address from the runner's start-up line (stdout: the runner's banner goes to stderr)."""
  buf = b""
  while b"\n" not in buf:
    if not select.select([fd], [], [], 30)[0] or not (b := os.read(fd, 4096)): raise RuntimeError(f"the runner did not start: {buf!r}")
    buf += b
  if (m := re.search(rb"listening on (\S+)", buf)) is None: raise RuntimeError(f"unexpected start-up line: {buf!r}")
  return m.group(1).decode()

def stop(pid:int, fd:int):
  os.kill(pid, signal.SIGTERM)
  os.waitpid(pid, 0)
  os.close(fd)

def stats(xs:list[float]) -> dict:
  xs = sorted(x * 1e3 for x in xs)
  return {"median": xs[len(xs) // 2], "min": xs[0], "max": xs[-1], "n": len(xs)}

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  ap.add_argument("--repeat", type=int, default=15)
  ap.add_argument("--kernels", type=int, nargs="+", default=[1, 20])
  a = ap.parse_args()
  subprocess.run(["make", "-s", "-C", str(ROOT / "daemon"), "emu"], check=True)
  os.environ["METAL_RUNNER_TOKEN_FILE"] = ""   # these runners have no token: a client holding one would refuse them
  runners = [spawn("--isolation", "thread"), spawn("--isolation", "process")]
  try:
    ta, sa = (listening(fd) for _, fd in runners)
    for k in a.kernels:
      session(sa, k); session(ta, k)           # fill the emulator's disk cache and the thread runner's pipeline cache
      th, sp = [], []
      for _ in range(a.repeat):                # alternating, so drift hits both alike
        th.append(session(ta, k))
        sp.append(session(sa, k))
      t, s = stats(th), stats(sp)
      print(f"EMULATOR FIGURES (tests/metal_emulator, a CPU test harness; not an Apple GPU), {k} kernel(s), {a.repeat} runs each:")
      print(f"  thread isolation           {t['median']:8.2f} ms   (min {t['min']:.2f}, max {t['max']:.2f})")
      print(f"  process isolation (spawn)  {s['median']:8.2f} ms   (min {s['min']:.2f}, max {s['max']:.2f})")
      print(f"  spawn - thread             {s['median'] - t['median']:8.2f} ms   ratio {s['median'] / t['median']:.1f}x")
  finally:
    for pid, fd in runners: stop(pid, fd)

if __name__ == "__main__":
  main()
