"""Tgraph, Tgraphrun/Rgraphrun and Tgraphfree."""
import pytest
from conformance.spec import P, section, one_error, ok, fatal, kernel
from wire import f32

cpu_only = pytest.mark.cpu_only

def rec(prog=1, bufs=((2, 0), (1, 0)), vals=(4,), g=(1, 1, 1), l=(1, 1, 1)) -> bytes: return P.launch_record(prog, list(bufs), list(vals), g, l)

def graph(c, graph:int, *records:bytes, count:int|None=None, flags:int=0) -> int:
  body = b"".join(records)
  return c.req(P.TGRAPH, body, flags, graph=graph, count=len(records) if count is None else count)

@pytest.fixture
def gc(target, c):
  """A connection with add1 loaded as program 1 and three 16-byte buffers 1, 2, 3; buffer 1 holds 1, 1, 1, 1."""
  kernel(target, "add1").load(c, 1)
  for h in (1, 2, 3): c.alloc(h, 16)
  c.write(1, 0, f32(1, 1, 1, 1))
  ok(c)
  return c

# *** Tgraph: framing errors end the connection

OVER = P.launch_record(1, [(1, 0)] * 40, [0] * 24)
@section("Tgraph", "Robustness rules")
@pytest.mark.parametrize("body,count", [
  (rec()[:40], 1),                 # the record's args run past the end of the frame
  (rec()[:20], 1),                 # not even the record's fixed part fits
  (rec() + bytes(8), 1),           # bytes left over after the records
  (rec(), 2),                      # count says 2, the frame holds 1
  (rec(), 1 << 30),                # a count far larger than the frame could hold
  (rec(), 0xffffffff),
  (OVER, 1),                       # a record with 64 arguments
  (rec(prog=404) + rec()[:40], 2), # a record naming no program, then one past the end: the frame is checked before any record
  (rec(prog=404) + OVER, 2),       # ... then one with 64 arguments
], ids=["args-past-end", "record-past-end", "bytes-over", "count-2-of-1", "count-2^30", "count-max", "64-arguments",
        "no-program-then-past-end", "no-program-then-64-arguments"])
def test_tgraph_framing_error_is_eproto_and_closes(c, body, count):
  tag = c.req(P.TGRAPH, body, graph=1, count=count)
  fatal(c, P.EPROTO, tag)

# *** Tgraph: semantic errors, at definition

@section("Tgraph")
def test_tgraph_count_0_is_einval(c):
  tag = graph(c, 1, count=0)
  one_error(c, P.EINVAL, tag)

@section("Tgraph")
def test_tgraph_naming_no_such_program_is_ehandle(c):
  tag = graph(c, 1, rec(prog=404))
  one_error(c, P.EHANDLE, tag)

@section("Tgraph")
@cpu_only
def test_tgraph_record_with_other_argument_counts_is_einval(gc):
  t1 = graph(gc, 1, rec(), rec(bufs=[(1, 0)]))
  t2 = graph(gc, 2, rec(vals=()))
  errs = gc.until_pong()
  assert [e[:2] for e in errs] == [(P.EINVAL, t1), (P.EINVAL, t2)], errs

@section("Tgraph")
@cpu_only
@pytest.mark.parametrize("dim", range(6), ids=["gx", "gy", "gz", "lx", "ly", "lz"])
def test_tgraph_record_with_a_dimension_0_is_einval_at_definition(gc, dim):
  g, l = [1, 1, 1], [1, 1, 1]
  (g if dim < 3 else l)[dim % 3] = 0
  tag = graph(gc, 1, rec(), rec(g=g, l=l))
  one_error(gc, P.EINVAL, tag)
  tag = gc.req(P.TGRAPHRUN, graph=1, count=0)   # and no graph was defined
  one_error(gc, P.EHANDLE, tag)

@section("Tgraph", "Handles")
@cpu_only
def test_tgraph_of_a_handle_in_use_is_eexist(gc):
  graph(gc, 5, rec())
  tag = graph(gc, 5, rec())
  one_error(gc, P.EEXIST, tag)

@section("Tgraph")
@cpu_only
def test_tgraph_does_not_check_buffers_tgraphrun_does(gc):
  graph(gc, 1, rec(bufs=[(9, 0), (1, 0)]))   # buffer 9 does not exist yet: accepted
  ok(gc)
  tag = gc.req(P.TGRAPHRUN, graph=1, count=0)
  one_error(gc, P.EHANDLE, tag)
  gc.alloc(9, 16)
  gc.req(P.TGRAPHRUN, graph=1, count=0)
  assert gc.read(9, 0, 16) == f32(2, 2, 2, 2)

# *** Tgraphrun

@section("Tgraphrun, Rgraphrun")
@cpu_only
def test_tgraphrun_runs_in_order_and_patches_stay_applied(gc):
  graph(gc, 5, rec(bufs=[(2, 0), (1, 0)]), rec(bufs=[(3, 0), (2, 0)]))
  gc.req(P.TGRAPHRUN, graph=5, count=0)       # no FWAIT: no reply
  assert gc.read(3, 0, 16) == f32(3, 3, 3, 3)
  pat = P.patch(0, P.PATCH_BUF, 1, 3, 0) + P.patch(0, P.PATCH_VAL, 0, value=2)
  tag = gc.req(P.TGRAPHRUN, pat, P.FWAIT, graph=5, count=2)
  t, f, _ = gc.frame()
  assert (t, f["tag"]) == (P.RGRAPHRUN, tag) and f["ns"] > 0
  assert gc.read(2, 0, 16) == f32(4, 4, 2, 2) and gc.read(3, 0, 16) == f32(5, 5, 3, 3)
  gc.req(P.TGRAPHRUN, graph=5, count=0)       # later runs see the patches
  assert gc.read(2, 0, 16) == f32(6, 6, 2, 2)

@section("Tgraphrun, Rgraphrun")
@cpu_only
def test_tgraphrun_patch_global_and_local(gc):
  graph(gc, 1, rec())
  gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_GLOBAL, 1, value=3) + P.patch(0, P.PATCH_LOCAL, 2, value=2), graph=1, count=2)
  ok(gc)

@section("Tgraphrun, Rgraphrun")
def test_tgraphrun_of_no_such_graph_is_ehandle_with_or_without_fwait(c):
  t1 = c.req(P.TGRAPHRUN, graph=77, count=0)
  one_error(c, P.EHANDLE, t1)
  t2 = c.req(P.TGRAPHRUN, flags=P.FWAIT, graph=77, count=0)
  assert c.error()[:2] == (P.EHANDLE, t2)     # the reply it waits for
  ok(c)

BAD_PATCHES = {
  "entry-past-count": P.patch(1, P.PATCH_VAL, 0, value=1),
  "unknown-kind": P.patch(0, 9, 0),
  "buf-index": P.patch(0, P.PATCH_BUF, 2, 1, 0),
  "val-index": P.patch(0, P.PATCH_VAL, 1, value=1),
  "dim-index": P.patch(0, P.PATCH_GLOBAL, 3, value=1),
  "global-0": P.patch(0, P.PATCH_GLOBAL, 0, value=0),
  "local-0": P.patch(0, P.PATCH_LOCAL, 1, value=0),
  "dim-2^32": P.patch(0, P.PATCH_GLOBAL, 0, value=1 << 32),
  "dim-2^64-1": P.patch(0, P.PATCH_LOCAL, 0, value=(1 << 64) - 1),
}
@section("Tgraphrun, Rgraphrun")
@cpu_only
@pytest.mark.parametrize("bad", BAD_PATCHES.values(), ids=BAD_PATCHES.keys())
def test_tgraphrun_bad_patch_is_einval_and_applies_none(gc, bad):
  graph(gc, 1, rec(bufs=[(2, 0), (1, 0)]))
  tag = gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_VAL, 0, value=1) + bad, graph=1, count=2)
  one_error(gc, P.EINVAL, tag)
  assert gc.read(2, 0, 16) == bytes(16), "a Tgraphrun with a bad patch ran"
  gc.req(P.TGRAPHRUN, graph=1, count=0)
  assert gc.read(2, 0, 16) == f32(2, 2, 2, 2), "a patch of a rejected Tgraphrun was applied"

@section("Tgraphrun, Rgraphrun")
@cpu_only
def test_a_failed_tgraphrun_with_fwait_gets_its_rerror_instead_of_rgraphrun(gc):
  graph(gc, 1, rec(bufs=[(2, 0), (1, 0)]))
  t1 = gc.req(P.TGRAPHRUN, BAD_PATCHES["unknown-kind"], P.FWAIT, graph=1, count=1)
  assert gc.error()[:2] == (P.EINVAL, t1)
  t2 = gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_BUF, 0, 2, 17), P.FWAIT, graph=1, count=1)
  assert gc.error()[:2] == (P.ERANGE, t2)
  ok(gc)   # and nothing else for either

@section("Tgraphrun, Rgraphrun")
@cpu_only
def test_tgraphrun_patched_offset_past_the_buffer_is_erange_and_can_be_corrected(gc):
  graph(gc, 1, rec(bufs=[(2, 0), (1, 0)]))
  tag = gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_BUF, 0, 2, 17), graph=1, count=1)
  one_error(gc, P.ERANGE, tag)
  # offset == size is allowed (with n = 0 the kernel writes nothing there)
  gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_VAL, 0, value=0) + P.patch(0, P.PATCH_BUF, 0, 2, 16), graph=1, count=2)
  ok(gc)

@section("Tgraphrun, Rgraphrun", "Tgraph")
@cpu_only
def test_tgraphrun_after_a_buffer_or_program_is_gone_is_ehandle(gc):
  graph(gc, 1, rec(bufs=[(3, 0), (1, 0)]))
  gc.req(P.TFREE, handle=3)
  t1 = gc.req(P.TGRAPHRUN, graph=1, count=0)
  code, tag, text = gc.until_pong()[0]
  assert (code, tag) == (P.EHANDLE, t1) and "3" in text
  gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_BUF, 0, 2, 0), graph=1, count=1)    # the patch stays applied; the run succeeds
  assert gc.read(2, 0, 16) == f32(2, 2, 2, 2)
  gc.req(P.TUNLOAD, prog=1)
  t2 = gc.req(P.TGRAPHRUN, graph=1, count=0)
  one_error(gc, P.EHANDLE, t2)

@section("Tgraphrun, Rgraphrun")
@cpu_only
def test_tgraphrun_whose_later_entry_fails_runs_nothing_and_keeps_its_patches(gc):
  graph(gc, 1, rec(bufs=[(2, 0), (1, 0)]), rec(bufs=[(3, 0), (1, 0)]))
  gc.req(P.TFREE, handle=3)
  tag = gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_VAL, 0, value=2), graph=1, count=1)
  one_error(gc, P.EHANDLE, tag)
  assert gc.read(2, 0, 16) == bytes(16), "entry 0 ran although entry 1 failed"
  gc.alloc(3, 16)
  gc.req(P.TGRAPHRUN, graph=1, count=0)
  assert gc.read(2, 0, 16) == f32(2, 2, 0, 0), "the patch of the failed run (n := 2) was not kept"
  assert gc.read(3, 0, 16) == f32(2, 2, 2, 2)

@section("Tgraphrun, Rgraphrun")
@cpu_only
def test_tgraphrun_patched_to_no_such_buffer_is_ehandle_and_the_patch_stays(gc):
  graph(gc, 1, rec(bufs=[(2, 0), (1, 0)]))
  tag = gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_BUF, 0, 9, 0), graph=1, count=1)
  one_error(gc, P.EHANDLE, tag)
  gc.alloc(9, 16)
  gc.req(P.TGRAPHRUN, graph=1, count=0)
  assert gc.read(9, 0, 16) == f32(2, 2, 2, 2) and gc.read(2, 0, 16) == bytes(16)

@section("Tgraphrun, Rgraphrun", "The CPU image format")
@cpu_only
def test_patch_global_sets_how_many_times_a_cpu_kernel_is_called(target, gc):
  if target.backend != "cpu": pytest.skip("global[0] is the number of calls on the CPU backend")
  graph(gc, 1, rec(bufs=[(1, 0), (1, 0)]))   # in place: each call adds 1
  gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_GLOBAL, 0, value=3), graph=1, count=1)
  assert gc.read(1, 0, 16) == f32(4, 4, 4, 4)
  gc.req(P.TGRAPHRUN, P.patch(0, P.PATCH_LOCAL, 0, value=0xffffffff), graph=1, count=1)   # 2^32-1 is a valid dimension
  ok(gc)
  assert gc.read(1, 0, 16) == f32(7, 7, 7, 7)

@section("Tgraph", "Tgraphrun, Rgraphrun")
@cpu_only
def test_tgraphrun_looks_the_buffer_up_again_by_handle(gc):
  graph(gc, 1, rec(bufs=[(3, 0), (1, 0)]))
  gc.req(P.TFREE, handle=3)
  gc.alloc(3, 64)
  gc.write(3, 0, f32(9, 9, 9, 9))
  gc.req(P.TGRAPHRUN, graph=1, count=0)
  assert gc.read(3, 0, 16) == f32(2, 2, 2, 2), "the run did not use the buffer now named 3"

@section("Tgraphrun, Rgraphrun", "Tgraph")
@cpu_only
def test_tgraphrun_checks_each_entry_again_as_tlaunch_does(target, gc):
  graph(gc, 1, rec(bufs=[(3, 16), (1, 0)], vals=(0,)))   # offset 16 of a 16-byte buffer: allowed
  gc.req(P.TGRAPHRUN, graph=1, count=0)
  ok(gc)
  gc.req(P.TFREE, handle=3); gc.alloc(3, 8)              # the buffer now under 3 is smaller than the offset
  t1 = gc.req(P.TGRAPHRUN, graph=1, count=0)
  one_error(gc, P.ERANGE, t1)
  gc.req(P.TFREE, handle=3); gc.alloc(3, 16)
  gc.req(P.TUNLOAD, prog=1)
  # a program under 1 again, taking other arguments; on Metal with value widths add1's bindings allow (4 bytes at index 1, its
  # second float pointer; 8 at index 2), or the Tload itself is EPROGRAM (Metal programs)
  over = {"entry": 0b10} if target.backend == "metal" else {}
  kernel(target, "add1").load(gc, 1, nbufs=1, nvals=2, **over)
  t2 = gc.req(P.TGRAPHRUN, graph=1, count=0)
  one_error(gc, P.EINVAL, t2)

@section("Tunload", "Tgraphrun, Rgraphrun")
@cpu_only
def test_a_graph_runs_again_once_its_program_is_loaded_again(target, gc):
  graph(gc, 1, rec())
  gc.req(P.TUNLOAD, prog=1)
  tag = gc.req(P.TGRAPHRUN, graph=1, count=0)
  one_error(gc, P.EHANDLE, tag)
  assert gc.read(2, 0, 16) == bytes(16)
  kernel(target, "add1").load(gc, 1)
  gc.req(P.TGRAPHRUN, graph=1, count=0)
  assert gc.read(2, 0, 16) == f32(2, 2, 2, 2)

@section("Tgraphrun, Rgraphrun", "Robustness rules")
def test_tgraphrun_count_that_disagrees_with_the_size_is_eproto(c):
  c.send(P.pack(P.TGRAPHRUN, 8, payload_len=24, graph=1, count=2) + bytes(24))
  fatal(c, P.EPROTO, 8)

# *** Tgraphfree

@section("Tgraphfree")
def test_tgraphfree_of_no_such_graph_is_ehandle(c):
  tag = c.req(P.TGRAPHFREE, graph=3)
  one_error(c, P.EHANDLE, tag)

@section("Tgraphfree", "Handles")
@cpu_only
def test_tgraphfree_frees_the_handle(gc):
  graph(gc, 3, rec())
  gc.req(P.TGRAPHRUN, graph=3, count=0)
  gc.req(P.TGRAPHFREE, graph=3)
  t1 = gc.req(P.TGRAPHRUN, graph=3, count=0)
  t2 = gc.req(P.TGRAPHFREE, graph=3)
  assert [e[:2] for e in gc.until_pong()] == [(P.EHANDLE, t1), (P.EHANDLE, t2)]
  graph(gc, 3, rec())
  ok(gc)

@section("Tgraphfree")
@cpu_only
def test_tgraphfree_lets_its_submitted_runs_complete(gc):
  graph(gc, 3, rec())
  gc.req(P.TGRAPHRUN, graph=3, count=0)
  gc.req(P.TGRAPHFREE, graph=3)
  ok(gc)
  assert gc.read(2, 0, 16) == f32(2, 2, 2, 2)

@section("Handles")
@cpu_only
@pytest.mark.parametrize("h", [0, 0x7fffffff, 0xffffffff])
def test_any_32_bit_value_is_a_valid_program_and_graph_handle(target, gc, h):
  kernel(target, "add1").load(gc, h)
  graph(gc, h, rec(prog=h))
  gc.req(P.TGRAPHRUN, graph=h, count=0)
  gc.launch(h, [(3, 0), (1, 0)], [4])
  ok(gc)
  assert gc.read(2, 0, 16) == gc.read(3, 0, 16) == f32(2, 2, 2, 2)
  gc.req(P.TGRAPHFREE, graph=h); gc.req(P.TUNLOAD, prog=h)
  ok(gc)

@section("Tgraphrun, Rgraphrun", "Isolation")
@cpu_only
def test_a_graph_entry_that_crashes_is_ecrash_with_the_tgraphruns_tag(target):
  target.needs_process_isolation()
  c = target.connect()
  kernel(target, "crash").load(c, 1)
  c.alloc(1, 16)
  graph(c, 4, P.launch_record(1, [(1, 0)], []))
  t0 = c.req(P.TFREE, handle=77)   # queued: sent first
  tag = c.req(P.TGRAPHRUN, graph=4, count=0)
  assert c.error()[:2] == (P.EHANDLE, t0)
  assert "SIGSEGV" in fatal(c, P.ECRASH, tag)
  assert target.connect().ping(b"on") == b"on"

@section("Tgraphrun, Rgraphrun", "Isolation")
@cpu_only
def test_a_graph_entry_past_the_kernel_time_limit_is_etimeout(target):
  target.needs_process_isolation()
  t = target.with_options("--kernel-timeout", "1")
  c = t.connect()
  kernel(t, "spin").load(c, 1)
  c.alloc(1, 16)
  graph(c, 4, P.launch_record(1, [(1, 0)], []))
  tag = c.req(P.TGRAPHRUN, flags=P.FWAIT, graph=4, count=0)
  fatal(c, P.ETIMEOUT, tag)
  assert t.connect().ping(b"on") == b"on"
