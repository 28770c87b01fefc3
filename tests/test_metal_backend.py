# The Metal backend (daemon/runner.m) over the wire protocol, with Metal source written here. On Linux it runs on the Metal
# emulator (tests/metal_emulator, a test harness); against a Mac's runner (METAL_RUNNER) the same tests run on its GPU, except
# the ones marked emulator_only, which read the emulator's own reports.
import struct
import pytest
from conftest import is_emulator, metal_runner_proc, needs_own_metal_runner
from client import protocol as P
from wire import Raw

pytestmark = pytest.mark.metal

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
IDS = "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]"
PUT64 = HEAD + f"kernel void put64(device long* out, constant long& v, {IDS}) {{ out[0] = v; }}\n"
PUT32 = HEAD + f"kernel void put32(device int* out, constant int& v, {IDS}) {{ out[0] = v * 2; }}\n"
ADD1 = HEAD + f"kernel void add1(device float* out, device float* a, {IDS}) {{ out[gid.x] = a[gid.x] + 1.0f; }}\n"
# writes one float past the end of a 16-byte buffer
OOB = HEAD + f"kernel void oob(device float* out, {IDS}) {{ out[4 + gid.x] = 1.0f; }}\n"
# writes its first buffer only: the second may be an empty range
FIRST = HEAD + f"kernel void first(device float* out, device float* unused, {IDS}) {{ out[0] = 42.0f; }}\n"
VERSION = HEAD + f"kernel void version(device int* out, {IDS}) {{ out[0] = __METAL_VERSION__; }}\n"

def load(c:Raw, prog:int, src:str, nbufs:int, nvals:int=0, wide:int=0, kind:int=P.PROG_METAL_SOURCE, name:str|None=None) -> int:
  name = name or src.split("kernel void ", 1)[1].split("(", 1)[0]
  return c.load(prog, src.encode(), name, nbufs=nbufs, nvals=nvals, arch=0, entry=wide, kind=kind)

def launched(c:Raw, prog:int, bufs, vals=(), g=(1, 1, 1), l=(1, 1, 1)) -> int:
  """A launch with FWAIT: the Rlaunch's ns, or fails with the Rerror."""
  tag = c.launch(prog, bufs, vals, g, l, wait=True)
  t, f, p = c.frame()
  assert t == P.RLAUNCH and f["tag"] == tag, (P.TYPE_NAMES.get(t), f, p)
  return f["ns"]

def launch_error(c:Raw, prog:int, bufs, vals=(), g=(1, 1, 1), l=(1, 1, 1)) -> tuple[int, str]:
  tag = c.launch(prog, bufs, vals, g, l, wait=True)
  code, etag, text = c.error()
  assert etag == tag
  return code, text

@pytest.fixture
def c(metal_addr):
  conn = Raw(metal_addr)
  yield conn
  conn.close()

def test_hello(c):
  assert c.info["backend"] == P.BACKEND_METAL and c.info["caps"] & P.CAP_METAL_SOURCE
  assert c.info["arch"].rstrip(b"\0").decode().startswith(("Apple", "Mac"))

def test_kernel_runs_and_is_timed(c):
  c.alloc(1, 64); c.alloc(2, 64)
  c.write(2, 0, struct.pack("<16f", *range(16)))
  load(c, 7, ADD1, 2)
  assert launched(c, 7, [(1, 0), (2, 0)], g=(16, 1, 1)) > 0
  assert struct.unpack("<16f", c.read(1, 0, 64)) == tuple(float(i + 1) for i in range(16))

# *** defect a: an integer value is bound with the width its kernel declares

def test_64bit_value(c):
  # MetalRenderer declares a variable whose range passes int32 as `constant long&`; Tload.entry marks it (bit 0: value 0 is 64-bit)
  c.alloc(1, 8)
  load(c, 1, PUT64, 1, 1, wide=1)
  for v in (2**40 + 3, -(2**35), 7):
    launched(c, 1, [(1, 0)], [v])
    assert struct.unpack("<q", c.read(1, 0, 8))[0] == v

def test_32bit_value_range_is_checked(c):
  c.alloc(1, 4)
  load(c, 1, PUT32, 1, 1)
  launched(c, 1, [(1, 0)], [-21])
  assert struct.unpack("<i", c.read(1, 0, 4))[0] == -42
  code, text = launch_error(c, 1, [(1, 0)], [2**32])
  assert code == P.EDEVICE and "does not fit the kernel's 32-bit int" in text, text

def test_width_mask_past_the_values(c):
  load(c, 1, PUT64, 1, 1, wide=0b10)
  code, tag, text = c.errors(1)[0]
  assert code == P.EPROGRAM and "value widths" in text, text

# *** issue 26, 3: the bindings a Tload states are checked against the pipeline's reflection, and each offset against its alignment

@pytest.mark.parametrize("src,wide,got,said", [(PUT64, 0, 8, 4), (PUT32, 1, 4, 8)], ids=["long-as-4", "int-as-8"])
def test_value_width_that_differs_from_the_kernel_is_eprogram(c, src, wide, got, said):
  # before: the Tload was taken, and the launch bound 4 bytes for a constant long& (the validation layer failed it, or stopped the
  # process under MTL_DEBUG_LAYER=1; without the layer the kernel reads past its binding)
  load(c, 1, src, 1, 1, wide=wide)
  code, _, text = c.errors(1)[0]
  assert code == P.EPROGRAM and f"value 0 (index 1) is {got} bytes in the kernel, Tload says {said}" in text, text

@pytest.mark.parametrize("nbufs,nvals", [(1, 0), (3, 0), (2, 1)])
def test_binding_count_that_differs_from_the_kernel_is_eprogram(c, nbufs, nvals):
  load(c, 1, ADD1, nbufs, nvals)
  code, _, text = c.errors(1)[0]
  assert code == P.EPROGRAM and f"kernel add1 binds 2 buffers, Tload says {nbufs + nvals} ({nbufs} buffers and {nvals} values)" in text, text
  c.alloc(1, 64)
  code, text = launch_error(c, 1, [(1, 0)] * nbufs, [0] * nvals)      # nothing was loaded
  assert code == P.EHANDLE, text

def test_binding_indices_with_a_gap_are_eprogram(c):
  gap = HEAD + f"kernel void gap(device float* out [[buffer(0)]], device float* a [[buffer(2)]], {IDS}) {{ out[0] = a[0]; }}\n"
  load(c, 1, gap, 2)
  code, _, text = c.errors(1)[0]
  assert code == P.EPROGRAM and "kernel gap binds no buffer at index 1" in text, text

def test_a_cached_pipeline_is_checked_for_each_load(c):
  load(c, 1, ADD1, 2)                                  # compiles, and fills the cache
  load(c, 2, ADD1, 1)                                  # the same program from the cache, stated wrong
  code, _, text = c.errors(1)[0]
  assert code == P.EPROGRAM and "binds 2 buffers, Tload says 1" in text, text

HALF = HEAD + f"kernel void halves(device half* out, device float4* a, {IDS}) {{ out[0] = (half)a[0].x; }}\n"

@pytest.mark.parametrize("args,index,offset,align", [([(1, 2), (2, 16)], 0, 2, 0), ([(1, 1), (2, 0)], 0, 1, 2),
                                                     ([(1, 0), (2, 8)], 1, 8, 16), ([(1, 0), (2, 4)], 1, 4, 16)])
def test_offset_not_aligned_to_the_data_type_is_einval(c, args, index, offset, align):
  c.alloc(1, 64); c.alloc(2, 64)
  load(c, 1, HALF, 2)
  if align == 0:                                       # aligned: it runs
    launched(c, 1, args)
    return
  code, text = launch_error(c, 1, args)
  assert code == P.EINVAL and f"kernel halves argument {index}: offset {offset} is not a multiple of {align}" in text, text
  launched(c, 1, [(1, 2), (2, 32)])                    # the session goes on

def test_offset_not_aligned_in_a_graph_run_is_einval(c):
  c.alloc(1, 64); c.alloc(2, 64)
  load(c, 1, ADD1, 2)
  c.req(P.TGRAPH, P.launch_record(1, [(1, 0), (2, 4)], []) * 2, graph=1, count=2)
  tag = c.req(P.TGRAPHRUN, flags=P.FWAIT, graph=1, count=0)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RGRAPHRUN, tag), (P.TYPE_NAMES.get(t), f)
  tag = c.req(P.TGRAPHRUN, P.patch(1, P.PATCH_BUF, 1, handle=2, value=6), flags=P.FWAIT, graph=1, count=1)
  code, etag, text = c.error()
  assert (code, etag) == (P.EINVAL, tag) and "kernel add1 argument 1: offset 6 is not a multiple of 4" in text, text
  tag = c.req(P.TGRAPHRUN, P.patch(1, P.PATCH_BUF, 1, handle=2, value=8), flags=P.FWAIT, graph=1, count=1)
  t, f, _ = c.frame()                                  # corrected by a further patch, as protocol.md says
  assert (t, f["tag"]) == (P.RGRAPHRUN, tag), (P.TYPE_NAMES.get(t), f)

def test_bad_bindings_under_the_debug_layer_end_only_their_request(metal_addr):
  # under MTL_DEBUG_LAYER=1 (as tests/mac_report.py runs a Mac's runner) the layer stops the process on a misaligned offset or a
  # missing binding: before the fix one client's launch ended every session of the runner ("connection closed after 0 of 12 bytes")
  needs_own_metal_runner()
  r = metal_runner_proc(env={"MTL_DEBUG_LAYER": "1"})
  try:
    bystander, c = Raw(r.addr), Raw(r.addr)
    bystander.alloc(1, 64); bystander.write(1, 0, b"\x07" * 4)
    c.alloc(1, 64); c.alloc(2, 64)
    load(c, 1, ADD1, 2)
    code, text = launch_error(c, 1, [(1, 0), (2, 2)])
    assert code == P.EINVAL and "offset 2 is not a multiple of 4" in text, text
    load(c, 2, ADD1, 1)                                # one buffer too few
    c.launch(2, [(1, 0)])
    assert [e[0] for e in c.until_pong()] == [P.EPROGRAM, P.EHANDLE]
    assert r.alive() and bystander.read(1, 0, 4) == b"\x07" * 4
    launched(c, 1, [(1, 0), (2, 4)], g=(15, 1, 1))     # and the session goes on
    c.close(); bystander.close()
  finally:
    r.stop()
  assert "failed assertion" not in "\n".join(r.log), r.log_text(0)

# a parameter the runner cannot bind: it binds buffers only (setBuffer, setBytes), so threadgroup memory, a texture or a sampler
# as a parameter is EPROGRAM at Tload. tinygrad declares threadgroup memory inside the kernel, which is no binding.
TGPARAM = HEAD + (f"kernel void tgparam(device float* out, threadgroup float* t [[threadgroup(0)]], {IDS}) "
                  "{ t[lid.x] = 1.0f; threadgroup_barrier(mem_flags::mem_threadgroup); out[gid.x] = t[0]; }\n")

# the same without [[threadgroup(0)]], after a buffer given no index either: the emulator gives it the first threadgroup index.
# Whether Apple's compiler takes a threadgroup parameter without its index was not seen: on a Mac either text is EPROGRAM
TGAUTO = HEAD + (f"kernel void tgauto(device float* out, threadgroup float* t, device float* a, {IDS}) "
                 "{ t[lid.x] = a[0]; threadgroup_barrier(mem_flags::mem_threadgroup); out[gid.x] = t[0]; }\n")

@pytest.mark.parametrize("src", [TGPARAM, TGAUTO], ids=["attribute", "no-attribute"])
def test_a_threadgroup_memory_parameter_is_eprogram(c, metal_addr, src):
  load(c, 1, src, 1)
  code, _, text = c.errors(1)[0]
  refused = "takes threadgroup memory (Metal binding type 1) at index 0 as a parameter" in text
  assert code == P.EPROGRAM and (refused or (src is TGAUTO and not is_emulator(metal_addr))), text
  c.alloc(1, 64); c.alloc(2, 64)
  load(c, 2, ADD1, 2)                                  # the session goes on
  launched(c, 2, [(1, 0), (2, 0)], g=(16, 1, 1))

@pytest.mark.parametrize("macos", ["12.0", "13.0"])
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_threadgroup_memory_parameter_before_macos_13_ends_no_session(macos, isolation):
  # before macOS 13 reflection is MTLArguments, whose bufferAlignment and bufferDataSize are "a fatal error" on one that is not a
  # buffer (Apple; the emulator stops the process there). Before the fix the runner asked every argument, so this Tload stopped
  # the process: under --isolation thread every session, under process the client's own (its connection closed)
  needs_own_metal_runner()
  r = metal_runner_proc("--isolation", isolation, env={"METAL_EMU_MACOS": macos})
  try:
    if not is_emulator(r.addr): pytest.skip("uses the Metal emulator's METAL_EMU_MACOS (tests/metal_emulator/README.md)")
    bystander, c = Raw(r.addr), Raw(r.addr)
    bystander.alloc(1, 64); bystander.write(1, 0, b"\x07" * 4)
    load(c, 1, TGPARAM, 1)
    [(code, _, text)] = c.until_pong()
    assert code == P.EPROGRAM and "takes threadgroup memory (Metal binding type 1) at index 0" in text, text
    c.alloc(1, 64); c.alloc(2, 64)
    load(c, 2, ADD1, 2)                                # the session goes on, and its checks with it
    launched(c, 2, [(1, 0), (2, 0)], g=(16, 1, 1))
    assert r.alive() and bystander.read(1, 0, 4) == b"\x07" * 4
    c.close(); bystander.close()
  finally:
    r.stop()
  assert "fatal error" not in r.log_text(0), r.log_text(0)

# *** defect b: a waited launch reports an earlier launch's failure, and waits for all earlier work

def test_waited_launch_reports_earlier_failure(c, emulator_only):
  c.alloc(1, 16); c.alloc(2, 64); c.alloc(3, 64)
  load(c, 1, OOB, 1); load(c, 2, ADD1, 2)
  c.launch(1, [(1, 0)])                       # fails on the device after the runner accepted it
  code, text = launch_error(c, 2, [(2, 0), (3, 0)], g=(16, 1, 1))
  assert code == P.EDEVICE and "earlier work" in text and "Address Fault" in text, text
  # reported once: the session goes on cleanly
  assert c.until_pong() == []
  launched(c, 2, [(2, 0), (3, 0)], g=(16, 1, 1))
  c.sync()

def test_deferred_failure_at_sync(c, emulator_only):
  c.alloc(1, 16)
  load(c, 1, OOB, 1)
  c.launch(1, [(1, 0)])
  tag = c.req(P.TSYNC)
  code, etag, text = c.error()
  assert (code, etag) == (P.EDEVICE, tag) and "Address Fault" in text, text
  c.sync()                                     # reported once

def test_deferred_failure_at_read(c, emulator_only):
  # ran on the Metal emulator (its page-fault report): a Tread is a request that waits, so it reports the earlier launch's fault
  c.alloc(1, 16)
  load(c, 1, OOB, 1)
  c.launch(1, [(1, 0)])
  tag = c.req(P.TREAD, handle=1, offset=0, count=16)
  code, etag, text = c.error()
  assert (code, etag) == (P.EDEVICE, tag) and "Address Fault" in text, text
  c.sync()                                     # reported once

def test_fault_ends_only_that_command_buffer(metal_addr, c, emulator_only):
  c.alloc(1, 16)
  load(c, 1, OOB, 1)
  code, text = launch_error(c, 1, [(1, 0)])
  assert code == P.EDEVICE and "kIOGPUCommandBufferCallbackErrorPageFault" in text, text
  other = Raw(metal_addr)
  other.alloc(1, 64); other.alloc(2, 64)
  load(other, 5, ADD1, 2)
  launched(other, 5, [(1, 0), (2, 0)], g=(16, 1, 1))
  other.close()

# *** defect c: Metal is not fork-safe, so process isolation spawns a fresh runner process per session (daemon/isolate.c; the
# sessions' independence is tests/test_metal_isolation.py)

def test_process_isolation_spawns(metal_addr):
  needs_own_metal_runner()
  r = metal_runner_proc("--isolation", "process")
  try:
    c = Raw(r.addr)
    c.alloc(1, 64); c.alloc(2, 64)
    load(c, 1, ADD1, 2)
    launched(c, 1, [(1, 0), (2, 0)], g=(16, 1, 1))
    c.close()
    assert "process (spawned) isolation" in r.log_text(0)
  finally:
    r.stop()

# *** defect e: the compiler's whole message, and the language version tinygrad pins

def test_compile_error_is_whole(c):
  body = "\n".join(f"  out[{i}] = undefined_name_{i:03d};" for i in range(40))
  src = HEAD + f"kernel void bad(device float* out, {IDS}) {{\n{body}\n}}\n"
  load(c, 1, src, 1)
  code, tag, text = c.errors(1)[0]
  assert code == P.EPROGRAM and text.startswith("cannot load bad: Metal compile failed"), text[:200]
  assert len(text.encode()) > P.MAX_ERRTEXT and "undefined_name_000" in text and "undefined_name_010" in text, text[-300:]

def test_double_is_not_metal(c):
  # the Metal Shading Language has no double (MSL specification, Scalar Data Types): Apple's compiler rejects it, and so does the
  # emulator, which would otherwise run it as the C++ it compiles; a word in a comment or a string is not the type
  src = HEAD + f"kernel void dbl(device float* out, {IDS}) {{ /* double */ double x = 1.5; out[0] = (float)x; }}\n"
  load(c, 1, src, 1)
  code, _, text = c.errors(1)[0]
  assert code == P.EPROGRAM and "double" in text, text[:300]
  ok = HEAD + f"kernel void notdbl(device float* out, {IDS}) {{ // double\n  out[0] = 2.0f; }}\n"
  c.alloc(1, 4)
  load(c, 2, ok, 1)
  launched(c, 2, [(1, 0)])
  assert struct.unpack("<f", c.read(1, 0, 4))[0] == 2.0

def test_language_version_is_pinned(c, emulator_only):
  # tinygrad's MetalCompiler compiles at metal4.0 (macOS 26), 3.1 (14), 3.0 (13) or 2.0, never the system's newest. On Linux
  # runner.m's @available checks all pass, so it pins 4.0; the emulator's own default (the newest of its macOS 15) is 3.2.
  c.alloc(1, 4)
  load(c, 1, VERSION, 1)
  launched(c, 1, [(1, 0)])
  assert struct.unpack("<i", c.read(1, 0, 4))[0] == 400

# *** the emulator's validation layer and its guard pages, seen through the runner

# *** issue 20 e: an offset equal to the buffer's size (an empty range, which Tlaunch allows) never reaches setBuffer:offset:atIndex:,
# where Metal's validation layer requires offset < length and stops the process otherwise

def test_offset_at_end_of_buffer_runs(c):
  c.alloc(1, 64); c.alloc(2, 64)
  load(c, 1, FIRST, 2)
  launched(c, 1, [(1, 0), (2, 64)])                    # before the fix: EDEVICE, "offset(64) must be < [buffer length](64)"
  assert struct.unpack("<f", c.read(1, 0, 4))[0] == 42.0

def test_offset_at_end_of_buffer_under_the_debug_layer(metal_addr):
  # under MTL_DEBUG_LAYER=1 (as the macOS workflow runs) the layer stops the process on such an offset, ending every session
  needs_own_metal_runner()
  r = metal_runner_proc(env={"MTL_DEBUG_LAYER": "1"})
  try:
    bystander, c = Raw(r.addr), Raw(r.addr)
    bystander.alloc(1, 64)
    c.alloc(1, 64); c.alloc(2, 64)
    load(c, 1, FIRST, 2)
    c.launch(1, [(1, 0), (2, 64)], wait=True)
    t, f, _ = c.frame()                                # before the fix: the runner aborts, "connection closed after 0 of 12 bytes"
    assert t == P.RLAUNCH, (P.TYPE_NAMES.get(t), f)
    assert r.alive() and bystander.read(1, 0, 4) == bytes(4)
    c.close(); bystander.close()
  finally:
    r.stop()
  assert "failed assertion" not in "\n".join(r.log), r.log_text(0)

def test_offset_past_end_of_buffer_is_erange(c):
  c.alloc(1, 64); c.alloc(2, 64)
  load(c, 1, FIRST, 2)
  code, text = launch_error(c, 1, [(1, 0), (2, 65)])
  assert code == P.ERANGE and "offset 65 is past the end" in text, text

def test_metallib_is_refused_by_the_emulator(c, emulator_only):
  load(c, 1, "MTLB" + "\0" * 60 + "ENDT", 1, kind=P.PROG_METALLIB, name="k")
  code, tag, text = c.errors(1)[0]
  assert code == P.EPROGRAM and "metallib is not supported by the Metal emulator" in text, text

def test_threadgroup_too_large(c):
  c.alloc(1, 64); c.alloc(2, 64)
  load(c, 1, ADD1, 2)
  code, text = launch_error(c, 1, [(1, 0), (2, 0)], l=(1024, 2, 1))
  assert code == P.EDEVICE and "maxTotalThreadsPerThreadgroup" in text, text

# *** every object a session creates is released when it ends

def test_sessions_release_everything(metal_addr):
  needs_own_metal_runner()
  r = metal_runner_proc(env={"METAL_EMU_LIVE": "1"})
  def released(n:int) -> list[str]:   # the emulator's line for each session's queue, once n sessions have ended
    for _ in range(100):
      if len(lines:=[ln for ln in r.log_text(0.05).splitlines() if "command queue released" in ln]) >= n: return lines
    raise AssertionError(f"{n} sessions did not end:\n{r.log_text(0)}")
  try:
    if not is_emulator(r.addr): pytest.skip("live-object counts are the emulator's")
    released(1)   # is_emulator's session: each session ends before the next starts, so the counts are its alone
    for n in (2, 3):
      c = Raw(r.addr)
      c.alloc(1, 64); c.alloc(2, 64); c.alloc(3, 16)
      load(c, 1, ADD1, 2); load(c, 2, OOB, 1)
      for _ in range(100): c.launch(1, [(1, 0), (2, 0)], global_size=(16, 1, 1))   # past the 64-command batch
      launched(c, 1, [(1, 0), (2, 0)], g=(16, 1, 1))
      c.launch(2, [(3, 0)])                     # a failed command buffer is released too
      c.req(P.TSYNC); c.error()
      c.close()
      released(n)
    for ln in released(3):
      # what may stay: the device, the pipeline cache (kept for the next client) and the autorelease pool the queue is released in
      live = dict(x.rsplit(" ", 1) for x in ln.split("live objects: ", 1)[1].split(", ")) if "none" not in ln else {}
      assert set(live) <= {"EmuDevice", "EmuPipeline", "EmuLibrary", "NSAutoreleasePool"} and live.get("NSAutoreleasePool", "1") == "1", ln
  finally:
    r.stop()
  r.wait_log("metal emulator: live objects at exit: none")   # written at exit; its stderr is read by a thread

# *** protocol.md, statement by statement, on the Metal backend

def test_conformance_suite_on_the_metal_runner(metal_addr):
  import subprocess, sys
  from conftest import ROOT
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "conformance"), "--runner",
                      metal_addr], capture_output=True, text=True, timeout=600, cwd=str(ROOT))
  assert r.returncode == 0 and " passed" in r.stdout and " failed" not in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]

# *** issue 35 item 3: reflection strictness. A binding the kernel does not use (reflection's MTLBinding used / MTLArgument
# active NO) is no reason to refuse a Tload: its width is not held to Tload's, and one past Tload's count may stay unbound.
# tinygrad builds its pipelines with no reflection at all, so a kernel it runs must not be refused here for a parameter it
# never reads. On the emulator a parameter its body does not name is unused (what Apple's compiler reports is logged by
# tests/mac_report.py on a Mac; not seen yet)
UNUSED_WIDE = HEAD + f"kernel void unused_wide(device int* out, constant long& v, constant int& w, {IDS}) {{ out[0] = w * 2; }}\n"
UNUSED_PAST = HEAD + (f"kernel void unused_past(device int* out, constant int& w, device float* spare [[buffer(2)]], {IDS}) "
                      "{ out[0] = w + 1; }\n")
USED_WIDE = HEAD + f"kernel void used_wide(device long* out, constant long& v, {IDS}) {{ out[0] = v; }}\n"

def test_an_unused_binding_is_not_held_to_tloads_widths_or_count(c):
  c.alloc(1, 16)
  load(c, 1, UNUSED_WIDE, 1, 2)                  # v is declared long, Tload says both values are 32-bit: v is unused
  launched(c, 1, [(1, 0)], [123, 21])
  assert struct.unpack("<i", c.read(1, 0, 4))[0] == 42
  load(c, 2, UNUSED_PAST, 1, 1)                  # a third binding, past Tload's two, that the kernel never reads
  launched(c, 2, [(1, 0)], [41])
  assert struct.unpack("<i", c.read(1, 0, 4))[0] == 42
  load(c, 3, USED_WIDE, 1, 1)                    # a used one still must be Tload's width
  [(code, _, text)] = c.until_pong()
  assert code == P.EPROGRAM and "is 8 bytes in the kernel, Tload says 4" in text, text
