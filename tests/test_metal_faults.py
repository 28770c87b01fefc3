# The Metal backend (daemon/runner.m) where a real GPU differs from a CPU: failures only a GPU has (a lost device, a nil
# command buffer or encoder), when GPU work starts, what the compiler is told. Issue 20, item 3. Each test starts a runner
# of its own on the Metal emulator (tests/metal_emulator, a test harness) with a knob that makes the emulated GPU fail, or
# report, as its README describes; against a Mac's runner (METAL_RUNNER) they skip: the knobs are the emulator's.
import re, socket, struct, time
import pytest
from conftest import ROOT, metal_runner_proc, needs_own_metal_runner
from client import protocol as P
from wire import Raw

pytestmark = pytest.mark.metal

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
IDS = "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]"
# writes one float past the end of a 16-byte buffer: a page fault on the device
OOB = HEAD + f"kernel void oob(device float* out, {IDS}) {{ out[4 + gid.x] = 1.0f; }}\n"
ADD1 = HEAD + f"kernel void add1(device float* out, device float* a, {IDS}) {{ out[gid.x] = a[gid.x] + 1.0f; }}\n"
# about n dependent multiply-adds (no closed form a compiler could find), then a value that depends on all of them
SLOW = HEAD + (f"kernel void slow(device int* out, constant int& n, {IDS}) {{\n"
               "  uint acc = 1; for (int i = 0; i < n; i++) acc = acc * 1664525u + 1013904223u;\n"
               "  out[0] = (int)(acc | 1u);\n}\n")

def load(c:Raw, prog:int, src:str, nbufs:int, nvals:int=0) -> int:
  return c.load(prog, src.encode(), src.split("kernel void ", 1)[1].split("(", 1)[0], nbufs=nbufs, nvals=nvals, arch=0,
                kind=P.PROG_METAL_SOURCE)

def emulated(*args:str, **env):
  """A runner of this test's own on the Metal emulator, started with args, with env (the knobs) in its environment."""
  needs_own_metal_runner()
  r = metal_runner_proc(*args, env={k: str(v) for k, v in env.items()})
  if "emulator" not in Raw(r.addr).info["name"].rstrip(b"\0").decode():
    r.stop()
    pytest.skip("uses the Metal emulator's knobs (tests/metal_emulator/README.md); this runner is a real GPU's")
  return r

# *** d: compile options, set explicitly as tinygrad's -fno-fast-math means them, after the language version

def test_compile_options_are_explicit():
  r = emulated(METAL_EMU_TRACE=1)
  try:
    c = Raw(r.addr)
    load(c, 1, ADD1, 2)
    assert c.until_pong() == []
    c.close()
    log = r.wait_log("compile options set:")
  finally:
    r.stop()
  opts = re.search(r"compile options set: (.*)", log).group(1)
  # the language version first (mathMode's default depends on it), then both math settings; not the deprecated
  # fastMathEnabled, whose mapping left mathFloatingPointFunctions to the system
  assert opts == "languageVersion=4.0, mathMode=safe, mathFloatingPointFunctions=precise", opts

# *** a: a lost GPU (MTLCommandBufferError AccessRevoked 4, NotPermitted 7, DeviceRemoved 11: every later command buffer of the
# process fails) stops a runner with thread isolation, which says why to every session and exits non-zero, for its service
# manager to restart it. (Spawned session processes, the default, lose only their own: tests/test_metal_isolation.py.)

def final_error(c:Raw) -> tuple[int, int, str]:
  """The Rerror that ends a connection, then its end."""
  code, tag, text = c.error()
  assert c.closed(), "the runner kept the connection open after its final error"
  return code, tag, text

@pytest.mark.parametrize("code,name", [(4, "AccessRevoked"), (7, "NotPermitted"), (11, "DeviceRemoved")])
def test_gpu_loss_stops_the_runner(code, name):
  r = emulated("--isolation", "thread", METAL_EMU_FAIL=f"{code}@2")
  try:
    idle, c = Raw(r.addr), Raw(r.addr)          # idle: a session that only waits for its next request
    c.alloc(1, 64); c.alloc(2, 64)
    load(c, 1, ADD1, 2)
    c.launch(1, [(1, 0), (2, 0)], wait=True)   # command buffer 1 runs
    assert c.frame()[0] == P.RLAUNCH
    tag = c.launch(1, [(1, 0), (2, 0)], wait=True)   # command buffer 2: the GPU is lost
    ecode, etag, text = c.error()
    assert (ecode, etag) == (P.EDEVICE, tag) and f"MTLCommandBufferError{name} ({code})" in text and "lost" in text, text
    # then every session, this one and the idle one, gets a final EDEVICE (tag 0) naming the loss, and its connection ends
    for s in (c, idle):
      fcode, ftag, ftext = final_error(s)
      assert (fcode, ftag) == (P.EDEVICE, 0) and f"MTLCommandBufferError{name} ({code})" in ftext and "restart" in ftext, ftext
    # the runner stops accepting and exits with a failure status, so that launchd (KeepAlive: SuccessfulExit false) or
    # systemd (Restart=on-failure) starts it again
    r.proc.wait(timeout=10)
    assert r.proc.returncode == 1, r.proc.returncode
    with pytest.raises(OSError): socket.create_connection(("127.0.0.1", r.port), timeout=2).close()
  finally:
    r.stop()
  assert "lost" in r.log_text(0)

def test_gpu_loss_found_by_a_later_request():
  # the loss is found when the failed command buffer is reaped: a pipelined launch's failure reaches the next request
  # that waits (here Tsync), which gets the EDEVICE naming the loss
  r = emulated("--isolation", "thread", METAL_EMU_FAIL="11@1")
  try:
    c = Raw(r.addr)
    c.alloc(1, 64); c.alloc(2, 64)
    load(c, 1, ADD1, 2)
    c.launch(1, [(1, 0), (2, 0)])
    tag = c.req(P.TSYNC)
    code, etag, text = c.error()
    assert (code, etag) == (P.EDEVICE, tag) and "MTLCommandBufferErrorDeviceRemoved (11)" in text, text
    code, etag, text = final_error(c)
    assert (code, etag) == (P.EDEVICE, 0), text
    r.proc.wait(timeout=10)
    assert r.proc.returncode == 1
  finally:
    r.stop()

def test_the_python_client_reports_the_loss_and_does_not_try_to_resume():
  """The client's view (client/connection.py): the launch that saw the loss raises EDEVICE naming it; the next call raises the
  runner's last word (the tag-0 EDEVICE) as the reason the connection is gone, rather than trying to resume a session the exiting
  runner no longer holds and reporting only that nothing listens."""
  from client.connection import Runner, RunnerError
  r = emulated("--isolation", "thread", METAL_EMU_FAIL="11@2")
  try:
    c = Runner(r.addr)
    assert c.info.caps & P.CAP_RESUME
    c.alloc(1, 64); c.alloc(2, 64)
    c.load(1, P.PROG_METAL_SOURCE, "add1", ADD1.encode(), 2, 0)
    c.launch(1, [(1, 0), (2, 0)], [], wait=True)
    with pytest.raises(RunnerError) as first:
      c.launch(1, [(1, 0), (2, 0)], [], wait=True)
    assert first.value.code == P.EDEVICE and "DeviceRemoved (11)" in first.value.text, first.value
    with pytest.raises(RunnerError) as last:
      c.ping()
    assert last.value.code == P.EDEVICE and "restart" in last.value.text and c.stats()["resumes"] == 0, last.value
    with pytest.raises(RunnerError, match="unusable"): c.ping()
    r.proc.wait(timeout=10)
  finally:
    r.stop()

def test_other_gpu_errors_end_only_the_request():
  # a timeout (MTLCommandBufferErrorTimeout, 2) is one command buffer's failure: the session and the runner go on
  r = emulated(METAL_EMU_FAIL="2@1")
  try:
    c = Raw(r.addr)
    c.alloc(1, 64); c.alloc(2, 64)
    load(c, 1, ADD1, 2)
    tag = c.launch(1, [(1, 0), (2, 0)], wait=True)
    code, etag, text = c.error()
    assert (code, etag) == (P.EDEVICE, tag) and "Timeout" in text and "lost" not in text, text
    c.launch(1, [(1, 0), (2, 0)], wait=True)
    assert c.frame()[0] == P.RLAUNCH and r.alive()
    c.close()
  finally:
    assert r.stop() == 0   # SIGTERM: a clean stop

# *** c: a profiled launch (a command buffer per kernel) that fails part way, after its first kernels were committed

N_SLOW = 1_000_000_000   # about 0.1-0.2 s of the emulator's CPU per kernel

def lcg(n:int) -> int:
  """SLOW's result for n: the affine map x -> a x + c mod 2^32, applied n times to 1 (by squaring, not n steps)."""
  M, a, c, ra, rc = 1 << 32, 1664525, 1013904223, 1, 0
  while n:
    if n & 1: ra, rc = ra * a % M, (rc * a + c) % M
    a, c, n = a * a % M, (c * a + c) % M, n >> 1
  return struct.unpack("<i", struct.pack("<I", (ra + rc) % M | 1))[0]

def failing_graph_run(c:Raw) -> int:
  """A profiled graph run of three SLOW kernels, each a command buffer of its own (the profile is on), with the runner started
  with METAL_EMU_NIL_COMMAND_BUFFER=3: entries 0 and 1 are committed (command buffers 1 and 2), entry 2 gets none. Buffers 1-3
  are the entries' outputs. Returns the Tgraphrun's tag; it has no reply, its error comes ahead of the next reply."""
  for h in (1, 2, 3, 4): c.alloc(h, 16)
  load(c, 1, SLOW, 1, 1)
  c.req(P.TPROFILE, mode=P.PROFILE_ON, count=0); assert c.frame()[0] == P.RPROFILE
  c.req(P.TGRAPH, b"".join(P.launch_record(1, [(h, 0)], [N_SLOW]) for h in (1, 2, 3)), graph=1, count=3)
  return c.req(P.TGRAPHRUN, graph=1, count=0)

def profile(c:Raw) -> list[dict]:
  tag = c.req(P.TPROFILE, mode=P.PROFILE_ON, count=100)
  t, f, recs = c.frame()
  assert (t, f["tag"]) == (P.RPROFILE, tag), (P.TYPE_NAMES.get(t), f)
  return [P.PROF.unpack(recs[i * P.PROF.size:(i + 1) * P.PROF.size]) for i in range(f["count"])]

def test_read_after_a_graph_run_failing_part_way():
  r = emulated(METAL_EMU_NIL_COMMAND_BUFFER=3)
  try:
    c = Raw(r.addr)
    run = failing_graph_run(c)
    c.write(4, 0, b"abcd")
    tag = c.req(P.TREAD, handle=2, offset=0, count=4)
    code, etag, text = c.error()
    assert (code, etag) == (P.EDEVICE, run) and "command buffer" in text, text
    t, f, data = c.frame()
    assert (t, f["tag"]) == (P.RREAD, tag), (P.TYPE_NAMES.get(t), f)
    # Tread waits for launched work (protocol.md): entry 1 was committed, so its result is there. Before the fix the
    # failed run left the session's dirty flag unset, and this read did not wait for the entry still running
    assert struct.unpack("<i", data)[0] == lcg(N_SLOW), data
    # a failed request keeps no records; the write's and the read's are their own, each a few µs
    recs = profile(c)
    assert [x["kind"] for x in recs] == [P.PROF_WRITE, P.PROF_READ], recs
    for x in recs: assert 0 <= x["end"] - x["start"] < 50_000_000, x
    c.close()
  finally:
    r.stop()

def test_profile_records_after_a_graph_run_failing_part_way():
  r = emulated(METAL_EMU_NIL_COMMAND_BUFFER=3)
  try:
    c = Raw(r.addr)
    c.alloc(5, 16)
    load(c, 2, OOB, 1)
    run = failing_graph_run(c)
    # a launch that fails on the device after it was accepted: its record takes the place of the dropped records of the
    # run, and keeps start = end = 0 (protocol.md, Tprofile). Before the fix entry 0's command buffer still pointed at that
    # place and wrote its kernel's times into it
    c.launch(2, [(5, 0)])
    tag = c.req(P.TSYNC)
    errs = [c.error() for _ in range(2)]
    assert [(code, etag) for code, etag, _ in errs] == [(P.EDEVICE, run), (P.EDEVICE, tag)], errs
    assert "Address Fault" in errs[1][2], errs
    recs = profile(c)
    assert [(x["kind"], x["start"], x["end"]) for x in recs] == [(P.PROF_LAUNCH, 0, 0)], recs
    c.close()
  finally:
    r.stop()

# *** b: GPU work starts as it arrives: a command buffer is committed as soon as the session has read all the input that
# has arrived (when it flushes its replies), and holds at most MTL_BATCH (16) commands

def mtl_batch() -> int:
  """runner.m's MTL_BATCH: the most commands a command buffer holds."""
  return int(re.search(r"^#define MTL_BATCH (\d+)$", (ROOT / "daemon" / "runner.m").read_text(), re.M).group(1))

def test_the_manual_gives_the_batch_size_the_code_has():
  # issue 26, item 8: docs/metal.md said "every 64 commands" while runner.m commits after 16
  doc = (ROOT / "docs" / "metal.md").read_text()
  submission = re.search(r"^- Submission:(.*?)(?=^- |\Z)", doc, re.M | re.S).group(1)
  said = [int(n) for n in re.findall(r"(\d+)\s+commands", submission)]
  assert said == [mtl_batch()], (said, mtl_batch())

def commits(log:str) -> list[int]:
  """The command count of each commit the emulator traced (METAL_EMU_TRACE=1), in order."""
  return [int(n) for n in re.findall(r"metal emulator: commit \d+ \((\d+) commands\)", log)]

def test_first_kernel_of_a_burst_starts_before_the_burst_arrives():
  r = emulated(METAL_EMU_TRACE=1)
  try:
    c = Raw(r.addr)
    c.alloc(1, 16); c.alloc(2, 16)
    load(c, 1, SLOW, 1, 1)
    assert c.until_pong() == []
    c.launch(1, [(1, 0)], [1000])               # the burst's first launch; the rest is still crossing the network
    time.sleep(1.0)
    during = r.log_text(0)
    assert commits(during) == [1] and "command buffer 1 completed" in during, during
    for _ in range(3): c.launch(1, [(2, 0)], [1000])
    c.sync()
    c.close()
  finally:
    r.stop()

def test_a_command_buffer_holds_at_most_16_commands():
  r = emulated(METAL_EMU_TRACE=1)
  try:
    c = Raw(r.addr)
    c.alloc(1, 16)
    load(c, 1, SLOW, 1, 1)
    assert c.until_pong() == []
    # 40 launches and a Tsync in one send: the session reads them in one go (or a few)
    c.send(b"".join(P.pack(P.TLAUNCH, 1000 + i, 0, payload_len=len(P.launch_args([(1, 0)], [10])),
                           **P.launch_fields(1, [(1, 0)], [10])) + P.launch_args([(1, 0)], [10]) for i in range(40)))
    c.sync()
    c.close()
    n = commits(r.log_text(0))
  finally:
    r.stop()
  assert sum(n) == 40 and max(n) <= mtl_batch(), n

# *** f: the GPU family, the device chosen, and what a client sees at any log level

def test_apple10_family():
  # MTLGPUFamilyApple10 (1010, the macOS 26 SDK's MTLDevice.h): an M5's GPU answered "Apple9"
  r = emulated(METAL_EMU_FAMILY="Apple10")
  try: assert P.cstr(Raw(r.addr).info["arch"]) == "Apple10"
  finally: r.stop()

def test_fallback_device_is_not_the_low_power_one():
  # no system default device (a tool without CoreGraphics): of the devices MTLCopyAllDevices lists, the first that is not
  # low-power (a dual-GPU Intel Mac lists its integrated GPU first), not simply the first
  r = emulated(METAL_EMU_DEVICES=2, METAL_EMU_NO_DEFAULT_DEVICE=1)
  try: name = P.cstr(Raw(r.addr).info["name"])
  finally: r.stop()
  assert name == "Metal emulator (CPU, test harness)", name

def test_log_level_changes_nothing_a_client_sees():
  # -vv logs every kernel; it must not turn a pipelined launch into a waited one: a launch's device error is deferred to the
  # next request that waits (here Tsync) at every log level
  for args in ((), ("-vv",)):
    r = emulated(*args)   # the emulator's guard pages make the kernel fault; a GPU need not
    try:
      c = Raw(r.addr)
      c.alloc(1, 16)
      load(c, 1, OOB, 1)
      c.launch(1, [(1, 0)])
      tag = c.req(P.TSYNC)
      code, etag, text = c.error()
      assert (code, etag) == (P.EDEVICE, tag), (args, code, etag, text)
      c.sync()
      c.close()
    finally:
      r.stop()

# *** issue 26, item 2: Apple's compiler service (MTLCompilerService, reached over XPC) out of reach, as reported for Metal in
# launchd daemons: the runner finds out when it opens the device (it compiles a one-line kernel), says why and what to do in its
# log, and stops offering source; before, it advertised source, answered the handshake and failed every kernel

def test_unreachable_compiler_service_drops_the_source_capability():
  r = emulated(METAL_EMU_NO_COMPILER=1)
  try:
    c = Raw(r.addr)
    caps = c.info["caps"]
    assert caps & P.CAP_METALLIB and not caps & P.CAP_METAL_SOURCE, caps
    # a client that sends source anyway is refused at once (EKIND), not after a compile that cannot work
    tag = load(c, 1, ADD1, 2)
    errs = c.until_pong()
    assert [(code, etag) for code, etag, _ in errs] == [(P.EKIND, tag)] and "Metal source" in errs[0][2], errs
    c.close()
    log = r.log_text(0)
  finally:
    r.stop()
  # the log has the NSError's own text, what the runner does about it, and where the fix is
  line = next((ln for ln in log.splitlines() if "Unable to reach MTLCompilerService" in ln), None)
  assert line is not None, log
  assert "CAP_METAL_SOURCE" in line and "metallib" in line and "LaunchDaemon" in line and "docs/service.md" in line, line

def test_a_runner_that_can_compile_offers_source():
  r = emulated()
  try: caps = Raw(r.addr).info["caps"]
  finally: r.stop()
  assert caps & P.CAP_METALLIB and caps & P.CAP_METAL_SOURCE, caps
  assert "MTLCompilerService" not in r.log_text(0)

# *** issue 26, item 3: without reflection the runner checks no bindings (it says so); the emulator's validation layer then
# reports a misaligned offset as Apple's would (with MTL_DEBUG_LAYER=1 it would stop the process)

def test_without_reflection_a_misaligned_offset_reaches_the_validation_layer():
  r = emulated(METAL_EMU_NO_REFLECTION=1)
  try:
    c = Raw(r.addr)
    c.alloc(1, 64); c.alloc(2, 64)
    load(c, 1, ADD1, 2)
    tag = c.launch(1, [(1, 0), (2, 2)], wait=True)
    code, etag, text = c.error()
    assert (code, etag) == (P.EDEVICE, tag), text
    assert "Metal API Validation (emulated)" in text and "offset(2), which is not a multiple of its data type's size (4)" in text, text
    c.close()
  finally:
    r.stop()
  assert "no reflection for a pipeline, so its kernel's bindings and offsets are not checked" in r.log_text(0)

# *** issue 26, item 4: a freed buffer's memory stays counted until the GPU is done with it (protocol.md, Tfree)

MIB = 1 << 20

def test_tfree_keeps_the_memory_counted_until_the_gpu_is_done():
  # The device has 1 MiB (METAL_EMU_MEMORY), which is the runner's limit too. The client frees buffer 1 while a kernel that
  # uses it is still to run, then allocates buffer 2 of the same size: the first buffer's memory is the GPU's until the kernel
  # completes (the command buffer holds it), so the runner may not count it free before then. Before the fix Tfree returned
  # the reservation at once, Talloc passed the runner's count, and the device had no memory for it (ENOMEM)
  r = emulated(METAL_EMU_MEMORY=MIB)
  try:
    c = Raw(r.addr)
    assert c.info["memory"] == MIB, c.info
    load(c, 1, SLOW, 1, 1)
    c.alloc(1, 3 * MIB // 4)
    assert c.until_pong() == []
    c.launch(1, [(1, 0)], [N_SLOW])
    c.req(P.TFREE, handle=1)
    c.alloc(2, 3 * MIB // 4)
    c.launch(1, [(2, 0)], [1000])
    assert c.until_pong() == []
    assert struct.unpack("<i", c.read(2, 0, 4))[0] == lcg(1000)
    c.close()
  finally:
    r.stop()

def test_tfree_of_a_buffer_no_pending_work_uses_does_not_wait():
  # only the command buffers that use the freed buffer are waited for: freeing another buffer while they run is answered at
  # once (its Tping comes back while the kernels still run); freeing theirs comes back once they have completed
  r = emulated(METAL_EMU_TRACE=1)
  try:
    c = Raw(r.addr)
    c.alloc(1, 16); c.alloc(2, 16)
    load(c, 1, SLOW, 1, 1)
    assert c.until_pong() == []
    for _ in range(5): c.launch(1, [(1, 0)], [2**31 - 1])   # one command buffer, about 0.3 s of the emulator's CPU each
    assert c.until_pong() == []
    c.req(P.TFREE, handle=2)
    assert c.until_pong() == []
    assert "command buffer 1 completed" not in r.log_text(0), "freeing a buffer no kernel uses waited for the kernels"
    c.req(P.TFREE, handle=1)
    assert c.until_pong() == []
    r.wait_log("command buffer 1 completed", timeout=5)
    c.close()
  finally:
    r.stop()

# *** issue 35, item 3: a kernel that faults in a batch is named. Every command buffer is made with
# MTLCommandBufferErrorOptionEncoderExecutionStatus (macOS 11) and every compute pass is labelled after its kernel (a graph's
# one pass after all its kernels), so the failed command buffer's error says which encoder faulted (MTLCommandBufferEncoderInfo,
# errorState Faulted), where the EDEVICE text was the GPU's alone and any of the batch's kernels might have been the cause. The
# emulator gives the encoders' states for a fault (its guard page), a validation failure and METAL_EMU_REVOKE as its README says;
# what a Mac's GPU reports for each has not been seen

def kernel(i:int, bad:bool) -> str:
  body = "out[4 + gid.x] = 1.0f;" if bad else "out[gid.x] = 2.0f;"   # bad: one float past the end of a 16-byte buffer
  return HEAD + f"kernel void k{i}(device float* out, {IDS}) {{ {body} }}\n"

def batch_of_16(c:Raw, bad:int) -> int:
  """Kernels k0..k15 (k{bad} faults), launched in one send, then a Tsync: its tag."""
  for i in range(16):
    c.alloc(i + 1, 16)
    load(c, i + 1, kernel(i, i == bad), 1)
  assert c.until_pong() == []
  c.send(b"".join(P.pack(P.TLAUNCH, 1000 + i, 0, payload_len=len(P.launch_args([(i + 1, 0)], [])),
                         **P.launch_fields(i + 1, [(i + 1, 0)], [])) + P.launch_args([(i + 1, 0)], []) for i in range(16)))
  return c.req(P.TSYNC)

@pytest.mark.parametrize("bad", [0, 7, 15])
def test_the_kernel_that_faults_in_a_batch_is_named(bad):
  r = emulated(METAL_EMU_TRACE=1)
  try:
    c = Raw(r.addr)
    tag = batch_of_16(c, bad)
    code, etag, text = c.error()
    assert (code, etag) == (P.EDEVICE, tag) and "Address Fault" in text, text
    assert f"in kernel k{bad}:" in text and not re.search(rf"kernel k(?!{bad}\b)\d+", text), text
    c.sync()                                     # reported once
    c.close()
    assert max(commits(r.log_text(0))) > 1, r.log_text(0)   # the launches shared command buffers
  finally:
    r.stop()

def test_a_waited_launch_and_a_graph_name_their_kernels():
  r = emulated()
  try:
    c = Raw(r.addr)
    c.alloc(1, 16); c.alloc(2, 16)
    load(c, 1, kernel(1, False), 1); load(c, 2, kernel(2, True), 1)
    tag = c.launch(2, [(1, 0)], wait=True)
    code, etag, text = c.error()
    assert (code, etag) == (P.EDEVICE, tag) and "failed on the GPU in kernel k2:" in text, text
    # a graph is one pass (one encoder): Metal can name the pass, not which of its dispatches faulted
    c.req(P.TGRAPH, b"".join(P.launch_record(p, [(h, 0)], []) for p, h in ((1, 1), (2, 2), (1, 2))), graph=1, count=3)
    run = c.req(P.TGRAPHRUN, graph=1, count=0)
    tag = c.req(P.TSYNC)
    errs = c.until_pong()
    assert [(code, etag) for code, etag, _ in errs] in ([(P.EDEVICE, run)], [(P.EDEVICE, tag)]), errs
    assert "in a graph of 3 kernels: k1, k2, k1:" in errs[0][2], errs
    c.close()
  finally:
    r.stop()
