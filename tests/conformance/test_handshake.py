"""Thello/Rhello, Tauth/Rauth, Versioning and Authentication: the first exchanges of a connection."""
import os, struct, threading, time
import pytest
from conformance.spec import P, Raw, section, send_auth, client_mac, server_mac, fatal, closed, ok, TOKEN

@section("Thello, Rhello")
def test_rhello_repeats_magic_and_version_and_reports_the_runner(target):
  c = Raw(target.addr)
  i = c.info
  assert (i["magic"], i["version"]) == (P.MAGIC, 1)
  assert i["backend"] in (P.BACKEND_CPU, P.BACKEND_METAL)
  kinds = i["caps"] & (P.CAP_CPU_IMAGE | P.CAP_METALLIB | P.CAP_METAL_SOURCE)
  assert kinds, "caps name no program kind"
  if i["backend"] == P.BACKEND_CPU:
    assert P.cstr(i["arch"]) in ("x86_64", "arm64", "riscv64") and i["ncores"] >= 1
  else:
    assert i["ncores"] == 1 and P.cstr(i["cpu"]) == "" and P.cstr(i["features"]) == ""
  assert i["memory"] > 0 and 0 < i["maxbuf"] <= i["memory"] and i["maxhandles"] >= 1
  for f in ("name", "arch", "cpu", "features"): i[f].split(b"\0", 1)[0].decode("utf-8")  # UTF-8 text padded with NUL bytes

@section("Thello, Rhello")
def test_maxmsg_is_the_minimum_of_both_sides(target):
  runner_max = Raw(target.addr, hello=False).hello(maxmsg=0xffffffff)["maxmsg"]
  assert P.MIN_MAXMSG <= runner_max
  assert Raw(target.addr, hello=False).hello(maxmsg=runner_max + 1 if runner_max < 0xffffffff else runner_max)["maxmsg"] == runner_max
  c = target.connect(maxmsg=P.MIN_MAXMSG)
  assert c.info["maxmsg"] == P.MIN_MAXMSG
  assert c.ping(bytes(P.MIN_MAXMSG - 16)) == bytes(P.MIN_MAXMSG - 16)  # the largest frame both sides accept

@section("Thello, Rhello")
def test_maxmsg_below_65536_is_einval_and_closes(target):
  c = Raw(target.addr, hello=False)
  tag = c.req(P.THELLO, magic=P.MAGIC, version=1, maxmsg=P.MIN_MAXMSG - 1)
  fatal(c, P.EINVAL, tag)

@section("Thello, Rhello", "Versioning")
def test_first_frame_other_than_thello_is_estate_and_closes(target):
  c = Raw(target.addr, hello=False)
  tag = c.alloc(1, 16)
  assert "Thello" in fatal(c, P.ESTATE, tag)

@section("Thello, Rhello")
def test_second_thello_is_estate_and_closes(target):
  c = target.connect()
  tag = c.req(P.THELLO, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG)
  fatal(c, P.ESTATE, tag)

@section("Thello, Rhello", "Versioning")
def test_bad_magic_is_eversion_and_closes(target):
  c = Raw(target.addr, hello=False)
  tag = c.req(P.THELLO, magic=0x12345678, version=1, maxmsg=P.DEFAULT_MAXMSG)
  assert fatal(c, P.EVERSION, tag) == "bad magic: not a metal_runner client"

@section("Thello, Rhello", "Versioning")
@pytest.mark.parametrize("version", [0, 2, 99])
def test_unsupported_version_is_eversion_naming_version_1(target, version):
  c = Raw(target.addr, hello=False)
  tag = c.req(P.THELLO, magic=P.MAGIC, version=version, maxmsg=P.DEFAULT_MAXMSG)
  assert fatal(c, P.EVERSION, tag) == f"protocol version {version} not supported; this runner speaks version 1"

@section("Versioning", "Robustness rules")
def test_a_peer_that_is_not_a_client_gets_eproto_not_a_hang(target):
  c = Raw(target.addr, hello=False)
  c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # "GET " read as a size far above maxmsg
  fatal(c, P.EPROTO)

@section("Versioning", "Robustness rules")
def test_oversized_thello_is_a_framing_error(target):
  c = Raw(target.addr, hello=False)
  c.send(P.pack(P.THELLO, 1, payload_len=4096, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG) + bytes(4096))
  assert "Thello" in fatal(c, P.EPROTO, 1)

# *** Tauth and Authentication

@section("Tauth, Rauth", "Authentication")
def test_right_token_gets_in_and_rauth_proves_the_runner_holds_it(target):
  a = target.authenticating()
  c = Raw(a.addr)
  assert c.info["caps"] & P.CAP_AUTH and c.info["nonce"] != bytes(32)
  tag, cnonce = send_auth(c, a.token)
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RAUTH, tag)
  assert f["mac"] == server_mac(a.token, c.info["nonce"], cnonce)
  c.alloc(1, 32); c.write(1, 0, b"authenticated" * 2)
  assert c.read(1, 0, 26) == b"authenticated" * 2

@section("Authentication")
def test_every_session_gets_a_fresh_nonce(target):
  a = target.authenticating()
  assert len({Raw(a.addr).info["nonce"] for _ in range(5)}) == 5

@section("Tauth, Rauth", "Authentication")
def test_wrong_mac_is_eauth_after_a_wait_and_closes(target):
  c = Raw(target.authenticating().addr)
  t0 = time.monotonic()
  tag, _ = send_auth(c, b"guess")
  assert fatal(c, P.EAUTH, tag) == "authentication failed: wrong token"
  assert time.monotonic() - t0 >= 0.9, "a failed guess was answered at once: no rate limit"

@section("Authentication")
def test_parallel_failed_guesses_are_answered_one_second_apart(target):
  a, times = target.authenticating(), []
  def guess():
    c = Raw(a.addr)
    send_auth(c, b"guess")
    assert c.error()[0] == P.EAUTH
    times.append(time.monotonic())
  t0 = time.monotonic()
  ths = [threading.Thread(target=guess) for _ in range(3)]
  for th in ths: th.start()
  for th in ths: th.join(15)
  assert len(times) == 3
  gaps = [b - a for a, b in zip(sorted([t0] + times), sorted(times))]
  assert all(g >= 0.85 for g in gaps), f"3 parallel failures answered at {[round(t - t0, 2) for t in sorted(times)]} s"

@section("Authentication")
def test_a_failed_guess_does_not_delay_another_session(target):
  a, done = target.authenticating(), {}
  def guess():
    c = Raw(a.addr)
    send_auth(c, b"guess")
    done["code"] = c.error()[0]
  th = threading.Thread(target=guess)
  th.start()
  time.sleep(0.1)
  t0 = time.monotonic()
  c = a.connect()
  assert c.ping(b"x") == b"x" and time.monotonic() - t0 < 0.8, "another client's failed guess delayed this one"
  th.join(10)
  assert done.get("code") == P.EAUTH

@section("Authentication")
def test_a_mac_seen_in_another_session_cannot_be_replayed(target):
  a = target.authenticating()
  x = Raw(a.addr)
  tag, cnonce = send_auth(x, a.token)
  assert x.frame()[0] == P.RAUTH
  y = Raw(a.addr)
  tag, _ = send_auth(y, a.token, cnonce=cnonce, mac=client_mac(a.token, x.info["nonce"], cnonce))
  fatal(y, P.EAUTH, tag)

@section("Tauth, Rauth")
@pytest.mark.parametrize("req", ["ping", "alloc", "hello"])
def test_any_request_before_tauth_is_estate_and_closes(target, req):
  c = Raw(target.authenticating().addr)
  tag = {"ping": lambda: c.req(P.TPING, count=0), "alloc": lambda: c.alloc(1, 16),
         "hello": lambda: c.req(P.THELLO, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG)}[req]()
  fatal(c, P.ESTATE, tag)

@section("Tauth, Rauth")
def test_requests_pipelined_before_tauth_are_not_acted_on(target):
  c = Raw(target.authenticating().addr)
  c.send(P.pack(P.TALLOC, 1, handle=1, bufsize=1 << 20) + P.pack(P.TWRITE, 2, payload_len=4, handle=1, offset=0, count=4) + b"data"
         + P.pack(P.TREAD, 3, handle=1, offset=0, count=4))  # one send: the runner ends the session at the first
  fatal(c, P.ESTATE, 1)

@section("Tauth, Rauth")
def test_a_second_tauth_is_estate(target):
  a = target.authenticating()
  c = Raw(a.addr)
  send_auth(c, a.token)
  assert c.frame()[0] == P.RAUTH
  tag, _ = send_auth(c, a.token)
  fatal(c, P.ESTATE, tag)

@section("Tauth, Rauth")
def test_tauth_without_cap_auth_is_estate(target):
  if target.auth: pytest.skip("the runner requires a token (CAP_AUTH set)")
  c = Raw(target.addr)
  tag, _ = send_auth(c, TOKEN)
  fatal(c, P.ESTATE, tag)
