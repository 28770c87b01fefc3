"""A local runner ends with the program that started it, however the program ends (SIGKILL included): the client gives it a pipe as
stdin and --exit-with-stdin stops it at the pipe's end. A runner started without the option carries on when its stdin closes."""
import os, select, signal, subprocess, sys, time
import pytest
from conftest import ROOT
from runner_proc import RunnerProc
from wire import Raw, still_serving

pytestmark = pytest.mark.cpu_only

OWN_VARS = ("DEV", "DEBUG", "BEAM", "PARALLEL", "METAL_RUNNER", "METAL_RUNNER_CLIENT_RUN")

def gone(pid:int) -> bool:
  """No such process, or only its zombie (its new parent may not reap it at once)."""
  try: return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
  except FileNotFoundError: return True

def until_gone(pid:int, timeout:float) -> bool:
  deadline = time.monotonic() + timeout
  while not gone(pid) and time.monotonic() < deadline: time.sleep(0.05)
  return gone(pid)

@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_a_sigkilled_program_leaves_no_local_runner():
  code = """
import client.remote_metal as rm, time
from tinygrad import Tensor
assert (Tensor([1.0, 2.0, 3.0]) * 2).tolist() == [2.0, 4.0, 6.0]
print(rm.local_runners[0].pid, flush=True)
time.sleep(120)
"""
  env = {**{k: v for k, v in os.environ.items() if k not in OWN_VARS}, "PYTHONPATH": str(ROOT), "DEV": "REMOTE"}
  p = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  pid = None
  try:
    pid = int(p.stdout.readline() or 0)
    assert pid and not gone(pid), p.communicate(timeout=30)[1][-3000:]
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL
    assert until_gone(pid, 5), f"the local runner {pid} outlived its SIGKILLed program"
  finally:
    if p.poll() is None: p.kill()
    p.wait()
    p.stdout.close(); p.stderr.close()
    if pid and not gone(pid): os.kill(pid, signal.SIGKILL)

def test_the_end_of_stdin_stops_a_runner_with_the_option_as_sigterm_does():
  r = RunnerProc("--exit-with-stdin", stdin=subprocess.PIPE)
  try:
    c = Raw(r.addr)
    c.ping()
    r.proc.stdin.close()
    assert r.proc.wait(10) == 0 and c.closed()
    log = r.log_text(0)
    assert "stopping: stdin closed, so the program that started the runner is gone (--exit-with-stdin); 1 sessions open" in log, log
    assert "session 1: ended: the runner stopped" in log, log
  finally: r.stop()

def test_a_runner_without_the_option_carries_on_when_its_stdin_closes():
  r = RunnerProc(stdin=subprocess.PIPE)
  try:
    c = Raw(r.addr)
    r.proc.stdin.close()
    time.sleep(1.5)   # the accept loop polls every half second
    c.ping()
    still_serving(r)
    assert "stopping" not in r.log_text(0)
  finally: r.stop()

def test_data_on_stdin_does_not_stop_it():
  r = RunnerProc("--exit-with-stdin", stdin=subprocess.PIPE)
  try:
    r.proc.stdin.write("anything\n" * 1000)
    r.proc.stdin.flush()
    time.sleep(1)
    still_serving(r)
  finally: r.stop()

def marked(marker:str) -> list[int]:
  """The processes whose environment carries marker (a program's, its children's and its local runner's: they inherit it)."""
  out = []
  for d in os.listdir("/proc"):
    if not d.isdigit() or gone(int(d)): continue
    try:
      if marker.encode() in open(f"/proc/{d}/environ", "rb").read(): out.append(int(d))
    except OSError: pass
  return out

@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc")
def test_ctrl_c_leaves_no_helpers_and_no_runner(tmp_path):
  """A program with a local runner and multiprocessing's helpers (a spawn pool, its resource tracker) stopped with Ctrl-C (SIGINT)
  leaves no process behind: not the runner, not a helper."""
  code = """
import multiprocessing as mp, time, client.remote_metal as rm
from tinygrad import Tensor
def square(x): return x * x
if __name__ == "__main__":
  assert (Tensor([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]
  pool = mp.get_context("spawn").Pool(2)
  assert pool.map(square, range(4)) == [0, 1, 4, 9]
  print(rm.local_runners[0].pid, flush=True)
  time.sleep(120)
"""
  marker = f"MR_TEST_MARK_{os.getpid()}_{time.monotonic_ns()}"
  env = {**{k: v for k, v in os.environ.items() if k not in OWN_VARS}, "PYTHONPATH": str(ROOT), "DEV": "REMOTE", marker: "1"}
  (prog := tmp_path / "prog.py").write_text(code)   # a file: spawn's children import the program's functions from it
  p = subprocess.Popen([sys.executable, str(prog)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    pid = int(p.stdout.readline() or 0) if select.select([p.stdout], [], [], 60)[0] else 0
    assert pid, p.communicate(timeout=30)[1][-3000:]
    assert len(marked(marker)) >= 4   # the program, its runner, two pool workers (and the resource tracker)
    os.kill(p.pid, signal.SIGINT)
    p.wait(timeout=20)
    deadline = time.monotonic() + 5
    while marked(marker) and time.monotonic() < deadline: time.sleep(0.05)
    assert not marked(marker), [open(f"/proc/{q}/cmdline").read().replace("\0", " ") for q in marked(marker)]
  finally:
    if p.poll() is None: p.kill()
    p.wait()
    p.stdout.close(); p.stderr.close()
    for q in marked(marker): os.kill(q, signal.SIGKILL)
