"""Tload, Tunload, Tlaunch/Rlaunch, the CPU image format and Metal programs."""
import struct, time
import pytest
from conformance.spec import P, Raw, KERNELS, section, one_error, ok, fatal, kernel, closed
from wire import f32

# CPU-only kernels of this file, registered here rather than in spec.py: (nbufs, nvals, C source, Metal source, Metal mask)
KERNELS.update({
  # the two integer words it was called with
  "words": (1, 2, "void words(long* restrict out, long v, long w) { out[0] = v; out[1] = w; }", None, 0),
  # counts its calls
  "count": (1, 1, "void count(int* restrict out, long core_id) { __atomic_fetch_add(out, 1, __ATOMIC_RELAXED); }", None, 0),
  # a slow read-modify-write: calls that overlapped would lose increments
  "serial": (1, 1, "void serial(int* restrict out, long core_id) { int v = *(volatile int*)out; "
             "for (volatile int i = 0; i < 200000; i++) {} *(volatile int*)out = v + 1; }", None, 0),
  # writes into its own code: the image is mapped read-only and executable
  "selfwrite": (1, 0, "__attribute__((visibility(\"hidden\"))) void selfwrite(char* out) "
                "{ *(volatile char*)(void*)&selfwrite = 0; out[0] = 1; }", None, 0),
  # Metal only: a 4-byte value (constant int&) then an 8-byte one (constant long&, entry bit 1), stored as two longs
  "vals": (1, 2, None, "#include <metal_stdlib>\nusing namespace metal;\nkernel void vals(device long* out, constant int& v, "
           "constant long& w, uint3 gid [[threadgroup_position_in_grid]]) { out[0] = v; out[1] = w; }\n", 2),
})

cpu_only = pytest.mark.cpu_only

def errors_of(c, tags, codes):
  got = c.until_pong()
  assert [(P.ERRORS.get(e, e), t) for e, t, _ in got] == [(P.ERRORS[x], t) for x, t in zip(codes, tags)], got
  return [text for _, _, text in got]

@section("Tload")
@cpu_only
def test_tload_of_a_valid_program_has_no_reply_and_it_runs(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, f32(1, 2, 3, 4))
  k.load(c, 7)
  ok(c)
  c.launch(7, [(1, 0), (2, 0)], [4])
  assert c.read(1, 0, 16) == f32(2, 3, 4, 5)

@section("Tload")
@pytest.mark.parametrize("kind", [0, 4, 0xffff])
def test_tload_unknown_kind_is_einval(c, kind):
  tag = c.load(1, b"\x90" * 16, "k", kind=kind)
  one_error(c, P.EINVAL, tag)

@section("Tload")
def test_tload_kind_not_in_caps_is_ekind(c):
  caps = c.info["caps"]
  missing = [k for k, cap in P.PROG_CAPS.items() if not caps & cap]
  if not missing: pytest.skip("the runner accepts every program kind")
  tags = [c.load(i, b"kernel void k() {}" if k == P.PROG_METAL_SOURCE else b"MTLB....", "k", kind=k, arch=0) for i, k in enumerate(missing)]
  texts = errors_of(c, tags, [P.EKIND] * len(tags))
  if c.info["backend"] == P.BACKEND_CPU and P.PROG_METAL_SOURCE in missing:
    assert texts[missing.index(P.PROG_METAL_SOURCE)] == "backend cpu does not accept Metal source programs"

def any_program(target):
  """A Tload body the runner accepts up to the check under test: a real kernel."""
  return kernel(target, "add1")

@section("Tload", "Limits")
@cpu_only
@pytest.mark.parametrize("name", [b"", b"k" * 256, b"a\0b"], ids=["empty", "256-bytes", "nul"])
def test_tload_bad_name_length_or_nul_is_einval(target, c, name):
  tag = any_program(target).load(c, 1, name=name)
  one_error(c, P.EINVAL, tag)

@section("Tload", "Limits")
@cpu_only
def test_tload_name_of_255_bytes_is_accepted(target, c):
  if target.backend != "cpu": pytest.skip("a Metal program's name must be a function of its source")
  any_program(target).load(c, 1, name=b"k" * 255)
  ok(c)

@section("Tload", "Encoding", "Rerror")
@cpu_only
@pytest.mark.parametrize("name", [b"\xff", b"k\xc0\x80", b"k\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"k\xe2\x82", b"\x80k", b"\xf8\x88\x80\x80\x80"],
                         ids=["ff", "overlong-2", "overlong-3", "surrogate", "above-10ffff", "truncated", "lone-continuation", "5-byte"])
def test_tload_name_that_is_not_utf8_is_einval(target, c, name):
  """Text is UTF-8 (Encoding): a name that is not is refused, so no Rerror text ever carries its bytes."""
  k = any_program(target)
  tag = k.load(c, 1, name=name)
  t2 = c.launch(1, [(1, 0)], [])   # were it loaded: an EINVAL whose text names the kernel
  got = c.until_pong()             # Raw.error decodes every text as UTF-8, strictly
  assert [(P.ERRORS.get(e, e), t) for e, t, _ in got][:1] == [("EINVAL", tag)], got

@section("Tload", "Encoding")
@cpu_only
def test_tload_name_in_utf8_beyond_ascii_is_accepted(target, c):
  if target.backend != "cpu": pytest.skip("a Metal program's name must be a function of its source")
  any_program(target).load(c, 1, name="kérnel_π_𝔸".encode())
  ok(c)

@section("Tload")
@cpu_only
def test_tload_datalen_0_is_einval(target, c):
  tag = any_program(target).load(c, 1, data=b"")
  one_error(c, P.EINVAL, tag)

@section("Tload", "Limits")
@cpu_only
def test_tload_more_than_63_arguments_is_einval(target, c):
  tag = any_program(target).load(c, 1, nbufs=60, nvals=4)
  assert "64" in one_error(c, P.EINVAL, tag)

@section("Tload")
@cpu_only
@pytest.mark.parametrize("corearg", [3, 62, 65534])
def test_tload_corearg_neither_no_core_nor_an_argument_is_einval(target, c, corearg):
  tag = any_program(target).load(c, 1, corearg=corearg)  # add1 takes 3 arguments
  one_error(c, P.EINVAL, tag)

@section("Tload")
@cpu_only
def test_tload_crc_mismatch_is_eprogram(target, c):
  k = any_program(target)
  tag = k.load(c, 1, crc=P.crc32(k.data) ^ 1)
  assert one_error(c, P.EPROGRAM, tag) == "program data is corrupt: CRC-32 mismatch"

@section("Tload")
@cpu_only
def test_tload_cpu_image_for_another_arch_is_eprogram(target, c):
  if target.backend != "cpu": pytest.skip("CPU images are for CPU runners")
  k = any_program(target)
  other = P.ARCH_ARM64 if k.arch != P.ARCH_ARM64 else P.ARCH_X86_64
  tag = k.load(c, 1, arch=other)
  assert one_error(c, P.EPROGRAM, tag).endswith(f"image is for {P.ARCHS[other]}, this runner is {P.ARCHS[k.arch]}")

@section("Tload")
@cpu_only
def test_tload_cpu_image_entry_not_below_datalen_is_eprogram(target, c):
  if target.backend != "cpu": pytest.skip("CPU images are for CPU runners")
  k = any_program(target)
  tag = k.load(c, 1, entry=len(k.data))
  one_error(c, P.EPROGRAM, tag)

@section("Tload")
@cpu_only
@pytest.mark.parametrize("arch", [0, P.ARCH_RISCV64, 99])
def test_tload_cpu_image_for_no_or_an_unknown_arch_is_eprogram(target, c, arch):
  if target.backend != "cpu": pytest.skip("CPU images are for CPU runners")
  k = any_program(target)
  if arch == k.arch: pytest.skip("the runner is riscv64")
  tag = k.load(c, 1, arch=arch)
  one_error(c, P.EPROGRAM, tag)

@section("Tload", "Limits")
@cpu_only
def test_tload_with_63_arguments_is_accepted(target, c):
  if target.backend != "cpu": pytest.skip("63 arguments is the CPU backend's limit; Metal's is 31 (Metal programs)")
  any_program(target).load(c, 1, nbufs=60, nvals=3, corearg=62)
  ok(c)

@section("Tload", "Metal programs")
def test_tload_metal_entry_bit_at_or_above_nvals_is_eprogram(target, c):
  if target.backend != "metal": pytest.skip("Metal programs are for Metal runners")
  k = kernel(target, "add1")
  tag = k.load(c, 1, entry=1 << k.nvals)
  one_error(c, P.EPROGRAM, tag)

@section("Tload", "Metal programs")
def test_tload_metal_source_that_does_not_compile_is_eprogram(target, c):
  if target.backend != "metal" or not c.info["caps"] & P.CAP_METAL_SOURCE: pytest.skip("needs a Metal runner that takes Metal source")
  tag = c.load(1, b"kernel void k(device float* o) { this is not Metal }", "k", kind=P.PROG_METAL_SOURCE, arch=0, nvals=0)
  one_error(c, P.EPROGRAM, tag)

@section("Metal programs")
def test_metal_program_with_more_than_31_arguments_is_eprogram(target, c):
  if target.backend != "metal": pytest.skip("the 31-argument table is Metal's; a CPU runner allows 63")
  k = kernel(target, "add1")
  tag = k.load(c, 1, nbufs=30, nvals=2)
  one_error(c, P.EPROGRAM, tag)

@section("Tload", "Metal programs")
@pytest.mark.parametrize("nbufs,nvals,entry,says", [(1, 1, 0, "binds 3 buffers, Tload says 2 (1 buffers and 1 values)"),
                                                    (2, 1, 0, "value 0 (index 2) is 8 bytes in the kernel, Tload says 4")],
                         ids=["count", "width"])
def test_tload_metal_bindings_that_differ_from_the_kernels_are_eprogram(target, c, nbufs, nvals, entry, says):
  if target.backend != "metal": pytest.skip("a CPU image's argument types are unknown to the runner: it takes nbufs and nvals as stated")
  tag = kernel(target, "add1").load(c, 1, nbufs=nbufs, nvals=nvals, entry=entry)
  assert says in one_error(c, P.EPROGRAM, tag)

@section("Tlaunch, Rlaunch", "Tgraphrun, Rgraphrun", "Metal programs")
@cpu_only
def test_buffer_offset_alignment_is_checked_on_metal_only(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 32); c.alloc(2, 32); c.write(2, 0, f32(1, 2, 3, 4, 5, 6, 7, 8))
  k.load(c, 1)
  tag = c.launch(1, [(1, 2), (2, 0)], [1])                     # add1 reads and writes floats: offset 2 is not a multiple of 4
  c.req(P.TGRAPH, P.launch_record(1, [(1, 0), (2, 0)], [1]), graph=1, count=1)
  gtag = c.req(P.TGRAPHRUN, P.patch(0, P.PATCH_BUF, 1, handle=2, value=6), graph=1, count=1)
  if target.backend == "metal":
    errs = c.until_pong()
    assert [(e, t) for e, t, _ in errs] == [(P.EINVAL, tag), (P.EINVAL, gtag)], errs
    assert "argument 0: offset 2 is not a multiple of 4" in errs[0][2] and "argument 1: offset 6 is not a multiple of 4" in errs[1][2]
  else:                                                        # the CPU backend checks no alignment: the kernel runs unaligned
    ok(c)                                                      # 2.0 at byte 2, then 1.0 (a denormal + 1) at byte 0 over it
    assert c.read(1, 0, 8) == f32(1) + f32(2)[2:] + bytes(2)

@section("Metal programs")
def test_metal_values_bound_after_the_buffers_with_the_widths_entry_gives(target, c):
  if target.backend != "metal": pytest.skip("Metal programs are for Metal runners")
  k = kernel(target, "vals")
  c.alloc(1, 16); k.load(c, 1)
  c.launch(1, [(1, 0)], [-5, -(1 << 40) - 3])                  # int at buffer index 1, long at 2
  c.launch(1, [(1, 0)], [(1 << 32) - 1, (1 << 63) - 1])        # a uint32 value is accepted (as its 32 bits)
  assert struct.unpack("<qq", c.read(1, 0, 16)) == (-1, (1 << 63) - 1)
  c.launch(1, [(1, 0)], [-(1 << 31), -(1 << 63)])
  assert struct.unpack("<qq", c.read(1, 0, 16)) == (-(1 << 31), -(1 << 63))

@section("Metal programs")
@pytest.mark.parametrize("v", [1 << 32, -(1 << 31) - 1])
def test_metal_4_byte_value_outside_int32_and_uint32_is_edevice(target, c, v):
  if target.backend != "metal": pytest.skip("Metal programs are for Metal runners")
  k = kernel(target, "vals")
  c.alloc(1, 16); k.load(c, 1)
  tag = c.launch(1, [(1, 0)], [v, 0])
  assert str(v) in one_error(c, P.EDEVICE, tag)

@section("Metal programs")
def test_metal_local_size_above_the_pipeline_maximum_is_edevice_naming_both_numbers(target, c):
  if target.backend != "metal": pytest.skip("maxTotalThreadsPerThreadgroup is Metal's")
  k = kernel(target, "vals")
  c.alloc(1, 16); k.load(c, 1)
  tag = c.launch(1, [(1, 0)], [0, 0], local_size=[64, 64, 2])
  text = one_error(c, P.EDEVICE, tag)
  assert "8192" in text and any(str(n) in text for n in (1024, 512, 256, 896, 768, 640)), text

@section("Tload", "Handles")
@cpu_only
def test_tload_of_a_handle_in_use_is_eexist(target, c):
  k = any_program(target)
  k.load(c, 1)
  tag = k.load(c, 1)
  one_error(c, P.EEXIST, tag)

@section("Tunload")
def test_tunload_of_no_such_program_is_ehandle(c):
  tag = c.req(P.TUNLOAD, prog=31337)
  one_error(c, P.EHANDLE, tag)

@section("Tunload", "Handles")
@cpu_only
def test_tunload_then_the_handle_is_free_and_launches_fail(target, c):
  k = any_program(target)
  c.alloc(1, 16)
  k.load(c, 1)
  c.launch(1, [(1, 0), (1, 0)], [1])   # submitted before the Tunload: completes
  c.req(P.TUNLOAD, prog=1)
  t1 = c.launch(1, [(1, 0), (1, 0)], [1])
  t2 = c.req(P.TUNLOAD, prog=1)
  errors_of(c, [t1, t2], [P.EHANDLE, P.EHANDLE])
  k.load(c, 1)
  ok(c)

@section("Tunload")
@cpu_only
def test_tunload_lets_launches_already_submitted_complete(target, c):
  k = any_program(target)
  c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, f32(1, 2, 3, 4))
  k.load(c, 1)
  c.launch(1, [(1, 0), (2, 0)], [4])
  c.req(P.TUNLOAD, prog=1)
  ok(c)
  assert c.read(1, 0, 16) == f32(2, 3, 4, 5)

# *** Tlaunch

@section("Tlaunch, Rlaunch")
@cpu_only
def test_tlaunch_with_fwait_replies_rlaunch_with_the_time(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, f32(1, 2, 3, 4))
  k.load(c, 7)
  tag = c.launch(7, [(1, 0), (2, 0)], [4], wait=True)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RLAUNCH, tag) and 0 < f["ns"] < 10**10
  assert c.read(1, 0, 16) == f32(2, 3, 4, 5)

@section("Tlaunch, Rlaunch")
@cpu_only
def test_tlaunch_argument_offsets_and_values(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 32); c.alloc(2, 32); c.write(2, 0, f32(1, 2, 3, 4, 5, 6, 7, 8))
  k.load(c, 1)
  c.launch(1, [(1, 8), (2, 16)], [2])       # out = buffer 1 + 8, a = buffer 2 + 16, n = 2
  assert c.read(1, 0, 32) == f32(0, 0, 6, 7, 0, 0, 0, 0) or target.backend != "cpu"
  c.launch(1, [(1, 32), (2, 32)], [0])      # offset == size is allowed
  ok(c)

@section("Tlaunch, Rlaunch")
@cpu_only
def test_tlaunch_errors_ehandle_and_einval_naming_both_counts(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 16)
  k.load(c, 1)
  t1 = c.launch(1, [(1, 0)], [4])                  # too few
  t2 = c.launch(1, [(1, 0), (1, 0), (1, 0)], [4])  # too many
  t3 = c.launch(2, [(1, 0), (1, 0)], [4])          # no such program
  t4 = c.launch(1, [(1, 0), (9, 0)], [4])          # no such buffer
  texts = errors_of(c, [t1, t2, t3, t4], [P.EINVAL, P.EINVAL, P.EHANDLE, P.EHANDLE])
  assert "add1 takes 2 buffers and 1 values; the launch passed 1 and 1" in texts[0] and "passed 3 and 1" in texts[1]

@section("Tlaunch, Rlaunch")
@cpu_only
def test_tlaunch_offset_past_the_buffer_is_erange(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 16)
  k.load(c, 1)
  tag = c.launch(1, [(1, 0), (1, 17)], [0], wait=True)
  code, etag, text = c.error()
  assert (code, etag) == (P.ERANGE, tag) and "17" in text
  ok(c)

@section("Tlaunch, Rlaunch")
@cpu_only
@pytest.mark.parametrize("dim", range(6))
def test_tlaunch_dimension_0_is_einval(target, c, dim):
  k = kernel(target, "add1")
  c.alloc(1, 16)
  k.load(c, 1)
  g, l = [1, 1, 1], [1, 1, 1]
  (g if dim < 3 else l)[dim % 3] = 0
  tag = c.launch(1, [(1, 0), (1, 0)], [1], global_size=g, local_size=l)
  one_error(c, P.EINVAL, tag)

@section("Tlaunch, Rlaunch", "Robustness rules", "Limits")
def test_tlaunch_record_with_more_than_63_arguments_is_eproto(c):
  bufs, vals = [(1, 0)] * 40, [0] * 24
  c.send(P.pack(P.TLAUNCH, 5, payload_len=16 * 40 + 8 * 24, **P.launch_fields(1, bufs, vals)) + P.launch_args(bufs, vals))
  fatal(c, P.EPROTO, 5)

@section("Tlaunch, Rlaunch", "Isolation")
@cpu_only
def test_tlaunch_kernel_crash_is_ecrash_after_queued_errors_and_ends_only_its_session(target):
  target.needs_process_isolation()
  other = target.connect()
  other.alloc(1, 4096); other.write(1, 0, b"kept" * 1024)
  k = kernel(target, "crash")
  c = target.connect()
  c.alloc(1, 16)
  k.load(c, 1)
  t0 = c.req(P.TFREE, handle=77)        # still queued when the kernel crashes: sent first
  tag = c.launch(1, [(1, 0)], wait=True)
  assert c.error()[:2] == (P.EHANDLE, t0)
  assert fatal(c, P.ECRASH, tag) == "kernel crash crashed: SIGSEGV"
  assert other.read(1, 0, 4096) == b"kept" * 1024, "another session lost its data"
  assert target.connect().ping(b"on") == b"on"

def spinning(target) -> tuple:
  """A session of a --kernel-timeout 1 runner whose kernel never returns: (runner, connection, the launch's tag)."""
  target.needs_process_isolation()
  t = target.with_options("--kernel-timeout", "1")
  k = kernel(t, "spin")
  c = t.connect()
  c.alloc(1, 16)
  k.load(c, 1)
  return t, c, c.launch(1, [(1, 0)])

@section("Tlaunch, Rlaunch", "Isolation")
@cpu_only
def test_tlaunch_past_the_kernel_time_limit_is_etimeout_and_ends_only_its_session(target):
  t, c, tag = spinning(target)
  other = t.connect()
  assert other.ping(b"ok") == b"ok"      # served while the kernel spins
  fatal(c, P.ETIMEOUT, tag)
  assert other.ping(b"ok") == b"ok"

@section("Tlaunch, Rlaunch", "Tping, Rping", "Tclock, Rclock")
@cpu_only
def test_on_the_cpu_backend_a_request_after_a_launch_is_answered_once_the_kernel_returns(target):
  # a kernel that never returns: the Tping and Tclock sent after it are never answered; the time limit ends the session
  if target.backend != "cpu": pytest.skip("Metal queues a launch and reads the next request at once")
  _, c, tag = spinning(target)
  c.req(P.TPING, count=0); c.req(P.TCLOCK)
  fatal(c, P.ETIMEOUT, tag)             # the first frame, and the last: no Rping, no Rclock

# *** the CPU image format

@section("The CPU image format")
@cpu_only
def test_corearg_spreads_global0_calls_over_core_ids(target, c):
  if target.backend != "cpu": pytest.skip("core ids are the CPU backend's")
  k = kernel(target, "cores")
  c.alloc(1, 4 * 16)
  k.load(c, 1, corearg=1)
  c.launch(1, [(1, 0)], [0], global_size=(16, 3, 2), local_size=(4, 1, 1))  # global[1], global[2], local are ignored
  assert struct.unpack("<16i", c.read(1, 0, 64)) == tuple(10 * i for i in range(16))

@section("The CPU image format")
@cpu_only
def test_without_corearg_the_value_sent_is_passed(target, c):
  if target.backend != "cpu": pytest.skip("core ids are the CPU backend's")
  k = kernel(target, "cores")
  c.alloc(1, 4 * 16)
  k.load(c, 1)
  c.launch(1, [(1, 0)], [5], global_size=(3, 1, 1))
  assert struct.unpack("<16i", c.read(1, 0, 64)) == tuple(50 if i == 5 else 0 for i in range(16))

@section("Isolation")
@cpu_only
def test_a_kernel_that_opens_a_socket_ends_its_session_with_sigsys(target):
  target.needs_process_isolation()
  if target.external: pytest.skip("confinement is Linux only, and Rhello does not say the runner's system")
  k = kernel(target, "sock")
  other = target.connect()
  other.alloc(1, 64); other.write(1, 0, b"kept" * 16)
  c = target.connect()
  c.alloc(1, 16); c.write(1, 0, bytes(16))
  k.load(c, 1)
  tag = c.launch(1, [(1, 0)], wait=True)
  assert "SIGSYS" in fatal(c, P.ECRASH, tag)      # never made: without confinement it returns a socket (Rlaunch)
  assert other.read(1, 0, 64) == b"kept" * 16

@section("The CPU image format")
@cpu_only
def test_without_corearg_a_cpu_kernel_is_called_global0_times(target, c):
  if target.backend != "cpu": pytest.skip("global[0] is the number of calls on the CPU backend")
  k = kernel(target, "add1")
  c.alloc(1, 16); c.write(1, 0, f32(1, 2, 3, 4))
  k.load(c, 1)
  c.launch(1, [(1, 0), (1, 0)], [4], global_size=(3, 2, 5), local_size=(2, 7, 1))   # in place: each call adds 1
  assert c.read(1, 0, 16) == f32(4, 5, 6, 7), "global[1], global[2] and local are ignored: 3 calls"

@section("The CPU image format", "Encoding")
@cpu_only
def test_values_are_passed_as_64_bit_twos_complement_words(target, c):
  if target.backend != "cpu": pytest.skip("a CPU kernel")
  k = kernel(target, "words")
  c.alloc(1, 16)
  k.load(c, 1)
  c.launch(1, [(1, 0)], [-5, (1 << 62) + 3])
  assert struct.unpack("<2q", c.read(1, 0, 16)) == (-5, (1 << 62) + 3)

@section("The CPU image format", "Tload")
@cpu_only
def test_the_function_at_entry_is_called(target, c):
  if target.backend != "cpu": pytest.skip("a CPU image")
  k = kernel(target, "add1")
  c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, f32(1, 2, 3, 4))
  k.load(c, 1, data=bytes(64) + k.data, entry=k.entry + 64)   # the image moved 64 bytes on: references inside it are PC-relative
  c.launch(1, [(1, 0), (2, 0)], [4])
  assert c.read(1, 0, 16) == f32(2, 3, 4, 5)

@section("The CPU image format", "Isolation")
@cpu_only
def test_the_image_is_not_writable(target):
  target.needs_process_isolation()
  k = kernel(target, "selfwrite")
  c = target.connect()
  c.alloc(1, 16)
  k.load(c, 1)
  tag = c.launch(1, [(1, 0)], wait=True)
  assert fatal(c, P.ECRASH, tag).startswith("kernel selfwrite crashed: SIG")

@section("The CPU image format")
@cpu_only
def test_with_corearg_a_cpu_kernel_is_called_global0_times(target, c):
  if target.backend != "cpu": pytest.skip("global[0] is the number of calls on the CPU backend")
  k = kernel(target, "count")
  c.alloc(1, 4)
  k.load(c, 1, corearg=1)
  c.launch(1, [(1, 0)], [0], global_size=(37, 3, 2), local_size=(4, 5, 1))
  assert struct.unpack("<i", c.read(1, 0, 4)) == (37,)

@section("The CPU image format")
@cpu_only
def test_without_corearg_the_calls_are_made_one_after_another(target, c):
  if target.backend != "cpu": pytest.skip("a CPU kernel")
  k = kernel(target, "serial")
  c.alloc(1, 4)
  k.load(c, 1)
  c.launch(1, [(1, 0)], [0], global_size=(12, 1, 1))
  assert struct.unpack("<i", c.read(1, 0, 4)) == (12,), "calls overlapped"
