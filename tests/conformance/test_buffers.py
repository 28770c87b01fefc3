"""Tping, Tsync, Talloc, Tfree, Twrite, Tread and Tcopy: every error each one names, and what each does."""
import pytest
from conformance.spec import P, section, one_error, ok, fatal, kernel
from wire import f32

@section("Tping, Rping")
def test_rping_returns_the_data_unchanged(c):
  for data in (b"", b"x", bytes(range(256)) * 64):
    assert c.ping(data) == data

@section("Tping, Rping")
def test_tping_fails_only_by_framing(c):
  c.send(P.pack(P.TPING, 9, payload_len=8, count=2) + bytes(8))  # count disagrees with the size
  fatal(c, P.EPROTO, 9)

@section("Tsync, Rsync")
@pytest.mark.cpu_only
def test_rsync_comes_after_the_earlier_work_finished(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 4); c.write(1, 0, f32(0))
  k.load(c, 1)
  for _ in range(200): c.launch(1, [(1, 0), (1, 0)], [1])
  c.sync()
  assert c.read(1, 0, 4) == f32(200)

@section("Talloc")
def test_talloc_size_0_is_einval(c):
  tag = c.alloc(1, 0)
  one_error(c, P.EINVAL, tag)

@section("Talloc")
def test_talloc_larger_than_maxbuf_is_elimit(c):
  tag = c.alloc(1, c.info["maxbuf"] + 1)
  one_error(c, P.ELIMIT, tag)

@section("Talloc")
def test_talloc_past_the_session_memory_is_elimit(target):
  c = target.with_options("--session-mem", "1M").connect()
  assert c.info["memory"] == 1 << 20
  c.alloc(1, 600 << 10)
  tag = c.alloc(2, 600 << 10)
  one_error(c, P.ELIMIT, tag)
  c.req(P.TFREE, handle=1); c.alloc(2, 600 << 10)
  ok(c)

@section("Talloc")
def test_talloc_past_the_runner_total_memory_is_elimit(target):
  t = target.with_options("--total-mem", "1M")
  a, b = t.connect(), t.connect()
  a.alloc(1, 800 << 10); ok(a)
  tag = b.alloc(1, 800 << 10)
  one_error(b, P.ELIMIT, tag)

@section("Talloc", "Handles")
def test_talloc_of_a_handle_in_use_is_eexist(c):
  c.alloc(2, 4)
  tag = c.alloc(2, 8)
  one_error(c, P.EEXIST, tag)

@section("Talloc")
def test_fresh_buffer_has_size_bytes(c):
  c.alloc(1, 24)
  assert len(c.read(1, 0, 24)) == 24
  tag = c.req(P.TREAD, handle=1, offset=0, count=25)
  assert c.error()[:2] == (P.ERANGE, tag)

@section("Tfree", "Handles")
def test_tfree_then_the_handle_may_be_reused(c):
  c.alloc(1, 16); c.write(1, 0, b"x" * 16)
  c.req(P.TFREE, handle=1)
  c.alloc(1, 8)
  assert c.read(1, 0, 8) != b"x" * 8 or c.info["backend"] != P.BACKEND_CPU  # a new buffer (zero on the CPU backend)
  ok(c)

@section("Tfree")
def test_tfree_of_no_such_buffer_and_a_second_tfree_are_ehandle(c):
  c.alloc(1, 16); c.req(P.TFREE, handle=1)
  t1 = c.req(P.TFREE, handle=1)
  t2 = c.req(P.TFREE, handle=12345)
  assert [e[:2] for e in c.until_pong()] == [(P.EHANDLE, t1), (P.EHANDLE, t2)]

@section("Twrite")
def test_twrite_to_no_such_buffer_is_ehandle_and_its_data_is_discarded(c):
  tag = c.write(77, 0, b"P" * 100)  # the data would read as garbage frames if not consumed
  one_error(c, P.EHANDLE, tag)

@section("Twrite", "Robustness rules")
@pytest.mark.parametrize("offset,count", [(8, 10), (17, 0), (2**64 - 4, 8)])
def test_twrite_out_of_range_is_erange_writes_nothing_and_stays_in_step(c, offset, count):
  c.alloc(1, 16)
  tag = c.write(1, offset, b"z" * count)
  one_error(c, P.ERANGE, tag)
  assert c.read(1, 0, 16) == bytes(16) or c.info["backend"] != P.BACKEND_CPU

@section("Twrite", "Tread, Rread")
def test_write_and_read_at_offsets_and_large_roundtrip(c):
  c.alloc(1, 64)
  c.write(1, 8, bytes(range(32)))
  assert c.read(1, 8, 32) == bytes(range(32)) and c.read(1, 40, 0) == b""
  data = bytes(range(256)) * (3 << 12)  # 3 MiB
  c.alloc(2, len(data)); c.write(2, 0, data)
  assert c.read(2, 0, len(data)) == data

@section("Tread, Rread")
def test_tread_of_no_such_buffer_is_ehandle(c):
  tag = c.req(P.TREAD, handle=4242, offset=0, count=1)
  code, etag, text = c.error()
  assert (code, etag) == (P.EHANDLE, tag) and "4242" in text
  ok(c)

@section("Tread, Rread", "Robustness rules")
@pytest.mark.parametrize("offset,count", [(17, 0), (0, 17), (8, 9), (2**64 - 8, 16), (16, 2**64 - 1)])
def test_tread_and_tcopy_out_of_range_or_wrapping_are_erange(c, offset, count):
  c.alloc(1, 16); c.alloc(2, 16)
  t1 = c.req(P.TREAD, handle=1, offset=offset, count=count)
  assert c.error()[:2] == (P.ERANGE, t1)
  t2 = c.req(P.TCOPY, dst=2, src=1, dstoff=offset, srcoff=0, count=count)
  t3 = c.req(P.TCOPY, dst=2, src=1, dstoff=0, srcoff=offset, count=count)
  assert [e[:2] for e in c.until_pong()] == [(P.ERANGE, t2), (P.ERANGE, t3)]

@section("Tread, Rread", "Limits")
def test_tread_larger_than_maxmsg_minus_16_is_elimit(target):
  c = target.connect(maxmsg=P.MIN_MAXMSG)
  assert c.info["maxmsg"] == P.MIN_MAXMSG
  c.alloc(1, 2 * P.MIN_MAXMSG)
  assert len(c.read(1, 0, P.MIN_MAXMSG - 16)) == P.MIN_MAXMSG - 16
  tag = c.req(P.TREAD, handle=1, offset=0, count=P.MIN_MAXMSG - 15)
  assert c.error()[:2] == (P.ELIMIT, tag)
  ok(c)

@section("Tcopy")
def test_tcopy_copies_and_overlapping_ranges_behave_as_memmove(c):
  c.alloc(1, 64); c.alloc(2, 64)
  c.write(1, 8, bytes(range(32)))
  c.req(P.TCOPY, dst=2, src=1, dstoff=16, srcoff=8, count=32)
  assert c.read(2, 16, 32) == bytes(range(32))
  c.req(P.TCOPY, dst=1, src=1, dstoff=9, srcoff=8, count=31)
  assert c.read(1, 9, 31) == bytes(range(31))
  c.req(P.TCOPY, dst=1, src=1, dstoff=8, srcoff=9, count=31)
  assert c.read(1, 8, 31) == bytes(range(31))

@section("Tcopy")
def test_tcopy_with_either_buffer_missing_is_ehandle(c):
  c.alloc(1, 16)
  t1 = c.req(P.TCOPY, dst=1, src=99, count=4)
  t2 = c.req(P.TCOPY, dst=99, src=1, count=4)
  assert [e[:2] for e in c.until_pong()] == [(P.EHANDLE, t1), (P.EHANDLE, t2)]

@section("Twrite", "Tread, Rread", "Tcopy")
def test_ranges_ending_at_the_buffer_end_are_allowed(c):
  """offset <= size and count <= size - offset: a range that ends at the end, and count 0 at offset == size, are in range."""
  c.alloc(1, 16); c.alloc(2, 16)
  c.write(1, 16, b""); c.write(1, 10, b"abcdef")
  c.req(P.TCOPY, dst=2, src=1, dstoff=16, srcoff=0, count=0); c.req(P.TCOPY, dst=2, src=1, dstoff=16, srcoff=16, count=0)
  c.req(P.TCOPY, dst=2, src=1, dstoff=0, srcoff=10, count=6); c.req(P.TCOPY, dst=2, src=1, dstoff=10, srcoff=10, count=6)
  ok(c)
  assert c.read(1, 16, 0) == b"" and c.read(1, 10, 6) == b"abcdef"
  assert c.read(2, 0, 6) == b"abcdef" and c.read(2, 10, 6) == b"abcdef"

@section("Talloc")
def test_talloc_up_to_exactly_the_limits_is_allowed(target):
  """ELIMIT only when a buffer is larger than maxbuf or the session's buffers *would exceed* memory: both exactly is fine."""
  c = target.with_options("--session-mem", "1M").connect()
  mem, maxbuf = c.info["memory"], c.info["maxbuf"]
  assert mem == 1 << 20 and maxbuf <= mem
  c.alloc(1, maxbuf); ok(c)
  c.req(P.TFREE, handle=1)
  c.alloc(1, mem // 2); c.alloc(2, mem - mem // 2); ok(c)   # the session now holds exactly memory bytes
  tag = c.alloc(3, 1)
  one_error(c, P.ELIMIT, tag)

@section("Talloc")
def test_a_fresh_buffer_is_zero_on_the_cpu_backend_even_where_a_freed_one_was(target, c):
  if target.backend != "cpu": pytest.skip("a fresh buffer's contents are unspecified on Metal")
  for size in (64, 1 << 20):
    c.alloc(1, size); c.write(1, 0, b"\xa5" * size)
    c.req(P.TFREE, handle=1)
    c.alloc(2, size)
    assert c.read(2, 0, size) == bytes(size)
    c.req(P.TFREE, handle=2)
  ok(c)

@section("Twrite", "Tcopy")
@pytest.mark.cpu_only
def test_twrite_and_tcopy_wait_for_the_earlier_work_on_their_buffers(target, c):
  """A Twrite lands after earlier launches that use its buffer, and a Tcopy copies what the launches before it left."""
  k = kernel(target, "add1")
  c.alloc(1, 4); c.alloc(2, 4); c.write(1, 0, f32(0))
  k.load(c, 1)
  for _ in range(200): c.launch(1, [(1, 0), (1, 0)], [1])
  c.req(P.TCOPY, dst=2, src=1, count=4)          # buffer 2 = 200
  c.write(1, 0, f32(1000))                       # replaces 200, not overtaken by a launch
  c.req(P.TCOPY, dst=2, src=2, dstoff=0, srcoff=0, count=4)
  c.launch(1, [(2, 0), (2, 0)], [1])             # buffer 2 = 201: runs after the copy
  assert (c.read(1, 0, 4), c.read(2, 0, 4)) == (f32(1000), f32(201))
  c.write(2, 0, f32(7)); c.req(P.TCOPY, dst=1, src=2, count=4); c.write(2, 0, f32(8))
  assert (c.read(1, 0, 4), c.read(2, 0, 4)) == (f32(7), f32(8))  # the copy took the data written before it, not after

@section("Twrite")
def test_a_failed_twrite_of_megabytes_is_read_and_discarded(c):
  """The data of a failed Twrite is consumed whole, however many reads it takes, and never lands anywhere."""
  c.alloc(1, 16)
  data = bytes(range(256)) * (4 << 12)   # 4 MiB that would read as frames of size 0x03020100 if not consumed
  t1 = c.write(77, 0, data)
  t2 = c.write(1, 8, data)
  assert [e[:2] for e in c.until_pong()] == [(P.EHANDLE, t1), (P.ERANGE, t2)]
  assert c.read(1, 0, 16) == bytes(16) or c.info["backend"] != P.BACKEND_CPU
