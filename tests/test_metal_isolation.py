# Metal sessions in processes of their own (issue 26, item 6; daemon/isolate.c): by default each session of a Metal runner is a
# fresh process of the runner started with posix_spawn, so a GPU that macOS takes from one session's process (AccessRevoked,
# after its work hangs) ends that session only; with --isolation thread every session is a thread of one process, and the
# same loss ends them all. On Linux this runs on the Metal emulator (tests/metal_emulator, a test harness), whose
# METAL_EMU_REVOKE=NAME revokes the GPU from the process that runs kernel NAME; no Mac has run it. Against a Mac's runner
# (METAL_RUNNER) these tests skip: they start runners of their own with the emulator's knob.
import os, pathlib, struct, time
import pytest
from conftest import metal_runner_proc, needs_own_metal_runner
from client import protocol as P
from wire import Raw

pytestmark = pytest.mark.metal

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
IDS = "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]"
ADD1 = HEAD + f"kernel void add1(device float* out, device float* a, {IDS}) {{ out[gid.x] = a[gid.x] + 1.0f; }}\n"
# the kernel whose command buffer the emulator fails with AccessRevoked (METAL_EMU_REVOKE=hang), as a Mac would one that hung
HANG = HEAD + f"kernel void hang(device float* out, {IDS}) {{ out[0] = 1.0f; }}\n"

def load(c:Raw, prog:int, src:str, nbufs:int):
  c.load(prog, src.encode(), src.split("kernel void ", 1)[1].split("(", 1)[0], nbufs=nbufs, nvals=0, arch=0, kind=P.PROG_METAL_SOURCE)

def add1(c:Raw) -> list[float]:
  """One waited add1 launch over buffers 1 and 2 of c: what it wrote, or fails with the Rerror."""
  tag = c.launch(1, [(1, 0), (2, 0)], (), (4, 1, 1), (1, 1, 1), wait=True)
  t, f, p = c.frame()
  assert t == P.RLAUNCH and f["tag"] == tag, (P.TYPE_NAMES.get(t), f, p)
  return list(struct.unpack("<4f", c.read(1, 0, 16)))

def session(addr:str) -> Raw:
  c = Raw(addr)
  c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, struct.pack("<4f", 1, 2, 3, 4))
  load(c, 1, ADD1, 2)
  return c

def session_pids(runner_pid:int) -> list[int]:
  """The runner's children that are spawned session processes (Linux /proc)."""
  out = []
  for d in pathlib.Path("/proc").iterdir():
    if not d.name.isdigit(): continue
    try:
      stat = (d / "stat").read_text()
      if int(stat.rsplit(")", 1)[1].split()[1]) == runner_pid and b"--session-spawn" in (d / "cmdline").read_bytes(): out.append(int(d.name))
    except (OSError, ValueError, IndexError): pass
  return out

@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="counts processes in /proc")
@pytest.mark.parametrize("iso", [None, "process", "thread"])
def test_a_metal_session_is_a_process_of_its_own_unless_thread_isolation_is_asked(iso):
  needs_own_metal_runner()
  r = metal_runner_proc(*(("--isolation", iso) if iso else ()))
  try:
    a, b = session(r.addr), session(r.addr)
    assert add1(a) == add1(b) == [2.0, 3.0, 4.0, 5.0]
    pids = session_pids(r.proc.pid)
    if iso == "thread":
      assert pids == [] and "thread isolation" in r.log_text(0)
    else:   # the default, and what process isolation means for Metal (it cannot fork): spawned, one process per session
      assert len(pids) == 2 and "process (spawned) isolation" in r.log_text(0), (pids, r.log_text(0))
    a.close(); b.close()
  finally:
    r.stop()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_revoked_gpu_access_ends_only_its_session_with_process_isolation(iso):
  needs_own_metal_runner()
  r = metal_runner_proc("--isolation", iso, env={"METAL_EMU_REVOKE": "hang"})
  try:
    other, bad = session(r.addr), session(r.addr)
    assert add1(other) == [2.0, 3.0, 4.0, 5.0]
    load(bad, 2, HANG, 1)
    tag = bad.launch(2, [(1, 0)], (), (1, 1, 1), (1, 1, 1), wait=True)
    code, etag, text = bad.error()
    assert (code, etag) == (P.EDEVICE, tag) and "MTLCommandBufferErrorAccessRevoked (4)" in text and "lost" in text, text
    code, etag, text = bad.error()        # its session ends, saying why
    assert (code, etag) == (P.EDEVICE, 0) and "AccessRevoked" in text and bad.closed(), text
    if iso == "process":
      # the other session's process still has the GPU: it goes on running kernels, and the runner takes new sessions
      other.write(2, 0, struct.pack("<4f", 10, 20, 30, 40))
      assert add1(other) == [11.0, 21.0, 31.0, 41.0]
      third = session(r.addr)
      assert add1(third) == [2.0, 3.0, 4.0, 5.0]
      third.close(); other.close()
      assert r.alive()
      r.wait_log("ended: the device was lost to its process; the other sessions go on")
    else:
      # one process: the loss is every session's, and the runner exits for its service manager to restart it
      code, etag, text = other.error()
      assert (code, etag) == (P.EDEVICE, 0) and "AccessRevoked" in text and other.closed(), text
      r.proc.wait(timeout=10)
      assert r.proc.returncode == 1
  finally:
    r.stop()

def refused(addr:str) -> str:
  """A session the runner refuses before its handshake: the Rerror's text."""
  from client.connection import Runner, RunnerConnectionError, RunnerError
  with pytest.raises((RunnerError, RunnerConnectionError)) as e:
    with Runner(addr, timeout=10) as c: c.ping()
  return str(e.value)

def test_a_gpu_gone_for_new_processes_stops_the_runner_after_three_sessions_in_a_row(tmp_path):
  # each spawned session opens the device itself: once the GPU is gone (an eGPU unplugged; METAL_EMU_GONE: while the file
  # exists, a process that looks finds none) every new session is refused. Before, the runner went on taking and refusing
  # sessions, and advertising a GPU it could not give; now three in a row stop it, exit status 1, for its service manager
  needs_own_metal_runner()
  gone = tmp_path / "gone"
  r = metal_runner_proc(env={"METAL_EMU_GONE": str(gone)})
  try:
    gone.touch()
    for _ in range(2): assert "cannot open the device for this session" in refused(r.addr)
    gone.unlink()                         # back: a session that opens it makes the count start again
    a = session(r.addr)
    assert add1(a) == [2.0, 3.0, 4.0, 5.0]
    a.close()
    r.wait_log("session 3: ended")
    gone.touch()
    for _ in range(2): assert "cannot open the device for this session" in refused(r.addr)
    time.sleep(1.2)                       # two turns of the accept loop, which reaps
    assert r.alive(), r.log_text(0)
    assert "cannot open the device for this session" in refused(r.addr)
    r.proc.wait(timeout=10)
    assert r.proc.returncode == 1
    log = r.log_text(0)
    assert "3 sessions in a row could not open the metal device" in log and "no Metal device found" in log, log
  finally:
    r.stop()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_sessions_with_a_cache_open_the_device_in_a_process_that_did_not_fork(tmp_path, iso):
  # Apple's fork(2): after fork() nothing of a framework is safe in the child until it execs (a forked daemon's Metal compiles
  # fail: "Unable to reach MTLCompilerService", btxchain/btx#51). With --cache-dir each session process forks a cache helper
  # before it opens the device; the session opened it in the forked child, so on a Mac every session of such a runner could
  # lose Metal source or the device. The emulator refuses Metal in a child of fork() that has not exec'd, as a model of that
  # rule; the session must stay in the spawned (exec'd) process and the helper, which never touches Metal, be the child
  needs_own_metal_runner()
  r = metal_runner_proc("--isolation", iso, "--cache-dir", str(tmp_path / "cache"))
  try:
    for _ in range(2):
      c = session(r.addr)
      assert c.info["caps"] & P.CAP_METAL_SOURCE and c.info["caps"] & P.CAP_CACHE, c.info
      assert add1(c) == [2.0, 3.0, 4.0, 5.0]
      c.close()
    assert r.alive() and "a child of fork()" not in r.log_text(), r.log_text(0)
  finally:
    r.stop()

@pytest.mark.parametrize("compiler", [True, False])
def test_spawned_sessions_take_the_runners_probe_instead_of_compiling_it_again(compiler):
  # the runner compiles a one-line kernel when it opens the device, and offers Metal source only if that compiles (issue 35
  # item 2). A spawned session opens the device again; it takes the runner's answer, handed down, instead of compiling the
  # probe again in every session. METAL_EMU_TRACE logs each source compile; METAL_EMU_NO_COMPILER=1 fails every one
  needs_own_metal_runner()
  env = {"METAL_EMU_TRACE": "1", **({} if compiler else {"METAL_EMU_NO_COMPILER": "1"})}
  r = metal_runner_proc(env=env)
  try:
    for _ in range(2):
      c = Raw(r.addr)
      assert bool(c.info["caps"] & P.CAP_METAL_SOURCE) == compiler, c.info
      c.ping()
      if compiler:
        c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, struct.pack("<4f", 1, 2, 3, 4))
        load(c, 1, ADD1, 2)
        assert add1(c) == [2.0, 3.0, 4.0, 5.0]
      c.close()
    log = r.wait_log("session 2: ended")
    compiles = log.count("newLibraryWithSource: compile options set")
    probes = log.count("a one-line test kernel does not compile here")
    assert (compiles, probes) == ((3, 0) if compiler else (0, 1)), log   # the runner's probe, then one add1 per session
  finally:
    r.stop()

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_the_runner_lets_go_of_the_gpu_its_sessions_do_not_use(iso):
  # issue 35 item 3: with process isolation the runner's own process opens the device only to learn what Rhello says (and to
  # compile its probe); every session's process opens its own. Holding it for nothing keeps a dual-GPU Intel MacBook's
  # discrete GPU powered while the runner serves. It is released after the probe; with thread isolation the first session
  # takes it again and the process keeps it. METAL_EMU_DEVICES=2 is the dual-GPU Mac (device 1 the discrete, the system
  # default); the emulator logs in which process each device is taken and when the last reference to it goes
  needs_own_metal_runner()
  r = metal_runner_proc("--isolation", iso, env={"METAL_EMU_DEVICES": "2"})
  try:
    pid = r.proc.pid
    taken, released = f"(device 1 taken in process {pid})", f"device 1 released in process {pid}:"
    log = r.wait_log(taken, released)   # the runner's stderr is read by a thread of the test: under load it can lag the start
    assert log.count(taken) == 1 and log.count(released) == 1 and log.index(taken) < log.index(released), log
    a, b = session(r.addr), session(r.addr)
    assert add1(a) == add1(b) == [2.0, 3.0, 4.0, 5.0]
    if iso == "thread":   # taken again by the first session, and kept: the second shares it
      deadline = time.monotonic() + 10
      while (log:=r.log_text(0)).count(taken) < 2 and time.monotonic() < deadline: time.sleep(0.05)
      assert log.count(taken) == 2 and log.count(released) == 1, r.log_text()
    else:                 # never again in the runner's process; each session's process took it
      assert len(set(pids:=session_pids(pid))) == 2, pids
      log = r.wait_log(*[f"(device 1 taken in process {p})" for p in pids])
      assert log.count(taken) == 1 and log.count(released) == 1, r.log_text()
    a.close(); b.close()
  finally:
    r.stop()

def test_a_session_with_a_cache_helper_compiles_a_kernel_never_compiled_before(tmp_path):
  # a session with --cache-dir forks its cache helper and ignores SIGCHLD (the kernel reaps the helper); the emulator's compiler
  # (clang, spawned by the session to compile a kernel) inherited that and lost its own children's status: a kernel not yet in
  # the emulator's disk cache failed to load ("cannot fill its cache"). METAL_EMU_CACHE: an empty cache, so add1 is compiled
  needs_own_metal_runner()
  r = metal_runner_proc("--cache-dir", str(tmp_path / "cache"), env={"METAL_EMU_CACHE": str(tmp_path / "emu")})
  try:
    c = session(r.addr)
    assert add1(c) == [2.0, 3.0, 4.0, 5.0]
    c.close()
  finally:
    r.stop()
