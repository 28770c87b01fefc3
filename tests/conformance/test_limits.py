"""Limits: the rows of protocol.md's table that no other section's case checks (defaults of runner options, grants, hosts)."""
import socket, time
import pytest
from conformance.spec import P, Raw, section, ok

def default_runner(target):
  if target.external: pytest.skip("a default is that of a runner started without options; --runner names one already running")
  return target

def reply(c, tag:int) -> tuple[int, dict]:
  t, f, _ = c.frame()
  assert f["tag"] == tag, (t, f)
  return t, f

@section("Limits")
def test_maxmsg_of_a_runner_started_without_options_is_64_mib(target):
  c = Raw(default_runner(target).addr, hello=False)
  assert c.hello(maxmsg=0xffffffff)["maxmsg"] == 64 << 20
  c.close()

@section("Limits")
def test_a_session_holds_at_most_64_unused_grants_of_1_to_600_s(c):
  c.alloc(1, 64)
  for i in range(P.MAX_GRANTS):
    tag = c.req(P.TGRANT, handle=1, offset=i, count=1, ttl=(1, P.MAX_GRANT_TTL)[i % 2])
    t, f = reply(c, tag)
    assert t == P.RGRANT, (i, f)
  tag = c.req(P.TGRANT, handle=1, offset=0, count=1, ttl=60)
  t, f = reply(c, tag)
  assert (t, f.get("code")) == (P.RERROR, P.ELIMIT), f
  ok(c)

@section("Limits")
def test_tpeersend_host_of_256_bytes_is_einval_and_of_255_is_not(c):
  c.alloc(1, 64)
  for n in (256, 255):
    host = b"h" * n   # a label longer than 63 bytes: no resolver asks the network about it
    tag = c.req(P.TPEERSEND, host, handle=1, count=64, port=1, hostlen=n, grant=1, secret=bytes(32))
    t, f = reply(c, tag)
    assert t == P.RERROR and (f["code"] == P.EINVAL) == (n == 256), (n, P.ERRORS.get(f.get("code")), f)

@section("Limits")
def test_the_resume_grace_and_log_of_a_runner_started_without_options(target):
  t = default_runner(target)
  if not t.info["caps"] & P.CAP_RESUME: pytest.skip("the runner does not offer CAP_RESUME")
  c = t.connect()
  tag = c.req(P.TRESUMEKEY, mode=P.RESUME_ON)
  _, f = reply(c, tag)
  assert (f["grace"], f["log"]) == (60, 4 << 20), f
  tag = c.req(P.TRESUMEKEY, mode=P.RESUME_OFF)   # the session ends when the connection does, not 60 s later
  reply(c, tag)
  c.close()

@section("Limits")
def test_a_connection_past_the_handshake_deadline_is_closed_without_a_reply(target):
  t = target.with_options("--handshake-timeout", "1")
  host, port = t.addr.rsplit(":", 1)
  s = socket.create_connection((host, int(port)), timeout=5)   # and sends nothing
  t0 = time.monotonic()
  try: got = s.recv(1)
  except ConnectionResetError: got = b""
  assert got == b"" and 0.5 <= time.monotonic() - t0 <= 4, (got, time.monotonic() - t0)
  s.close()
