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
