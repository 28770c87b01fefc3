"""Tclock/Rclock and Tprofile/Rprofile: the runner's profile clock and its records of kernels and copies."""
import time
import pytest
from conformance.spec import P, section, one_error, ok, kernel
from wire import f32

def clock(c) -> int:
  tag = c.req(P.TCLOCK)
  t, f, p = c.frame()
  assert (t, f["tag"], f["size"], p) == (P.RCLOCK, tag, 24, b"")
  return f["clock"]

def profile(c, mode:int=P.PROFILE_ON, count:int=0xffffffff) -> tuple[dict, list[dict]]:
  tag = c.req(P.TPROFILE, mode=mode, count=count)
  t, f, p = c.frame()
  assert (t, f["tag"]) == (P.RPROFILE, tag), (t, f, p[:200])
  assert f["size"] == 32 + 40 * f["count"] and len(p) == 40 * f["count"]
  return f, [P.PROF.unpack(p, 40 * i) for i in range(f["count"])]

def copies(c, n:int) -> bytes:
  """n Tcopy frames of 4 bytes from buffer 1 to buffer 2, as one send."""
  return b"".join(P.pack(P.TCOPY, 1000 + i, dst=2, src=1, count=4) for i in range(n))

# *** Tclock

@section("Tclock, Rclock", "Thello, Rhello")
def test_runner_announces_cap_profile(c):
  assert c.info["caps"] & P.CAP_PROFILE

@section("Tclock, Rclock")
def test_clock_is_nanoseconds_that_never_go_back(c):
  a = clock(c)
  time.sleep(0.05)
  b = clock(c)
  assert 0.04e9 <= b - a <= 5e9, f"50 ms on the host are {b - a} ns on the runner's profile clock"
  seq = [clock(c) for _ in range(20)]
  assert all(x <= y for x, y in zip(seq, seq[1:])), seq

@section("Tclock, Rclock")
def test_clock_does_not_wait_for_queued_errors_to_be_asked_for(c):
  tag = c.req(P.TFREE, handle=404)
  t0 = c.req(P.TCLOCK)
  code, etag, _ = c.error()   # a queued error goes out ahead of the next reply
  t, f, _ = c.frame()
  assert (code, etag, t, f["tag"]) == (P.EHANDLE, tag, P.RCLOCK, t0)

@section("Tclock, Rclock")
def test_a_cpu_runners_clock_is_the_systems_monotonic_clock(target, c):
  if target.external or target.backend != "cpu": pytest.skip("needs a CPU runner on this machine (started by the suite)")
  t0 = time.monotonic_ns()
  r = clock(c)
  t1 = time.monotonic_ns()
  assert t0 <= r <= t1, f"CLOCK_MONOTONIC went {t0}..{t1}, the runner said {r}"

@section("Tclock, Rclock")
def test_tclock_ignores_flags_and_fails_only_by_framing(c):
  tag = c.req(P.TCLOCK, flags=P.FWAIT | 0x8000)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RCLOCK, tag)

# *** Tprofile

@section("Tprofile, Rprofile")
def test_profile_is_off_at_start_and_records_nothing(c):
  c.alloc(1, 16); c.alloc(2, 16); c.write(1, 0, f32(1, 2, 3, 4))
  c.req(P.TCOPY, dst=2, src=1, count=16)
  f, recs = profile(c, P.PROFILE_OFF)
  assert (f["count"], f["left"], f["lost"], f["cap"], recs) == (0, 0, 0, 0, [])
  f, recs = profile(c, P.PROFILE_ON)   # work done while it was off left nothing behind
  assert (f["count"], f["left"], f["cap"]) == (0, 0, P.PROFILE_RECORDS)

@section("Tprofile, Rprofile")
def test_one_record_per_kernel_graph_entry_and_copy_in_request_order(target, c):
  kernel(target, "add1").load(c, 7)
  for h in (1, 2): c.alloc(h, 64)
  profile(c, P.PROFILE_ON, 0)
  before = clock(c)
  tw = c.write(1, 0, f32(*range(16)))
  tc = c.req(P.TCOPY, dst=2, src=1, dstoff=0, srcoff=0, count=64)
  tl = c.launch(7, [(2, 0), (1, 0)], [16])
  tg0 = c.req(P.TGRAPH, P.launch_record(7, [(2, 0), (1, 0)], [16]) * 3, graph=5, count=3)
  tg = c.req(P.TGRAPHRUN, graph=5, count=0)
  assert c.read(2, 0, 8) == f32(1, 2)
  tr = c.tag
  f, recs = profile(c)
  after = clock(c)
  assert (f["count"], f["left"], f["lost"], f["cap"]) == (7, 0, 0, P.PROFILE_RECORDS)
  got = [(r["kind"], r["tag"], r["entry"], r["handle"], r["aux"], r["count"]) for r in recs]
  assert got == [(P.PROF_WRITE, tw, 0, 1, 0, 64), (P.PROF_COPY, tc, 0, 2, 1, 64), (P.PROF_LAUNCH, tl, 0, 7, 0, 0),
                 (P.PROF_GRAPH, tg, 0, 7, 5, 0), (P.PROF_GRAPH, tg, 1, 7, 5, 0), (P.PROF_GRAPH, tg, 2, 7, 5, 0),
                 (P.PROF_READ, tr, 0, 2, 0, 8)], (got, tg0)
  # in the profile clock: inside the Tclocks around them, in order, none ending before it starts
  assert all(before <= r["start"] <= r["end"] <= after for r in recs), (before, recs, after)
  assert all(a["end"] <= b["start"] for a, b in zip(recs, recs[1:])), recs

@section("Tprofile, Rprofile")
def test_count_limits_the_records_and_left_says_how_many_remain(c):
  c.alloc(1, 16); c.alloc(2, 16)
  profile(c, P.PROFILE_ON, 0)
  c.send(copies(c, 5))
  f, recs = profile(c, count=2)
  assert (f["count"], f["left"], [r["tag"] for r in recs]) == (2, 3, [1000, 1001])
  f, recs = profile(c, count=0)
  assert (f["count"], f["left"]) == (0, 3)
  f, recs = profile(c)
  assert (f["count"], f["left"], [r["tag"] for r in recs]) == (3, 0, [1002, 1003, 1004])

@section("Tprofile, Rprofile")
def test_failed_requests_make_no_record(c):
  c.alloc(1, 16); c.alloc(2, 16)
  profile(c, P.PROFILE_ON, 0)
  bad = [c.req(P.TCOPY, dst=2, src=1, dstoff=8, count=16), c.req(P.TCOPY, dst=2, src=404, count=4), c.launch(404, [(1, 0)]),
         c.req(P.TGRAPHRUN, graph=404, count=0), c.write(404, 0, b"abcd"), c.req(P.TREAD, handle=404, offset=0, count=4),
         c.req(P.TREAD, handle=1, offset=8, count=16)]
  good = c.req(P.TCOPY, dst=2, src=1, count=4)
  assert [e[1] for e in c.until_pong()] == bad
  f, recs = profile(c)
  assert [(r["kind"], r["tag"]) for r in recs] == [(P.PROF_COPY, good)]

@section("Tprofile, Rprofile")
def test_a_graph_run_that_fails_at_any_entry_makes_no_record(target, c):
  kernel(target, "add1").load(c, 7)
  for h in (1, 2, 3): c.alloc(h, 16)
  c.req(P.TGRAPH, P.launch_record(7, [(2, 0), (1, 0)], [4]) + P.launch_record(7, [(3, 0), (1, 0)], [4]), graph=5, count=2)
  c.req(P.TFREE, handle=3)
  profile(c, P.PROFILE_ON, 0)
  bad = c.req(P.TGRAPHRUN, graph=5, count=0)   # entry 1 names a freed buffer: nothing runs
  assert [e[:2] for e in c.until_pong()] == [(P.EHANDLE, bad)]
  c.alloc(3, 16)
  good = c.req(P.TGRAPHRUN, graph=5, count=0)
  f, recs = profile(c)
  assert [(r["kind"], r["tag"], r["entry"]) for r in recs] == [(P.PROF_GRAPH, good, 0), (P.PROF_GRAPH, good, 1)], recs

@section("Tprofile, Rprofile")
def test_the_profile_is_the_sessions_own(target, c):
  c.alloc(1, 16); c.alloc(2, 16)
  profile(c, P.PROFILE_ON, 0)
  d = target.connect()
  d.alloc(1, 16); d.alloc(2, 16)
  d.send(copies(d, 3))
  f, recs = profile(d, P.PROFILE_OFF)   # d's profile was never on
  assert (f["count"], f["cap"]) == (0, 0)
  c.send(copies(c, 1))
  f, recs = profile(c)
  assert [r["tag"] for r in recs] == [1000], "another session's work is in this session's profile"
  d.close()

@section("Tprofile, Rprofile")
def test_the_profiles_memory_is_not_counted_in_the_sessions(target):
  t = target.with_options("--session-mem", "1M")
  c = t.connect()
  assert c.info["memory"] == 1 << 20
  profile(c, P.PROFILE_ON, 0)
  c.alloc(1, 1 << 20)   # the whole of Rhello.memory, with the profile's 2.5 MiB set aside
  ok(c)
  c.close()

@section("Tprofile, Rprofile")
def test_a_twrites_span_includes_its_data_still_in_the_network(c):
  c.alloc(1, 8192)
  profile(c, P.PROFILE_ON, 0)
  data = bytes(range(256)) * 32
  frame = P.pack(P.TWRITE, 77, payload_len=len(data), handle=1, offset=0, count=len(data)) + data
  c.send(frame[:-4096])
  time.sleep(0.1)   # the last 4 KiB arrive 100 ms later
  c.send(frame[-4096:])
  assert c.read(1, 0, 8192) == data
  f, recs = profile(c)
  w = recs[0]
  assert (w["kind"], w["tag"], w["count"]) == (P.PROF_WRITE, 77, 8192) and w["end"] - w["start"] >= 0.05e9, w

@section("Tprofile, Rprofile")
def test_off_discards_what_it_does_not_return_and_on_starts_empty(c):
  c.alloc(1, 16); c.alloc(2, 16)
  profile(c, P.PROFILE_ON, 0)
  c.send(copies(c, 4))
  f, recs = profile(c, P.PROFILE_OFF, count=1)
  assert (f["count"], f["left"], f["cap"], recs[0]["tag"]) == (1, 0, 0, 1000)
  c.send(copies(c, 2))   # not recorded: the profile is off
  f, recs = profile(c, P.PROFILE_ON)
  assert (f["count"], f["left"]) == (0, 0)

@section("Tprofile, Rprofile")
def test_unknown_mode_is_einval_and_changes_nothing(c):
  c.alloc(1, 16); c.alloc(2, 16)
  profile(c, P.PROFILE_ON, 0)
  c.send(copies(c, 1))
  tag = c.req(P.TPROFILE, mode=2, count=10)
  code, etag, text = c.error()
  assert (code, etag) == (P.EINVAL, tag) and "mode 2" in text
  ok(c)
  f, recs = profile(c)
  assert [r["tag"] for r in recs] == [1000]

@section("Tprofile, Rprofile", "Limits")
def test_an_rprofile_never_exceeds_maxmsg(target):
  c = target.connect(maxmsg=P.MIN_MAXMSG)
  c.alloc(1, 16); c.alloc(2, 16)
  profile(c, P.PROFILE_ON, 0)
  c.send(copies(c, 1700))
  most = (P.MIN_MAXMSG - 32) // 40
  f, recs = profile(c)
  assert (f["count"], f["left"], f["size"]) == (most, 1700 - most, 32 + 40 * most) and f["size"] <= P.MIN_MAXMSG
  f, recs = profile(c)
  assert (f["count"], f["left"], recs[-1]["tag"]) == (1700 - most, 0, 1000 + 1699)
  c.close()

@section("Tprofile, Rprofile", "Limits")
def test_a_full_profile_counts_what_it_did_not_keep(c):
  c.alloc(1, 16); c.alloc(2, 16)
  profile(c, P.PROFILE_ON, 0)
  extra = 5
  c.send(copies(c, P.PROFILE_RECORDS + extra))
  f, recs = profile(c)
  assert (f["count"], f["left"], f["lost"]) == (P.PROFILE_RECORDS, 0, extra)
  assert recs[-1]["tag"] == 1000 + P.PROFILE_RECORDS - 1   # the oldest are kept; later work is done but not recorded
  f, _ = profile(c)
  assert (f["count"], f["lost"]) == (0, 0)   # lost counts since the previous Rprofile

@section("Tprofile, Rprofile")
def test_left_and_cap_are_those_after_the_mode_is_applied(c):
  c.alloc(1, 16); c.alloc(2, 16)
  f, _ = profile(c, P.PROFILE_ON, 0)              # turns it on: cap already counts
  assert (f["count"], f["left"], f["cap"]) == (0, 0, P.PROFILE_RECORDS), f
  c.send(copies(c, 3))
  f, _ = profile(c, P.PROFILE_ON, 1)
  assert (f["count"], f["left"], f["cap"]) == (1, 2, P.PROFILE_RECORDS), f
  f, recs = profile(c, P.PROFILE_OFF, 1)          # one returned, one discarded: neither is left, and the cap is gone
  assert (f["count"], f["left"], f["cap"], recs[0]["tag"]) == (1, 0, 0, 1001), f
  f, _ = profile(c, P.PROFILE_OFF, 1)
  assert (f["count"], f["left"], f["cap"]) == (0, 0, 0), f
