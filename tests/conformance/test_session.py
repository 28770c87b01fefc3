"""Encoding, Messages, Rerror, Pipelining and error delivery, Robustness rules, Handles, Error codes, Limits and Isolation:
the rules that hold for every request."""
import re, socket, struct, time
import pytest
from conformance.spec import P, Raw, section, one_error, ok, fatal, closed, kernel
from wire import f32

# *** Encoding and Messages

@section("Encoding")
def test_pad_fields_and_reserved_flag_bits_are_ignored_on_receipt(c):
  c.alloc(1, 16); c.alloc(2, 16)
  c.write(1, 0, bytes(range(16)))
  c.send(P.pack(P.TCOPY, 50, flags=0xfffe, dst=2, src=1, pad=0xdeadbeef, dstoff=0, srcoff=0, count=16))
  tag = c.req(P.TPING, b"ab", flags=0xfffe, count=2)
  t, f, p = c.frame()
  assert (t, f["tag"], p) == (P.RPING, tag, b"ab")
  assert c.read(2, 0, 16) == bytes(range(16))

@section("Encoding", "Messages")
def test_replies_are_little_endian_with_exact_sizes(c):
  tag = c.req(P.TPING, b"xyz", count=3)
  raw = c.recv_exact(19)
  assert struct.unpack_from("<IHHII", raw) == (19, P.RPING, 0, tag, 3) and raw[16:] == b"xyz"

@section("Encoding")
@pytest.mark.cpu_only
def test_a_launch_value_is_signed(target, c):
  """add1's n = -1 as a signed value runs no iteration; read as 2**64 - 1 it would run past the buffer."""
  k = kernel(target, "add1")
  c.alloc(1, 8); c.write(1, 0, f32(5, 6))
  k.load(c, 1)
  c.launch(1, [(1, 0), (1, 0)], [-1]); c.launch(1, [(1, 0), (1, 0)], [-(1 << 63)]); c.launch(1, [(1, 4), (1, 4)], [1])
  assert c.read(1, 0, 8) == f32(5, 7)
  ok(c)

@section("Encoding", "Thello, Rhello")
def test_rhello_strings_are_utf8_padded_with_nul_bytes(target):
  i = Raw(target.addr).info
  for f in ("name", "arch", "cpu", "features"):
    text = i[f].split(b"\0", 1)[0]
    assert i[f] == text + bytes(len(i[f]) - len(text)), f"Rhello.{f} {i[f]!r}: after its text, only NUL bytes"
    text.decode("utf-8")
  assert P.cstr(i["arch"]), "Rhello.arch is empty"
  feats = P.cstr(i["features"])
  if i["backend"] == P.BACKEND_METAL:   # the newest Metal language version its macOS has (Thello, Rhello)
    assert feats == "" or re.fullmatch(r"\d+\.\d+", feats), f"features {feats!r}: not MAJOR.MINOR"
  else: assert feats == "" or all(x[:1] in ("+", "-") and len(x) > 1 for x in feats.split(",")), f"features {feats!r}: not a list of +f,-g"

@section("Encoding", "Messages")
def test_replies_have_their_table_size_and_send_reserved_flags_and_pad_as_zero(target):
  """Each reply is its fixed size plus its counts, exactly; a request's flags are not echoed (reserved bits are sent as zero
  whatever the request carried) and a reply's pad fields are zero."""
  c = Raw(target.addr, hello=False)
  c.send(P.pack(P.THELLO, 5, flags=0xfffc, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG))
  raw = c.recv_exact(P.MSGS[P.RHELLO].size)
  assert struct.unpack_from("<IHHI", raw) == (328, P.RHELLO, 0, 5)
  c.close()
  c = target.connect()
  c.alloc(1, 8)
  reqs = [(P.pack(P.TPING, 6, flags=0xfffc, payload_len=3, count=3) + b"abc", P.RPING, 16 + 3),
          (P.pack(P.TSYNC, 7, flags=0xfffc), P.RSYNC, 12),
          (P.pack(P.TREAD, 8, flags=0xfffc, handle=1, offset=2, count=6), P.RREAD, 16 + 6),
          (P.pack(P.TREAD, 9, flags=0xfffc, handle=2, offset=0, count=1), P.RERROR, None)]
  if c.info["caps"] & P.CAP_PROFILE: reqs.append((P.pack(P.TCLOCK, 10, flags=0xfffc), P.RCLOCK, 24))
  for frame, rtype, rsize in reqs:
    c.send(frame)
    hdr = c.recv_exact(P.HDR_SIZE)
    size, t, flags, tag = struct.unpack("<IHHI", hdr)
    body = c.recv_exact(size - P.HDR_SIZE)
    assert (t, tag) == (rtype, struct.unpack_from("<I", frame, 8)[0])
    assert flags & ~(P.FWAIT | P.FCACHE) == 0, f"{P.TYPE_NAMES[t]} has reserved flag bits {flags:#x}"
    f = P.unpack(hdr + body)[1]
    if rsize is None: rsize = 20 + f["count"]
    assert size == rsize, f"{P.TYPE_NAMES[t]} of {size} bytes, expected {rsize}"
    assert f.get("pad", 0) == 0, f"{P.TYPE_NAMES[t]} pad {f['pad']:#x}"

@section("Messages")
def test_the_reply_to_t_has_type_t_plus_1_and_its_tag(c):
  c.alloc(1, 8)
  for type, fields, reply in ((P.TPING, {"count": 0}, P.RPING), (P.TSYNC, {}, P.RSYNC), (P.TREAD, {"handle": 1, "count": 8}, P.RREAD)):
    tag = c.req(type, **fields)
    t, f, _ = c.frame()
    assert (t, f["tag"]) == (reply, tag) == (type + 1, tag)

@section("Messages")
def test_tags_are_copied_and_a_repeated_tag_is_not_rejected(c):
  for tag in (0, 7, 7, 0xffffffff):
    c.send(P.pack(P.TPING, tag, count=0))
    t, f, _ = c.frame()
    assert (t, f["tag"]) == (P.RPING, tag)

@section("Messages")
def test_requests_without_a_reply_send_nothing_on_success(target, c):
  c.alloc(1, 16); c.write(1, 0, b"x" * 16)
  c.req(P.TCOPY, dst=1, src=1, count=8); c.req(P.TFREE, handle=1)
  ok(c)  # the next frame is the Rping's reply

@section("Messages")
@pytest.mark.cpu_only
def test_program_and_graph_requests_without_fwait_send_nothing_on_success(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 8); c.write(1, 0, f32(1, 2))
  k.load(c, 1)
  c.launch(1, [(1, 0), (1, 0)], [2])
  c.req(P.TGRAPH, P.launch_record(1, [(1, 0), (1, 0)], [2]), graph=1, count=1)
  c.req(P.TGRAPHRUN, graph=1, count=0)
  c.req(P.TGRAPHFREE, graph=1); c.req(P.TUNLOAD, prog=1)
  ok(c)  # the next frame is the Rping's reply
  assert c.read(1, 0, 8) == f32(3, 4)

@section("Thello, Rhello")
def test_sessions_at_once_have_different_numbers(target):
  cs = [target.connect() for _ in range(4)]
  assert len({c.info["session"] for c in cs}) == 4, [c.info["session"] for c in cs]

@section("Messages", "Robustness rules")
@pytest.mark.parametrize("type", sorted(t for t in P.MSGS if P.is_request(t) and P.MSGS[t].size > P.HDR_SIZE), ids=lambda t: P.TYPE_NAMES[t])
def test_request_smaller_than_its_fixed_part_is_eproto(target, type):
  c = target.connect() if type != P.THELLO else Raw(target.addr, hello=False)
  size = P.MSGS[type].size - 1
  c.send(struct.pack("<IHHI", size, type, 0, 61) + bytes(size - 12))
  fatal(c, P.EPROTO, 61)

@section("Messages", "Robustness rules")
@pytest.mark.parametrize("type", [P.TSYNC, P.TALLOC, P.TFREE, P.TREAD, P.TCOPY, P.TUNLOAD, P.TGRAPHFREE], ids=lambda t: P.TYPE_NAMES[t])
def test_fixed_size_request_with_bytes_over_is_eproto(c, type):
  size = P.MSGS[type].size + 4
  c.send(struct.pack("<IHHI", size, type, 0, 62) + bytes(size - 12))
  fatal(c, P.EPROTO, 62)

# *** Rerror

@section("Rerror")
def test_rerror_text_is_nonempty_utf8_at_most_1024_bytes_without_nul(c):
  tags = [c.req(P.TFREE, handle=h) for h in (1, 0xffffffff)]
  tags.append(c.req(P.TREAD, handle=5, offset=2**64 - 1, count=2**64 - 1))
  c.send(P.pack(P.TPING, 99, count=0))
  for want in tags:
    t, f, p = c.frame()
    assert (t, f["tag"]) == (P.RERROR, want)
    assert f["count"] == len(p) and 1 <= len(p) <= P.MAX_ERRTEXT and b"\0" not in p and b"\n" not in p  # one line
    p.decode("utf-8")
  assert c.frame()[0] == P.RPING

@section("Rerror")
def test_rerror_text_names_the_values_involved(c):
  c.alloc(21, 16)
  cases = [(c.req(P.TREAD, handle=21, offset=17, count=3), P.ERANGE, ("21", "17", "3", "16")),
           (c.write(21, 15, b"abc"), P.ERANGE, ("21", "15", "3", "16")),
           (c.req(P.TCOPY, dst=21, src=21, dstoff=9, srcoff=0, count=8), P.ERANGE, ("21", "9", "8", "16")),
           (c.req(P.TFREE, handle=4242), P.EHANDLE, ("4242",)),
           (c.alloc(21, 5), P.EEXIST, ("21",))]
  errs = c.until_pong()
  assert [e[:2] for e in errs] == [(code, tag) for tag, code, _ in cases]
  for (_, _, text), (_, code, values) in zip(errs, cases):
    assert all(v in text for v in values), f"{P.ERRORS[code]} {text!r} does not name {values}"

# *** Pipelining and error delivery

@section("Pipelining and error delivery")
def test_queued_errors_arrive_oldest_first_before_the_next_reply(c):
  tags = [c.req(P.TFREE, handle=1000 + i) for i in range(3)]
  c.send(P.pack(P.TPING, 77, count=0))
  assert [c.error()[:2] for _ in tags] == [(P.EHANDLE, t) for t in tags]
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RPING, 77)

@section("Pipelining and error delivery")
def test_a_failing_request_with_a_reply_gets_its_rerror_after_the_queued_ones(c):
  t1 = c.req(P.TFREE, handle=1)
  t2 = c.req(P.TREAD, handle=1, offset=0, count=1)
  assert [c.error()[:2] for _ in range(2)] == [(P.EHANDLE, t1), (P.EHANDLE, t2)]
  ok(c)

@section("Pipelining and error delivery", "Limits")
def test_after_64_queued_errors_one_emore_counts_the_rest(c):
  tags = [c.req(P.TFREE, handle=5000 + i) for i in range(70)]
  c.req(P.TPING, count=0)
  assert [c.error()[1] for _ in range(64)] == tags[:64]
  code, tag, text = c.error()
  assert (code, tag, text) == (P.EMORE, tags[-1], "6 more errors not shown")
  assert c.frame()[0] == P.RPING
  ok(c)  # the count starts again

@section("Pipelining and error delivery")
def test_queued_errors_go_out_before_a_final_eproto(c):
  t1 = c.req(P.TFREE, handle=1)
  c.send(struct.pack("<IHHI", 12, 999, 0, 43))
  assert c.error()[:2] == (P.EHANDLE, t1)
  fatal(c, P.EPROTO, 43)

@section("Pipelining and error delivery")
def test_a_failed_request_changes_nothing_and_dependents_fail_in_turn(c):
  t1 = c.alloc(1, 0)                         # fails: allocates nothing
  t2 = c.write(1, 0, b"data")                # so this is EHANDLE in its turn
  c.alloc(2, 4); c.write(2, 0, b"good")      # and the requests after it are processed normally
  assert [e[:2] for e in c.until_pong()] == [(P.EINVAL, t1), (P.EHANDLE, t2)]
  assert c.read(2, 0, 4) == b"good"

@section("Pipelining and error delivery")
@pytest.mark.cpu_only
def test_pipelined_launches_run_in_the_order_sent(target, c):
  k = kernel(target, "add1")
  c.alloc(1, 4); c.write(1, 0, f32(0))
  k.load(c, 1)
  fields, args = P.launch_fields(1, [(1, 0), (1, 0)], [1]), P.launch_args([(1, 0), (1, 0)], [1])
  c.send(b"".join(P.pack(P.TLAUNCH, 1000 + i, payload_len=len(args), **fields) + args for i in range(2000)))
  assert c.read(1, 0, 4) == f32(2000)

# *** Robustness rules

@section("Robustness rules")
def test_unknown_type_is_eproto_naming_it(c):
  c.send(struct.pack("<IHHI", 12, 999, 0, 42))
  assert "999" in fatal(c, P.EPROTO, 42)

@section("Robustness rules")
@pytest.mark.parametrize("type", [P.RERROR, P.RHELLO, P.RPING, P.RSYNC, P.RREAD, P.RLAUNCH], ids=lambda t: P.TYPE_NAMES[t])
def test_a_reply_type_sent_by_a_client_is_eproto(c, type):
  size = P.MSGS[type].size
  c.send(struct.pack("<IHHI", size, type, 0, 43) + bytes(size - 12))
  fatal(c, P.EPROTO, 43)

@section("Robustness rules")
def test_size_smaller_than_the_header_is_eproto(c):
  c.send(struct.pack("<IHHI", 5, P.TPING, 0, 1))
  assert "5" in fatal(c, P.EPROTO, 1)

@section("Robustness rules")
def test_size_above_maxmsg_is_refused_before_the_payload(c):
  c.send(struct.pack("<IHHII", 0xFFFFFFF0, P.TPING, 0, 1, 0xFFFFFFF0 - 16))  # nothing follows: no wait for 4 GiB
  fatal(c, P.EPROTO, 1)

@section("Robustness rules")
@pytest.mark.parametrize("frame", [
  P.pack(P.TWRITE, 1, payload_len=4, handle=1, offset=0, count=100) + b"abcd",
  P.pack(P.TPING, 1, payload_len=8, count=2) + bytes(8),
  P.pack(P.TLOAD, 1, payload_len=4, namelen=0xFFFFFFFF, datalen=5) + bytes(4),
  P.pack(P.TWRITE, 1, handle=1, offset=0, count=1 << 63),
  P.pack(P.TLAUNCH, 1, nbufs=40, nvals=40),
  P.pack(P.TLAUNCH, 1, payload_len=8, nbufs=1, nvals=0) + bytes(8),
  P.pack(P.TPEERSEND, 1, payload_len=9, handle=1, count=1, port=1, hostlen=5) + b"127.0.0.1",
], ids=["twrite-count>data", "tping-count<data", "tload-wrapping-lengths", "twrite-huge", "tlaunch-80-args", "tlaunch-short",
        "tpeersend-hostlen<host"])
def test_counts_that_disagree_with_the_frame_size_are_eproto(c, frame):
  c.send(frame)
  fatal(c, P.EPROTO, 1)

@section("Robustness rules")
def test_a_semantic_error_ends_only_that_request(c):
  c.alloc(1, 4)
  tag = c.alloc(1, 4)
  one_error(c, P.EEXIST, tag)
  c.write(1, 0, b"kept")
  assert c.read(1, 0, 4) == b"kept"

@section("Robustness rules")
def test_a_client_that_stalls_mid_frame_is_disconnected_without_a_reply(target):
  t = target.with_options("--frame-timeout", "2")
  c, other = t.connect(), t.connect()
  c.send(P.pack(P.TPING, 9, payload_len=1000, count=1000) + b"only ten b")
  assert other.ping(b"x") == b"x"            # served while the stalled one waits
  t0 = time.monotonic()
  assert closed(c, 10), "a session stalled mid-frame was not ended"
  assert time.monotonic() - t0 < 8

@section("Robustness rules")
def test_an_idle_timeout_ends_an_idle_session_and_not_a_busy_one_or_a_slow_frame(target):
  t = target.with_options("--idle-timeout", "1")
  idle, busy, slow = t.connect(), t.connect(), t.connect()
  t0 = time.monotonic()
  slow.send(P.pack(P.TPING, 5, payload_len=10, count=10) + b"01234")
  for _ in range(8):
    time.sleep(0.3)
    assert busy.ping(b"b") == b"b"
  slow.send(b"56789")                       # 2.4 s after the frame began: timed by the (default 60 s) frame timeout
  t_, f, p = slow.frame()
  assert (t_, f["tag"], p) == (P.RPING, 5, b"0123456789")
  assert closed(idle, 10), "the idle session was not ended"
  assert time.monotonic() - t0 < 6

def holding_most_memory(t):
  """A session holding 800 KiB of a --total-mem 1M runner. An earlier case's session on the same runner may still be
  ending (a runner frees a closed session's memory only once it has seen the close): wait for it, up to 10 s."""
  deadline = time.monotonic() + 10
  while True:
    c = t.connect()
    c.alloc(1, 800 << 10)
    if not c.until_pong(): return c
    c.close()
    if time.monotonic() > deadline: pytest.fail("800 KiB of the runner's 1 MiB never became free")
    time.sleep(0.05)

@section("Robustness rules")
@pytest.mark.parametrize("cut", ["mid-header", "mid-fixed", "mid-data", "mid-data-reset"])
def test_a_client_that_closes_mid_frame_ends_its_session(target, cut):
  """The session ends and frees what it held: a later session can allocate the runner's whole memory again."""
  t = target.with_options("--total-mem", "1M")
  c = holding_most_memory(t)
  tail = {"mid-header": P.pack(P.TPING, 1, count=0)[:5], "mid-fixed": P.pack(P.TLOAD, 3, payload_len=64, namelen=4, datalen=60)[:30],
          "mid-data": P.pack(P.TWRITE, 2, payload_len=100000, handle=1, offset=0, count=100000) + bytes(1000)}[cut.removesuffix("-reset")]
  c.send(tail)
  if cut.endswith("-reset"): c.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a TCP reset
  c.close()
  deadline = time.monotonic() + 10
  while True:
    d = t.connect()
    d.alloc(1, 800 << 10)
    if not d.until_pong(): break
    d.close()
    assert time.monotonic() < deadline, "the memory of the session closed mid-frame never came back"
    time.sleep(0.05)
  d.close()

# *** Handles

@section("Handles")
def test_the_same_number_names_a_buffer_a_program_and_a_graph_at_once(target, c):
  c.alloc(1, 16)
  if target.backend == "cpu" or target.info["caps"] & P.CAP_METAL_SOURCE:
    kernel(target, "add1").load(c, 1)
    c.req(P.TGRAPH, P.launch_record(1, [(1, 0), (1, 0)], [1]), graph=1, count=1)
    c.req(P.TGRAPHRUN, graph=1, count=0)
  ok(c)

@section("Handles")
@pytest.mark.parametrize("h", [0, 1, 0x7fffffff, 0xffffffff])
def test_any_32_bit_value_is_a_valid_handle(c, h):
  c.alloc(h, 4); c.write(h, 0, b"abcd")
  assert c.read(h, 0, 4) == b"abcd"

@section("Handles", "Isolation")
def test_sessions_cannot_see_each_others_handles(target):
  a, b = target.connect(), target.connect()
  a.alloc(1, 4); b.alloc(1, 4)
  a.write(1, 0, b"AAAA"); b.write(1, 0, b"BBBB")
  assert (a.read(1, 0, 4), b.read(1, 0, 4)) == (b"AAAA", b"BBBB")
  a.alloc(9, 4); ok(a)
  tag = b.req(P.TFREE, handle=9)
  one_error(b, P.EHANDLE, tag)
  assert a.read(9, 0, 4) == bytes(4) or a.info["backend"] != P.BACKEND_CPU

@section("Handles")
def test_closing_the_connection_frees_everything_it_held(target):
  t = target.with_options("--total-mem", "1M")
  a = holding_most_memory(t)
  b = t.connect()
  tag = b.alloc(1, 800 << 10)
  one_error(b, P.ELIMIT, tag)
  a.s.shutdown(socket.SHUT_RDWR); a.close()  # no goodbye
  for _ in range(100):
    b.alloc(2, 800 << 10)
    if not b.until_pong(): break
    time.sleep(0.05)
  else: pytest.fail("the memory of the closed session never came back")

MAXH = 8
def handle_limit_target(target):
  t = target.with_options("--max-handles", str(MAXH))
  assert t.info["maxhandles"] == MAXH
  return t

@section("Handles", "Talloc", "Limits")
def test_a_session_holds_at_most_maxhandles_buffers(target):
  c = handle_limit_target(target).connect()
  for h in range(MAXH): c.alloc(h, 4)
  tag = c.alloc(MAXH, 4)
  one_error(c, P.ELIMIT, tag)
  c.req(P.TFREE, handle=0); c.alloc(MAXH, 4)    # freeing one makes room
  ok(c)

@section("Handles", "Tload", "Tgraph")
@pytest.mark.cpu_only
def test_maxhandles_applies_in_each_namespace(target):
  """maxhandles buffers leave room for maxhandles programs and maxhandles graphs; one more of each is ELIMIT."""
  t = handle_limit_target(target)
  k, c = kernel(t, "add1"), t.connect()
  for h in range(MAXH): c.alloc(h, 16)
  for h in range(MAXH): k.load(c, h)
  for h in range(MAXH): c.req(P.TGRAPH, P.launch_record(h, [(0, 0), (1, 0)], [1]), graph=h, count=1)
  ok(c)
  tags = [c.alloc(MAXH, 4), k.load(c, MAXH), c.req(P.TGRAPH, P.launch_record(0, [(0, 0), (1, 0)], [1]), graph=MAXH, count=1)]
  assert [e[:2] for e in c.until_pong()] == [(P.ELIMIT, t) for t in tags]
  c.req(P.TGRAPHFREE, graph=0); c.req(P.TUNLOAD, prog=1); c.req(P.TFREE, handle=2)   # each frees room in its own namespace only
  c.req(P.TGRAPH, P.launch_record(0, [(0, 0), (1, 0)], [1]), graph=MAXH, count=1)
  k.load(c, MAXH); c.alloc(MAXH, 4)
  ok(c)

# *** Error codes

@section("Error codes")
def test_kept_codes_keep_the_connection(target):
  c = target.connect(maxmsg=P.MIN_MAXMSG)
  c.alloc(1, 16)
  got = {}
  got[P.EHANDLE] = c.req(P.TFREE, handle=2)
  got[P.EEXIST] = c.alloc(1, 16)
  got[P.ERANGE] = c.req(P.TCOPY, dst=1, src=1, count=17)
  got[P.EINVAL] = c.alloc(3, 0)
  got[P.ELIMIT] = c.alloc(4, c.info["maxbuf"] + 1)
  kind = next((k for k, cap in P.PROG_CAPS.items() if not c.info["caps"] & cap), None)
  if kind is not None: got[P.EKIND] = c.load(5, b"MTLB" * 4, "k", kind=kind, arch=0)
  assert [e[:2] for e in c.until_pong()] == list((code, t) for code, t in got.items())
  assert c.ping(b"still here") == b"still here"

# *** Limits

@section("Limits")
def test_twrite_and_tping_data_up_to_maxmsg(target):
  c = target.connect(maxmsg=P.MIN_MAXMSG)
  c.alloc(1, P.MIN_MAXMSG)
  c.write(1, 0, b"w" * (P.MIN_MAXMSG - 32))
  assert c.ping(b"p" * (P.MIN_MAXMSG - 16)) == b"p" * (P.MIN_MAXMSG - 16)
  c.send(P.pack(P.TPING, 3, payload_len=P.MIN_MAXMSG - 15, count=P.MIN_MAXMSG - 15) + bytes(P.MIN_MAXMSG - 15))
  fatal(c, P.EPROTO, 3)

# *** Isolation

@section("Isolation")
@pytest.mark.cpu_only
def test_a_crash_leaves_the_runner_and_other_sessions_serving(target):
  target.needs_process_isolation()
  k = kernel(target, "crash")
  others = [target.connect() for _ in range(3)]
  for i, o in enumerate(others): o.alloc(1, 4); o.write(1, 0, b"%4d" % i)
  for _ in range(3):
    c = target.connect()
    c.alloc(1, 16); k.load(c, 1)
    tag = c.launch(1, [(1, 0)])
    fatal(c, P.ECRASH, tag)
  assert [o.read(1, 0, 4) for o in others] == [b"%4d" % i for i in range(3)]
