"""The daemon as a black box over a real loopback socket, beyond what protocol.md states: clients sending garbage alongside a
working one, memory that follows the bytes that arrived, the log of a closing session, a clean shutdown on a signal.

Every protocol.md statement (each request's errors, framing, pipelining, handles, limits, isolation) is a case of the
conformance suite, tests/conformance, which runs against these runners and against any other by address.
"""
import os, signal, socket, struct, sys, threading, time
import pytest
from client import protocol as P
from runner_proc import RunnerProc, runner, session_pids
from wire import Raw, compile_kernel, f32, still_serving, ADD1

pytestmark = pytest.mark.cpu_only

@pytest.fixture(scope="module", params=["process", "thread"])
def rp(request):
  with runner("--isolation", request.param, "--frame-timeout", "2") as r: yield r

@pytest.fixture(scope="module")
def add1(): return compile_kernel(ADD1, "add1")

def test_closing_session_logs_what_it_frees():
  """The behaviour (the memory comes back) is the conformance case test_closing_the_connection_frees_everything_it_held."""
  with runner("--isolation", "thread", "-v") as r:
    a = Raw(r.addr)
    a.alloc(1, 800 << 10); a.ping()
    a.s.shutdown(socket.SHUT_RDWR); a.close()
    deadline = time.monotonic() + 5
    while "closing, freeing 1 buffers (819200 bytes)" not in r.log_text() and time.monotonic() < deadline: time.sleep(0.05)
    assert "closing, freeing 1 buffers (819200 bytes)" in r.log_text()

def test_requests_before_auth_and_concurrent_garbage_do_not_disturb_others(rp, add1):
  """Many clients sending garbage while one does real work: the worker's results stay correct."""
  arch, img, entry = add1
  stop = threading.Event()
  def garbage(seed):
    import random
    rnd = random.Random(seed)
    while not stop.is_set():
      try:
        c = Raw(rp.addr, hello=rnd.random() < 0.5, timeout=2)
        c.send(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 200))))
        c.close()
      except (OSError, EOFError, AssertionError): pass
  ts = [threading.Thread(target=garbage, args=(i,)) for i in range(3)]
  for t in ts: t.start()
  try:
    c = Raw(rp.addr)
    c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, f32(1, 2, 3, 4))
    c.load(1, img, "add1", nbufs=2, nvals=1, entry=entry)
    for _ in range(50):
      c.launch(1, [(1, 0), (2, 0)], [4])
      assert c.read(1, 0, 16) == f32(2, 3, 4, 5)
  finally:
    stop.set()
    for t in ts: t.join()
  still_serving(rp)

def vm_size_kb(pid:int) -> int:
  with open(f"/proc/{pid}/status") as f: return next(int(l.split()[1]) for l in f if l.startswith("VmSize:"))

@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs /proc")
def test_memory_follows_bytes_that_arrived_not_the_declared_size():
  """A header declaring a 60 MiB frame, then a trickle of small packets: the session's input buffer must not grow to 60 MiB."""
  with runner("--isolation", "process") as r:
    c = Raw(r.addr)
    c.ping()
    (child,) = session_pids(r)                 # the session process, not the peer broker
    before = vm_size_kb(child)
    c.send(P.pack(P.TPING, 1, payload_len=60 << 20, count=60 << 20))
    for _ in range(200):
      c.send(b"x" * 512)
      time.sleep(0.001)
    time.sleep(0.2)
    grown = vm_size_kb(child) - before
    assert grown < 4096, f"session grew {grown} KiB of address space for 100 KiB received"
    still_serving(r)

@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_clean_shutdown_on_signal(sig):
  import signal
  r = __import__("runner_proc").RunnerProc("-v")
  c = Raw(r.addr)
  c.alloc(1, 16); c.ping()
  r.proc.send_signal(getattr(signal, sig))
  assert r.proc.wait(10) == 0
  assert c.closed()
  log = r.log_text()
  assert "stopping on " + sig + ": 1 sessions open" in log and "warning" not in log
  r.stop()

# A kernel that sleeps out[0] seconds in nanosleep(2): a session thread busy in a kernel for a known time (x86-64 Linux calls).
SLEEP = """void nap(long* restrict out) {
  long ts[2] = { out[0], 0 }; long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(35L), "D"(ts), "S"(0L) : "rcx", "r11", "memory");
}"""
x86_linux = pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
                               reason="the kernel makes an x86-64 Linux system call")

def napping_thread_runner(seconds:int) -> tuple[RunnerProc, Raw]:
  """A thread-isolation runner whose one session is inside a kernel that sleeps for seconds."""
  _, img, entry = compile_kernel(SLEEP, "nap")
  r = RunnerProc("-v", "--isolation", "thread")
  c = Raw(r.addr)
  c.alloc(1, 16); c.write(1, 0, struct.pack("<q", seconds))
  c.load(1, img, "nap", entry=entry)
  c.launch(1, [(1, 0)], wait=True)
  time.sleep(0.5)               # the session thread is in the kernel
  return r, c

@x86_linux
def test_stop_waits_for_a_session_thread_in_a_kernel():
  # a thread cannot be interrupted, and uses the backend until its kernel returns: mr_serve() must not free it under it
  r, c = napping_thread_runner(7)
  try:
    t0 = time.monotonic()
    r.proc.send_signal(signal.SIGTERM)
    assert r.proc.wait(20) == 0
    assert time.monotonic() - t0 > 6, "the runner returned while a session thread still ran its kernel"
    assert c.closed()
    log = r.log_text(0)
    assert "waiting for 1 session threads still running a kernel" in log and "stopping on SIGTERM: 1 sessions open" in log
  finally: r.stop()

@x86_linux
def test_a_second_stop_signal_ends_a_runner_waiting_for_a_kernel():
  r, c = napping_thread_runner(60)
  try:
    r.proc.send_signal(signal.SIGINT)
    r.wait_log("waiting for 1 session threads still running a kernel")
    r.proc.send_signal(signal.SIGINT)
    assert r.proc.wait(5) == -signal.SIGINT
  finally: r.stop()

def test_kernel_timeout_with_thread_isolation_says_it_has_no_effect():
  with runner("--isolation", "thread", "--kernel-timeout", "3") as r:
    r.wait_log("--kernel-timeout has no effect with thread isolation (the cpu backend): a session thread cannot be stopped")
  with runner("--kernel-timeout", "3") as r:
    assert "--kernel-timeout" not in r.log_text()

def test_a_resume_log_outside_64k_to_4g_is_refused_at_start_up():
  """protocol.md, Limits: --resume-log is 64 KiB to 4 GiB; a value outside is not clamped, the runner does not start."""
  import subprocess
  from runner_proc import build
  for v in ("0", "65535", "63K", "4294967297", "5G"):
    p = subprocess.run([str(build()), "--host", "127.0.0.1", "--port", "0", "--resume-log", v], capture_output=True, text=True, timeout=10)
    assert (p.returncode, p.stdout) == (2, ""), (v, p.returncode, p.stdout, p.stderr)
    assert f"bad value for --resume-log: {v}" in p.stderr, p.stderr
  for v in ("64K", "4G"):   # the bounds themselves are accepted
    with runner("--resume-log", v) as r: assert Raw(r.addr).ping(b"up") == b"up"

# *** what the runner's log and messages say to the person who reads them

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_normal_client_exit_is_logged_as_an_ordinary_end_of_session(iso):
  """The client library's close sends Tresumekey OFF and closes at once; the Rresumekey then meets a closed socket, which the client's
  kernel answers with a reset. That reset, or a plain end of stream, is how every client leaves: not an error."""
  from client.connection import Runner
  with runner("--isolation", iso, "-v") as r:
    for _ in range(5):
      with Runner(r.addr) as c: c.ping(b"x")
    log = r.wait_log(*(f"session {i}: ended: the client disconnected" for i in range(1, 6)))
    assert "recv:" not in log and "reset by peer" not in log and "warning" not in log, log

@pytest.mark.parametrize("where", ["between frames", "mid-frame"])
def test_a_reset_connection_is_an_end_of_session_between_frames_and_named_mid_frame(where):
  with runner("--isolation", "thread", "-v") as r:
    c = Raw(r.addr)
    c.ping()
    if where == "mid-frame": c.send(P.pack(P.TPING, 1, payload_len=100, count=100) + b"half")
    time.sleep(0.2)
    c.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close sends RST
    c.s.close()
    log = r.wait_log("session 1: ended: the client disconnected (connection reset)" if where == "between frames" else
                     "session 1: connection reset mid-frame")
    assert "recv:" not in log and "warning" not in log, log
    still_serving(r)

def test_a_port_in_use_is_an_error_that_says_what_to_do():
  import subprocess
  from runner_proc import build
  with runner() as r:
    p = subprocess.run([str(build()), "--host", "127.0.0.1", "--port", str(r.port)], capture_output=True, text=True, timeout=10)
  assert p.returncode == 1 and p.stdout == "", (p.returncode, p.stdout)
  line = next(l for l in p.stderr.splitlines() if "cannot listen" in l)
  assert "warning" not in p.stderr and " error: " in line, p.stderr
  assert f"cannot listen on 127.0.0.1:{r.port}: Address already in use" in line and "--port 0" in line and "another runner" in line, line

@pytest.mark.parametrize("args,bad", [(["--prot", "6667"], "--prot"), (["-x"], "x"), (["--port"], "--port"), (["stray"], "stray")])
def test_a_mistyped_option_prints_one_line_and_the_usage_not_the_help(args, bad):
  import subprocess
  from runner_proc import build
  p = subprocess.run([str(build()), *args], capture_output=True, text=True, timeout=10)
  assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout)
  lines = p.stderr.splitlines()
  assert len(lines) <= 3 and bad in lines[0], p.stderr
  assert lines[-1] == "usage: metal_runner [options]; see metal_runner --help", p.stderr

@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and two CPUs")
def test_a_runner_started_on_one_cpu_runs_kernels_on_one_thread():
  """Rhello ncores (the threads a kernel's core number ranges over) follows the CPUs the runner may use (taskset, a cpuset), not
  the machine's: two runners pinned to a CPU each (the benchmark's two machines) do not fight over both."""
  cpu = min(os.sched_getaffinity(0))
  old = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {cpu})   # the runner inherits it
  try: r = RunnerProc()
  finally: os.sched_setaffinity(0, old)
  try:
    c = Raw(r.addr, hello=False)
    assert c.hello()["ncores"] == 1
  finally: r.stop()

@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads descriptors in /proc")
@pytest.mark.parametrize("iso", ["process", "spawn"])
@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_runner_started_with_stdin_stdout_or_stderr_closed_serves(tmp_path, closed, iso):
  """Started with one of fds 0-2 closed (a service manager, a parent that closed it), the runner puts /dev/null there. Before,
  the first file it opened took the number: its "listening on" and log lines went into the session table's shared memory
  (with stderr closed it crashed at start), and on macOS every spawned session was refused (posix_spawn's inherit action
  fails on a closed descriptor). With the cache, which forks a helper in each session."""
  import re, subprocess
  from runner_proc import build
  out_r, out_w = os.pipe()      # the runner's stdout and stderr, but for the closed one
  p = subprocess.Popen([str(build()), "--host", "127.0.0.1", "--port", "0", "--isolation", iso, "--cache-dir", str(tmp_path / "c")],
                       stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, preexec_fn=lambda: os.close(closed))
  os.close(out_w)
  try:
    log, deadline = b"", time.monotonic() + 10
    while not (m := re.search(rb"listening on 127\.0\.0\.1:(\d+)\n", log)) and p.poll() is None and time.monotonic() < deadline:
      log += os.read(out_r, 4096)
    assert m, (p.poll(), log)
    fds = lambda pid: [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in range(3)]
    assert fds(p.pid)[closed] == "/dev/null", fds(p.pid)
    c = Raw(f"127.0.0.1:{m[1].decode()}")
    data = os.urandom(1 << 20)
    c.alloc(1, len(data))
    c.req(P.TWRITE, data, flags=P.FCACHE, handle=1, offset=0, count=len(data))
    assert c.read(1, 0, len(data)) == data
    kids = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
    sess = [int(k) for k in kids if open(f"/proc/{k}/comm").read().strip() != "mr_peer_broker"]
    assert len(sess) == 1 and fds(sess[0])[closed] == "/dev/null", (sess, sess and fds(sess[0]))
    c.close()
    if closed != 2:   # the log reaches stderr
      os.set_blocking(out_r, False)
      deadline = time.monotonic() + 5
      while b"session 1: ended" not in log and time.monotonic() < deadline:
        try: log += os.read(out_r, 4096)
        except BlockingIOError: time.sleep(0.05)
      assert b"session 1: ended" in log, log
  finally:
    if p.poll() is None: os.kill(p.pid, signal.SIGTERM)
    p.wait(10)
    os.close(out_r)
  assert p.returncode == 0
