"""Cache: Twrite with FCACHE, Thave/Rhave and Twritehash (protocol.md, Cache). Cases that need a cache use a runner started
with --cache-dir (a fresh directory per test session), or the --runner given if it announces CAP_CACHE."""
import hashlib, os, tempfile, time
import pytest
from conformance.spec import P, section, one_error, ok, fatal

CACHE_DIR = tempfile.mkdtemp(prefix="conformance-cache")

def cached(target):
  if target.external:
    if not target.info["caps"] & P.CAP_CACHE: pytest.skip("needs a runner with a cache (CAP_CACHE); --runner names one without")
    return target
  return target.with_options("--cache-dir", CACHE_DIR, "--cache-size", "64M")

def have(c, digests:list[bytes]) -> list[int]:
  tag = c.req(P.THAVE, b"".join(digests), count=len(digests))
  t, f, p = c.frame()
  assert (t, f["tag"], f["count"], f["size"]) == (P.RHAVE, tag, len(digests), 16 + len(digests)), (t, f, p[:100])
  assert set(p) <= {0, 1}
  return list(p)

def store(t, data:bytes) -> bytes:
  """Write data with FCACHE on a connection of its own; wait until another session is told the runner holds it."""
  c = t.connect()
  c.alloc(1, len(data))
  c.req(P.TWRITE, data, P.FCACHE, handle=1, offset=0, count=len(data))
  ok(c)
  c.close()
  d, deadline = hashlib.sha256(data).digest(), time.monotonic() + 10
  while time.monotonic() < deadline:
    q = t.connect()
    held = have(q, [d])
    q.close()
    if held == [1]: return d
    time.sleep(0.02)
  pytest.fail("content written with FCACHE was not held within 10 s")

@section("Cache", "Thello, Rhello")
def test_cache_is_announced_by_cap_cache(target):
  assert cached(target).info["caps"] & P.CAP_CACHE

@section("Cache")
def test_fcache_write_is_a_write_and_its_content_is_held_by_its_hash(target):
  t = cached(target)
  data = os.urandom(100_000)
  d = store(t, data)
  c = t.connect()
  assert have(c, [d, hashlib.sha256(data + b"x").digest(), d]) == [1, 0, 1]
  c.alloc(7, 200_000)
  c.req(P.TWRITEHASH, handle=7, offset=50_000, count=len(data), hash=d)
  ok(c)   # no reply on success
  assert c.read(7, 50_000, len(data)) == data and c.read(7, 0, 50_000) == bytes(50_000)

@section("Cache")
def test_thave_count_0_and_rhave_repeats_count(target):
  c = cached(target).connect()
  assert have(c, []) == []
  ok(c)

@section("Cache")
def test_twritehash_of_content_not_held_for_the_session_is_enotcached(target):
  t = cached(target)
  data = os.urandom(4096)
  d = store(t, data)   # held by the runner, but this session never asked
  c = t.connect()
  c.alloc(1, 4096)
  c.write(1, 0, b"\x05" * 4096)
  tag = c.req(P.TWRITEHASH, handle=1, offset=0, count=4096, hash=d)
  one_error(c, P.ENOTCACHED, tag)
  assert c.read(1, 0, 4096) == b"\x05" * 4096

@section("Cache")
def test_twritehash_with_another_length_is_einval(target):
  t = cached(target)
  data = os.urandom(4096)
  d = store(t, data)
  c = t.connect()
  assert have(c, [d]) == [1]
  c.alloc(1, 8192)
  tag = c.req(P.TWRITEHASH, handle=1, offset=0, count=4095, hash=d)
  assert "4096" in one_error(c, P.EINVAL, tag)
  assert c.read(1, 0, 8192) == bytes(8192)

@section("Cache")
def test_twritehash_checks_handle_and_range_first(target):
  t = cached(target)
  c = t.connect()
  d = hashlib.sha256(b"nothing").digest()
  tag = c.req(P.TWRITEHASH, handle=9, offset=0, count=1, hash=d)
  one_error(c, P.EHANDLE, tag)
  c.alloc(1, 16)
  tag = c.req(P.TWRITEHASH, handle=1, offset=16, count=1, hash=d)
  one_error(c, P.ERANGE, tag)
  tag = c.req(P.TWRITEHASH, handle=1, offset=0xffffffffffffffff, count=2, hash=d)
  one_error(c, P.ERANGE, tag)

@section("Cache", "Robustness rules")
def test_thave_size_that_disagrees_with_count_is_eproto(target):
  c = cached(target).connect()
  c.send(P.pack(P.THAVE, 5, 0, 31, count=1) + bytes(31))
  assert "Thave" in fatal(c, P.EPROTO, 5)

@section("Cache")
def test_runner_without_cache_holds_nothing(target):
  if target.info["caps"] & P.CAP_CACHE: pytest.skip("the runner has a cache")
  c = target.connect()
  d = hashlib.sha256(b"x").digest()
  assert have(c, [d]) == [0]
  c.alloc(1, 1)
  tag = c.req(P.TWRITEHASH, handle=1, offset=0, count=1, hash=d)
  one_error(c, P.ENOTCACHED, tag)
  c.req(P.TWRITE, b"z", P.FCACHE, handle=1, offset=0, count=1)   # FCACHE without a cache: a plain write
  ok(c)
  assert c.read(1, 0, 1) == b"z"

@section("Cache")
def test_content_stored_by_fcache_is_not_held_for_the_session_until_an_rhave_says_so(target):
  t = cached(target)
  data = os.urandom(4096)
  d = hashlib.sha256(data).digest()
  c = t.connect()
  c.alloc(1, 4096); c.alloc(2, 4096)
  c.req(P.TWRITE, data, P.FCACHE, handle=1, offset=0, count=4096)
  tag = c.req(P.TWRITEHASH, handle=2, offset=0, count=4096, hash=d)
  one_error(c, P.ENOTCACHED, tag)
  deadline = time.monotonic() + 10
  while have(c, [d]) != [1]:
    assert time.monotonic() < deadline, "content written with FCACHE was not held within 10 s"
    time.sleep(0.02)
  c.req(P.TWRITEHASH, handle=2, offset=0, count=4096, hash=d)
  ok(c)
  assert c.read(2, 0, 4096) == data

@section("Cache")
def test_a_thave_after_fcache_writes_holds_what_the_session_wrote(target):
  # protocol.md, Cache: a Thave is answered after the stores of the session's earlier Twrites with FCACHE (the runner stores them
  # while the session goes on): right after 16 writes of 1 MiB of new content, all 16 are held, with no wait between
  t = cached(target)
  parts = [os.urandom(1 << 20) for _ in range(16)]
  c = t.connect()
  c.alloc(1, 1 << 20)
  for i, x in enumerate(parts): c.req(P.TWRITE, x, P.FCACHE, handle=1, offset=0, count=len(x))
  assert have(c, [hashlib.sha256(x).digest() for x in parts]) == [1] * 16

@section("Cache")
def test_twritehash_takes_its_turn_among_the_writes(target):
  t = cached(target)
  data = os.urandom(8)
  d = store(t, data)
  c = t.connect()
  assert have(c, [d]) == [1]
  c.alloc(1, 16)
  c.write(1, 0, b"a" * 16)
  c.req(P.TWRITEHASH, handle=1, offset=4, count=8, hash=d)
  c.write(1, 10, b"b" * 4)
  assert c.read(1, 0, 16) == b"aaaa" + data[:6] + b"bbbb" + b"aa"

@section("Cache", "Tprofile, Rprofile")
def test_twritehash_makes_a_prof_write_record(target):
  t = cached(target)
  data = os.urandom(4096)
  d = store(t, data)
  c = t.connect()
  assert have(c, [d]) == [1]
  c.alloc(3, 8192)
  c.req(P.TPROFILE, mode=P.PROFILE_ON, count=0); c.frame()
  tag = c.req(P.TWRITEHASH, handle=3, offset=100, count=4096, hash=d)
  bad = c.req(P.TWRITEHASH, handle=3, offset=8000, count=4096, hash=d)   # fails: no record
  assert [e[:2] for e in c.until_pong()] == [(P.ERANGE, bad)]
  ptag = c.req(P.TPROFILE, mode=P.PROFILE_OFF, count=10)
  t_, f, p = c.frame()
  assert (t_, f["tag"], f["count"]) == (P.RPROFILE, ptag, 1), (t_, f)
  r = P.PROF.unpack(p, 0)
  assert (r["kind"], r["tag"], r["entry"], r["handle"], r["aux"], r["count"]) == (P.PROF_WRITE, tag, 0, 3, 0, 4096) and r["start"] <= r["end"]

@section("Cache", "Limits")
def test_a_thave_of_as_many_hashes_as_fit_in_maxmsg_is_answered(target):
  c = target.connect(maxmsg=P.MIN_MAXMSG)
  n = (P.MIN_MAXMSG - 16) // 32
  assert have(c, [os.urandom(32) for _ in range(n)]) == [0] * n
  ok(c)
  c.send(P.pack(P.THAVE, 9, 0, 32 * (n + 1), count=n + 1) + bytes(32 * (n + 1)))   # one more is a frame above maxmsg
  fatal(c, P.EPROTO, 9)

def small(target, tmp_path):
  """A runner of the case's own with the smallest cache (64 KiB), in a directory of its own."""
  if target.external: pytest.skip("needs a runner started with --cache-size 65536")
  return target.fresh("--cache-dir", str(tmp_path), "--cache-size", "65536")

@section("Cache")
def test_fcache_of_content_larger_than_the_whole_cache_is_a_plain_write(target, tmp_path):
  with small(target, tmp_path) as t: larger_than_the_cache(t)

def larger_than_the_cache(t):
  big = os.urandom(100_000)
  c = t.connect()
  c.alloc(1, len(big))
  c.req(P.TWRITE, big, P.FCACHE, handle=1, offset=0, count=len(big))
  ok(c)   # never fails the Twrite
  assert c.read(1, 0, len(big)) == big
  c.close()
  store(t, os.urandom(1000))   # stored after it, by the same runner: the big one has been dealt with by now
  q = t.connect()
  assert have(q, [hashlib.sha256(big).digest()]) == [0], "content larger than the whole cache was kept"

@section("Cache")
def test_a_pinned_content_stays_available_to_its_session_whatever_is_evicted(target, tmp_path):
  with small(target, tmp_path) as t: pinned_outlives_eviction(t)

def pinned_outlives_eviction(t):
  data = os.urandom(16384)
  d = store(t, data)
  a = t.connect()
  assert have(a, [d]) == [1]   # pinned for a
  time.sleep(0.05)   # the runner orders uses by file mtimes, which Linux keeps to a clock tick
  others = [os.urandom(16384) for _ in range(5)]   # 80 KiB more: the least recently used go, first of all d
  b = t.connect()
  b.alloc(1, 16384)
  for x in others: b.req(P.TWRITE, x, P.FCACHE, handle=1, offset=0, count=len(x))
  ok(b)
  store(t, others[-1])
  q = t.connect()
  assert have(q, [d]) == [0], "the least recently used content was not removed"
  q.close()
  a.alloc(1, 16384)
  a.req(P.TWRITEHASH, handle=1, offset=0, count=16384, hash=d)
  ok(a)
  assert a.read(1, 0, 16384) == data

@section("Cache", "Limits")
def test_a_session_pins_at_most_cache_pins_contents(target):
  t = cached(target)
  n = P.CACHE_PINS + 1
  contents = [os.urandom(16) for _ in range(n)]
  digests = [hashlib.sha256(x).digest() for x in contents]
  w = t.connect()
  w.alloc(1, 16)
  w.send(b"".join(P.pack(P.TWRITE, 1000 + i, P.FCACHE, payload_len=16, handle=1, offset=0, count=16) + x for i, x in enumerate(contents)))
  ok(w)
  deadline = time.monotonic() + 20
  for part in (digests[:n // 2], digests[n // 2:]):   # each on a session of its own, below its pin limit
    while True:
      q = t.connect()
      held = have(q, part)
      q.close()
      if all(held): break
      assert time.monotonic() < deadline, f"{held.count(0)} contents written with FCACHE were not held within 20 s"
      time.sleep(0.05)
  c = t.connect()
  assert have(c, digests) == [1] * P.CACHE_PINS + [0]
  assert have(c, [digests[0], digests[-1]]) == [1, 0]   # what it pinned stays held; nothing more is pinned

@section("Cache")
def test_fcache_keeps_exactly_the_bytes_written_wherever_they_land(target):
  t = cached(target)
  data = os.urandom(1000)
  c = t.connect()
  c.alloc(1, 8192)
  c.write(1, 0, b"\x01" * 8192)
  c.req(P.TWRITE, data, P.FCACHE, handle=1, offset=3000, count=len(data))
  ok(c)
  c.close()
  d, deadline = hashlib.sha256(data).digest(), time.monotonic() + 10
  while have(q := t.connect(), [d]) != [1]:
    q.close()
    assert time.monotonic() < deadline, "the bytes of a Twrite with FCACHE at an offset were not held by their hash"
    time.sleep(0.02)
  q.alloc(1, 1000)
  q.req(P.TWRITEHASH, handle=1, offset=0, count=1000, hash=d)
  assert q.read(1, 0, 1000) == data

@section("Cache")
def test_the_least_recently_used_content_is_removed_first(target, tmp_path):
  if target.external: pytest.skip("needs a runner started with --cache-size 65536")
  with target.fresh("--cache-dir", str(tmp_path), "--cache-size", "65536") as t:
    x, y = os.urandom(12288), os.urandom(12288)
    # uses 50 ms apart: the runner orders uses by the files' modification times, which Linux keeps to a clock tick (1-10 ms)
    dx = store(t, x)
    time.sleep(0.05)
    dy = store(t, y)
    time.sleep(0.05)
    a = t.connect()
    assert have(a, [dx]) == [1]   # x is used after y
    a.close()
    time.sleep(0.05)
    more = [os.urandom(12288) for _ in range(4)]   # six 12 KiB contents pass 64 KiB: one has to go
    b = t.connect()
    b.alloc(1, 12288)
    for m in more: b.req(P.TWRITE, m, P.FCACHE, handle=1, offset=0, count=len(m))
    ok(b)
    store(t, more[-1])
    q = t.connect()
    assert have(q, [dx, dy] + [hashlib.sha256(m).digest() for m in more]) == [1, 0, 1, 1, 1, 1]

@section("Cache")
def test_empty_content_is_never_held(target):
  t = cached(target)
  empty = hashlib.sha256(b"").digest()
  c = t.connect()
  c.alloc(1, 16)
  c.req(P.TWRITE, b"", P.FCACHE, handle=1, offset=16, count=0)     # a valid Twrite (offset = size, count 0): stores nothing
  store(t, os.urandom(100))                                         # stored after it, by the same runner
  assert have(c, [empty]) == [0]
  tag = c.req(P.TWRITEHASH, handle=1, offset=0, count=0, hash=empty)
  one_error(c, P.ENOTCACHED, tag)

@section("Cache", "Limits")
def test_sessions_share_a_small_open_file_budget_fairly(target, tmp_path):
  """With an open-file limit of 512 the runner's pins are 256: a session's own (process isolation), or shared by --max-sessions 3
  sessions (thread isolation), of which each may always take 256 // 6 = 42 and the first to want more takes the other 130 too."""
  if target.external: pytest.skip("needs a runner of its own started with a small open-file limit")
  budget, n = 512 - 256, 300
  sessions = 1 if target.isolation in ("process", "spawn") else 3
  share = budget // (2 * sessions)
  want = [budget] * 3 if sessions == 1 else [budget - 2 * share, share, share]
  contents = [os.urandom(16) for _ in range(n)]
  digests = [hashlib.sha256(x).digest() for x in contents]
  with target.fresh("--cache-dir", str(tmp_path), "--max-sessions", "3", nofile=512) as t:
    a = t.connect()
    a.alloc(1, 16)
    a.send(b"".join(P.pack(P.TWRITE, 1000 + i, P.FCACHE, payload_len=16, handle=1, offset=0, count=16) + x for i, x in enumerate(contents)))
    held = [have(a, digests)]                     # a session's stores come before its Thave: all n are stored by now
    b, c = t.connect(), t.connect()
    held += [have(b, digests), have(c, digests)]
    assert [sum(h) for h in held] == want, f"pins of 3 sessions, {sessions} to a budget of {budget}"
    assert all(h == [1] * sum(h) + [0] * (n - sum(h)) for h in held)
