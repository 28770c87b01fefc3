"""The daemon as a black box over a real loopback socket: requests, isolation between sessions, and every class of bad input.

Each bad-input test checks the reply is a clear error naming the problem and that the daemon keeps serving other clients.
"""
import socket, struct, threading, time
import pytest
from client import protocol as P
from runner_proc import runner
from wire import Raw, compile_kernel, f32, still_serving, ADD1, CRASH, SPIN, CORES

pytestmark = pytest.mark.cpu_only

@pytest.fixture(scope="module", params=["process", "thread"])
def rp(request):
  with runner("--isolation", request.param, "--frame-timeout", "2") as r: yield r

@pytest.fixture(scope="module")
def add1(): return compile_kernel(ADD1, "add1")



# ---- requests that work

def test_hello_reports_the_cpu_backend(rp):
  c = Raw(rp.addr)
  i = c.info
  assert (i["magic"], i["version"], P.BACKENDS[i["backend"]]) == (P.MAGIC, 1, "cpu")
  assert i["caps"] & P.CAP_CPU_IMAGE and not i["caps"] & (P.CAP_METALLIB | P.CAP_METAL_SOURCE)
  assert P.cstr(i["arch"]) == "x86_64" and P.cstr(i["cpu"]).startswith("x86-64")
  assert i["ncores"] >= 1 and i["memory"] > 0 and i["maxmsg"] == P.DEFAULT_MAXMSG

def test_write_read_copy_with_offsets(rp):
  c = Raw(rp.addr)
  c.alloc(1, 64); c.alloc(2, 64)
  c.write(1, 8, bytes(range(32)))
  c.req(P.TCOPY, dst=2, src=1, dstoff=16, srcoff=8, count=32)
  assert c.read(2, 16, 32) == bytes(range(32))
  assert c.read(2, 0, 16) == bytes(16), "fresh CPU buffers are zeroed"
  c.req(P.TCOPY, dst=1, src=1, dstoff=9, srcoff=8, count=31)  # overlapping: memmove semantics
  assert c.read(1, 9, 31) == bytes(range(31))

def test_large_write_and_read_roundtrip(rp):
  c = Raw(rp.addr)
  data = bytes(range(256)) * (3 << 12)  # 3 MiB
  c.alloc(1, len(data)); c.write(1, 0, data)
  assert c.read(1, 0, len(data)) == data

def test_kernel_launch_with_wait_timing(rp, add1):
  arch, img, entry = add1
  c = Raw(rp.addr)
  c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, f32(1, 2, 3, 4))
  c.load(7, img, "add1", nbufs=2, nvals=1, entry=entry)
  tag = c.launch(7, [(1, 0), (2, 0)], [4], wait=True)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RLAUNCH, tag) and 0 < f["ns"] < 1e9
  assert c.read(1, 0, 16) == f32(2, 3, 4, 5)

def test_many_pipelined_launches_then_one_read(rp, add1):
  arch, img, entry = add1
  c = Raw(rp.addr)
  c.alloc(1, 4); c.write(1, 0, f32(0))
  c.load(1, img, "add1", nbufs=2, nvals=1, entry=entry)
  batch = b"".join(P.pack(P.TLAUNCH, 1000 + i, payload_len=40, **P.launch_fields(1, [(1, 0), (1, 0)], [1])) +
                   P.launch_args([(1, 0), (1, 0)], [1]) for i in range(2000))
  c.send(batch)
  assert c.read(1, 0, 4) == f32(2000)

def test_core_id_kernel_runs_every_core_id(rp):
  arch, img, entry = compile_kernel(CORES, "cores")
  c = Raw(rp.addr)
  c.alloc(1, 4 * 16)
  c.load(1, img, "cores", nbufs=1, nvals=1, entry=entry, corearg=1)
  c.launch(1, [(1, 0)], [0], global_size=(16, 1, 1))
  assert struct.unpack("<16i", c.read(1, 0, 64)) == tuple(10 * i for i in range(16))

def test_graph_runs_patches_and_checks_buffers_every_run(rp, add1):
  arch, img, entry = add1
  c = Raw(rp.addr)
  for h in (1, 2, 3): c.alloc(h, 16)
  c.write(1, 0, f32(1, 1, 1, 1))
  c.load(1, img, "add1", nbufs=2, nvals=1, entry=entry)
  recs = P.launch_record(1, [(2, 0), (1, 0)], [4]) + P.launch_record(1, [(3, 0), (2, 0)], [4])
  c.req(P.TGRAPH, recs, graph=5, count=2)
  c.req(P.TGRAPHRUN, graph=5, count=0)
  assert c.read(3, 0, 16) == f32(3, 3, 3, 3)
  # patch entry 0's input to buffer 3 and the length to 2: one request
  pat = P.patch(0, P.PATCH_BUF, 1, 3, 0) + P.patch(0, P.PATCH_VAL, 0, value=2)
  tag = c.req(P.TGRAPHRUN, pat, P.FWAIT, graph=5, count=2)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RGRAPHRUN, tag) and f["ns"] > 0
  assert c.read(2, 0, 16) == f32(4, 4, 2, 2) and c.read(3, 0, 16) == f32(5, 5, 3, 3)
  c.req(P.TFREE, handle=3)  # the graph still names buffer 3: the next run is an error, not a use-after-free
  tag = c.req(P.TGRAPHRUN, graph=5, count=0)
  c.req(P.TPING, count=0)                   # the error of a request without a reply comes ahead of the next reply
  code, etag, text = c.error()
  assert (code, etag) == (P.EHANDLE, tag) and "no buffer with handle 3" in text
  assert c.frame()[0] == P.RPING

def test_two_clients_have_separate_handles(rp):
  a, b = Raw(rp.addr), Raw(rp.addr)
  a.alloc(1, 4); b.alloc(1, 4)
  a.write(1, 0, b"AAAA"); b.write(1, 0, b"BBBB")
  assert (a.read(1, 0, 4), b.read(1, 0, 4)) == (b"AAAA", b"BBBB")
  a.alloc(9, 4); a.ping()
  tag = b.req(P.TFREE, handle=9)  # a's handle: b cannot reach it
  assert b.errors(1)[0][:2] == (P.EHANDLE, tag)
  assert a.read(9, 0, 4) == bytes(4)

def test_errors_of_unanswered_requests_arrive_in_order_before_the_next_reply(rp):
  c = Raw(rp.addr)
  tags = [c.req(P.TFREE, handle=1000 + i) for i in range(3)]
  c.send(P.pack(P.TPING, 77, count=0))
  got = [c.error() for _ in tags]
  assert [(code, tag) for code, tag, _ in got] == [(P.EHANDLE, t) for t in tags]
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RPING, 77)

def test_more_than_64_errors_are_counted_not_lost(rp):
  c = Raw(rp.addr)
  tags = [c.req(P.TFREE, handle=5000 + i) for i in range(70)]
  c.ping_tag = c.req(P.TPING, count=0)
  errs = [c.error() for _ in range(64)]
  assert [t for _, t, _ in errs] == tags[:64]
  code, tag, text = c.error()
  assert (code, tag) == (P.EMORE, tags[-1]) and text == "6 more errors not shown"
  assert c.frame()[0] == P.RPING

def test_disconnect_frees_everything():
  # 1 MiB for all sessions: the second client can only allocate once the first one's memory came back
  for iso in ("process", "thread"):
    with runner("--isolation", iso, "--total-mem", "1M", "-v") as r:
      a = Raw(r.addr)
      a.alloc(1, 800 << 10); a.ping()
      b = Raw(r.addr)
      tag = b.alloc(1, 800 << 10); b.ping_ = b.req(P.TPING, count=0)
      code, etag, text = b.error()
      assert (code, etag) == (P.ELIMIT, tag) and "limit of 1048576 bytes" in text
      b.frame()
      a.s.shutdown(socket.SHUT_RDWR); a.close()  # no goodbye
      for _ in range(100):
        b.alloc(2, 800 << 10)
        if not b.until_pong(): break
        time.sleep(0.05)
      else: pytest.fail(f"{iso}: memory of the closed session never came back")
      assert "closing, freeing 1 buffers (819200 bytes)" in r.log_text() or iso == "process"

# ---- bad input: the first message and framing

def test_first_message_must_be_hello(rp):
  c = Raw(rp.addr, hello=False)
  c.alloc(1, 16)
  code, _, text = c.error()
  assert code == P.ESTATE and "first request must be Thello, not Talloc" in text
  assert c.closed()
  still_serving(rp)

def test_bad_magic_and_unknown_version(rp):
  c = Raw(rp.addr, hello=False)
  c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
  code, _, text = c.error()
  assert code == P.EPROTO and c.closed()
  c = Raw(rp.addr, hello=False)
  c.req(P.THELLO, magic=0x12345678, version=1, maxmsg=P.DEFAULT_MAXMSG)
  code, _, text = c.error()
  assert code == P.EVERSION and "bad magic" in text and c.closed()
  c = Raw(rp.addr, hello=False)
  c.req(P.THELLO, magic=P.MAGIC, version=99, maxmsg=P.DEFAULT_MAXMSG)
  code, _, text = c.error()
  assert code == P.EVERSION and "version 99 not supported; this runner speaks version 1" in text and c.closed()
  still_serving(rp)

def test_unknown_type_is_a_framing_error(rp):
  c = Raw(rp.addr)
  c.send(struct.pack("<IHHI", 12, 999, 0, 42))
  code, tag, text = c.error()
  assert (code, tag) == (P.EPROTO, 42) and "999" in text and c.closed()
  c = Raw(rp.addr)
  c.send(struct.pack("<IHHI", 12, P.RSYNC, 0, 43))  # a reply type sent as a request
  assert c.error()[0] == P.EPROTO and c.closed()
  still_serving(rp)

def test_size_smaller_than_header(rp):
  c = Raw(rp.addr)
  c.send(struct.pack("<IHHI", 5, P.TPING, 0, 1))
  code, _, text = c.error()
  assert code == P.EPROTO and "5" in text and c.closed()
  still_serving(rp)

def test_size_larger_than_maximum_is_refused_before_the_payload(rp):
  c = Raw(rp.addr)
  c.send(struct.pack("<IHHII", 0xFFFFFFF0, P.TPING, 0, 1, 0xFFFFFFF0 - 16))  # nothing follows: no wait for 4 GiB
  code, _, text = c.error()
  assert code == P.EPROTO and str(P.DEFAULT_MAXMSG) in text and c.closed()
  still_serving(rp)

def test_counts_that_disagree_with_the_frame_size(rp):
  for frame in (P.pack(P.TWRITE, 1, payload_len=4, handle=1, offset=0, count=100) + b"abcd",   # count > data
                P.pack(P.TPING, 1, payload_len=8, count=2) + bytes(8),                         # count < data
                P.pack(P.TLOAD, 1, payload_len=4, namelen=0xFFFFFFFF, datalen=5) + bytes(4),   # would wrap in 32 bits
                P.pack(P.TWRITE, 1, handle=1, offset=0, count=1 << 63),                         # huge declared length
                P.pack(P.TLAUNCH, 1, nbufs=40, nvals=40)):                                     # 80 args, and no room for them
    c = Raw(rp.addr)
    c.send(frame)
    code, _, text = c.error()
    assert code == P.EPROTO, text
    assert c.closed()
  still_serving(rp)

def test_truncated_frame_then_silence_ends_only_that_session(rp):
  c = Raw(rp.addr)
  c.send(P.pack(P.TPING, 9, payload_len=1000, count=1000) + b"only ten b")
  still_serving(rp)  # served while the stalled one waits
  t0 = time.time()
  assert c.closed(), "stalled session was not ended"
  assert time.time() - t0 < 10
  assert "stalled mid-frame" in rp.log_text()
  still_serving(rp)

# ---- bad input: handles, ranges, sizes

def test_unknown_freed_and_double_freed_handles(rp):
  c = Raw(rp.addr)
  c.alloc(1, 16); c.req(P.TFREE, handle=1)
  t1 = c.req(P.TFREE, handle=1)            # double free
  t2 = c.write(1, 0, b"x")                 # use after free
  t3 = c.req(P.TREAD, handle=12345, offset=0, count=1)  # never allocated
  assert c.error()[:2] == (P.EHANDLE, t1)
  assert c.error()[:2] == (P.EHANDLE, t2)
  code, tag, text = c.error()
  assert (code, tag) == (P.EHANDLE, t3) and "12345" in text
  c.alloc(2, 4)
  tag = c.alloc(2, 4)
  (code, etag, text), = c.errors(1)
  assert (code, etag) == (P.EEXIST, tag) and "buffer handle 2 is already in use" in text
  still_serving(rp)

@pytest.mark.parametrize("offset,count", [(17, 0), (0, 17), (8, 9), (2**64 - 8, 16), (16, 2**64 - 1)])
def test_ranges_past_the_end_or_wrapping(rp, offset, count):
  c = Raw(rp.addr)
  c.alloc(1, 16); c.alloc(2, 16)
  t1 = c.req(P.TREAD, handle=1, offset=offset, count=count)
  code, tag, text = c.error()
  assert (code, tag) == (P.ERANGE, t1) and "outside buffer 1 of 16 bytes" in text
  t2 = c.req(P.TCOPY, dst=2, src=1, dstoff=offset, srcoff=0, count=count)
  t3 = c.req(P.TCOPY, dst=2, src=1, dstoff=0, srcoff=offset, count=count)
  assert [(code, tag) for code, tag, _ in c.errors(2)] == [(P.ERANGE, t2), (P.ERANGE, t3)]
  still_serving(rp)

def test_write_out_of_range_consumes_its_data_and_keeps_the_session(rp):
  c = Raw(rp.addr)
  c.alloc(1, 16)
  t1 = c.write(1, 8, b"0123456789")        # 8 + 10 > 16
  t2 = c.write(1, 2**64 - 4, b"12345678")  # offset + count wraps around 64 bits
  errs = c.errors(2)                       # the data bytes were consumed, not parsed as frames
  assert [(code, tag) for code, tag, _ in errs] == [(P.ERANGE, t1), (P.ERANGE, t2)]
  assert "write of 10 bytes at offset 8 is outside buffer 1 of 16 bytes" in errs[0][2]
  assert c.read(1, 0, 16) == bytes(16), "nothing was written"
  still_serving(rp)

def test_zero_size_and_over_limit_allocations():
  with runner("--session-mem", "1M") as r:
    c = Raw(r.addr)
    t1 = c.alloc(1, 0)
    t2 = c.alloc(2, 1 << 62)
    t3 = c.alloc(3, 2 << 20)
    c.alloc(4, 600 << 10)
    t5 = c.alloc(5, 600 << 10)
    c.req(P.TPING, count=0)
    code, tag, text = c.error(); assert (code, tag) == (P.EINVAL, t1) and "size is 0" in text
    code, tag, text = c.error(); assert (code, tag) == (P.ELIMIT, t2) and "larger than the largest" in text
    code, tag, text = c.error(); assert (code, tag) == (P.ELIMIT, t3) and "session's limit" in text
    code, tag, text = c.error(); assert (code, tag) == (P.ELIMIT, t5) and "session's limit of 1048576 bytes (614400 in use)" in text
    assert c.frame()[0] == P.RPING
    still_serving(r)

def test_handle_limit():
  with runner("--max-handles", "3") as r:
    c = Raw(r.addr)
    for h in range(3): c.alloc(h, 4)
    tag = c.alloc(3, 4)
    (code, etag, text), = c.errors(1)
    assert (code, etag) == (P.ELIMIT, tag) and "session has 3 handles, the limit" in text
    c.req(P.TFREE, handle=0); c.alloc(3, 4)   # freeing one makes room
    assert c.read(3, 0, 4) == bytes(4)

# ---- bad input: programs and launches

def test_launch_with_wrong_argument_counts_or_unloaded_program(rp, add1):
  arch, img, entry = add1
  c = Raw(rp.addr)
  c.alloc(1, 16)
  c.load(1, img, "add1", nbufs=2, nvals=1, entry=entry)
  t1 = c.launch(1, [(1, 0)], [4])                           # too few
  t2 = c.launch(1, [(1, 0), (1, 0), (1, 0)], [4])           # too many
  t3 = c.launch(2, [(1, 0), (1, 0)], [4])                   # never loaded
  c.req(P.TUNLOAD, prog=1)
  t4 = c.launch(1, [(1, 0), (1, 0)], [4])                   # unloaded
  t5 = c.req(P.TUNLOAD, prog=1)
  t6 = c.launch(3, [(1, 0)], [], global_size=(0, 1, 1))
  c.req(P.TPING, count=0)
  code, tag, text = c.error(); assert (code, tag) == (P.EINVAL, t1) and "takes 2 buffers and 1 values; the launch passed 1 and 1" in text
  code, tag, text = c.error(); assert (code, tag) == (P.EINVAL, t2) and "passed 3 and 1" in text
  assert c.error()[:2] == (P.EHANDLE, t3)
  assert c.error()[:2] == (P.EHANDLE, t4)
  assert c.error()[:2] == (P.EHANDLE, t5)
  assert c.error()[:2] == (P.EHANDLE, t6)
  assert c.frame()[0] == P.RPING

def test_launch_buffer_offset_past_the_end(rp, add1):
  arch, img, entry = add1
  c = Raw(rp.addr)
  c.alloc(1, 16)
  c.load(1, img, "add1", nbufs=2, nvals=1, entry=entry)
  tag = c.launch(1, [(1, 0), (1, 17)], [0], wait=True)
  code, etag, text = c.error()
  assert (code, etag) == (P.ERANGE, tag) and "offset 17 is past the end of buffer 1" in text

def test_program_for_the_wrong_arch_corrupt_or_of_another_kind(rp, add1):
  arch, img, entry = add1
  c = Raw(rp.addr)
  t1 = c.load(1, img, "add1", arch=P.ARCH_ARM64)
  t2 = c.load(2, img, "add1", crc=0xDEADBEEF)
  t3 = c.load(3, b"kernel void k() {}", "k", kind=P.PROG_METAL_SOURCE, arch=0)
  t4 = c.load(4, b"MTLB....", "k", kind=P.PROG_METALLIB, arch=0)
  t5 = c.load(5, img, "add1", entry=len(img))
  t6 = c.load(6, img, "a\0b")
  t7 = c.load(7, img, "add1", nbufs=60, nvals=10)
  c.req(P.TPING, count=0)
  code, tag, text = c.error(); assert (code, tag) == (P.EPROGRAM, t1) and "image is for arm64, this runner is x86_64" in text
  code, tag, text = c.error(); assert (code, tag) == (P.EPROGRAM, t2) and "corrupt" in text
  code, tag, text = c.error(); assert (code, tag) == (P.EKIND, t3) and "backend cpu does not accept Metal source programs" in text
  code, tag, text = c.error(); assert (code, tag) == (P.EKIND, t4) and "metallib" in text
  code, tag, text = c.error(); assert (code, tag) == (P.EPROGRAM, t5) and "outside" in text
  code, tag, text = c.error(); assert (code, tag) == (P.EINVAL, t6) and "no NUL" in text
  code, tag, text = c.error(); assert (code, tag) == (P.EINVAL, t7) and "70 arguments" in text
  assert c.frame()[0] == P.RPING
  still_serving(rp)

def test_crashing_kernel_ends_only_its_session():
  with runner("--isolation", "process") as r:
    other = Raw(r.addr)
    other.alloc(1, 4096); other.write(1, 0, b"kept" * 1024)
    arch, img, entry = compile_kernel(CRASH, "crash")
    c = Raw(r.addr)
    c.alloc(1, 16)
    c.load(1, img, "crash", entry=entry)
    t0 = c.req(P.TFREE, handle=77)          # an error still queued when the kernel crashes is sent first, not lost
    tag = c.launch(1, [(1, 0)], wait=True)
    assert c.error()[:2] == (P.EHANDLE, t0)
    code, etag, text = c.error()
    assert (code, etag) == (P.ECRASH, tag) and text == "kernel crash crashed: SIGSEGV"
    assert c.closed()
    assert other.read(1, 0, 4096) == b"kept" * 1024, "the other session lost its data"
    still_serving(r)
    assert "a kernel crashed" in r.log_text()

def test_kernel_time_limit_ends_only_its_session():
  with runner("--kernel-timeout", "1") as r:
    arch, img, entry = compile_kernel(SPIN, "spin")
    c = Raw(r.addr)
    c.alloc(1, 16)
    c.load(1, img, "spin", entry=entry)
    tag = c.launch(1, [(1, 0)])
    other = Raw(r.addr)
    still_serving(r)                       # served while the kernel spins on one core
    code, etag, text = c.error()
    assert (code, etag) == (P.ETIMEOUT, tag) and "ran past the runner's kernel time limit" in text
    assert c.closed()
    assert other.ping(b"ok") == b"ok"

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
    with open(f"/proc/{r.proc.pid}/task/{r.proc.pid}/children") as f: child = int(f.read().split()[0])
    before = vm_size_kb(child)
    c.send(P.pack(P.TPING, 1, payload_len=60 << 20, count=60 << 20))
    for _ in range(200):
      c.send(b"x" * 512)
      time.sleep(0.001)
    time.sleep(0.2)
    grown = vm_size_kb(child) - before
    assert grown < 4096, f"session grew {grown} KiB of address space for 100 KiB received"
    still_serving(r)

def test_oversized_hello_is_a_framing_error(rp):
  c = Raw(rp.addr, hello=False)
  c.send(P.pack(P.THELLO, 1, payload_len=4096, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG) + bytes(4096))
  code, _, text = c.error()
  assert code == P.EPROTO and "Thello" in text and c.closed()
  still_serving(rp)

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
  assert "stopping: 1 sessions open" in log and "warning" not in log
  r.stop()
