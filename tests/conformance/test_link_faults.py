"""Links between runners, faults: a send whose receiving side goes away fails the launch or graph run that sent it (never
success, and never only the next use); and the statements a second implementer would otherwise have to guess: link program
names, a link's Tpeer with a count, a run that stops at a failed entry while bytes of an earlier send are kept, a link
that no runner has connected to yet, and link programs in the profile. The receiving runner killed outright is
tests/test_link_loss.py's (this suite cannot kill a runner it did not start)."""
import threading, time
import pytest
from conformance.spec import P, section, ok, one_error
from conformance.test_links import (SEND, RECV, Acceptor, Dialer, dialer, eof, exact, graph, graph_done, graphrun, launched, link_rec, linkmsg, listen,
                                    load_link, pair, recv_text, refused, run, send_text, xfer)
from conformance.test_profile import profile

N = 40 << 20   # far more than the sockets between the two ends hold: the sending runner keeps most of it

def sending(c, via:str, n:int=N, channel:int=1) -> int:
  """Send n bytes of buffer 1 with link program 1, by a Tlaunch or a Tgraphrun (graph 1), with FWAIT; the request's tag."""
  if via == "launch": return xfer(c, 1, 1, 0, n, channel)
  graph(c, 1, link_rec(1, 1, 0, n, channel))
  return graphrun(c, 1)

VIA = pytest.mark.parametrize("via", ["launch", "graphrun"])

# *** the receiving side goes away while a send waits for it

@section("Links between runners", "Tlaunch, Rlaunch", "Tgraphrun, Rgraphrun")
@VIA
@pytest.mark.parametrize("read", [0, 1 << 20], ids=["nothing-read", "1MiB-read"])
def test_a_send_whose_receiving_end_closes_fails_with_epeer_and_the_other_links_go_on(c, via, read):
  a = Acceptor(rcvbuf=65536).connected(c, 1)
  b = Acceptor().connected(c, 2)
  c.alloc(1, N); c.write(1, 0, b"\x33" * 16)
  load_link(c, 1, SEND, 1); load_link(c, 2, SEND, 2)
  t0 = time.monotonic()
  tag = sending(c, via)
  time.sleep(0.5)                                                   # the runner now holds most of the 40 MiB
  if read: exact(a.s, read)
  a.s.close()
  text = refused(c, tag, P.EPEER)                                   # not Rlaunch / Rgraphrun: the bytes never arrived
  assert text.startswith(send_text(1, a.addr)), text
  assert time.monotonic() - t0 < 8, "the failure waited for the frame timeout"
  tag = xfer(c, 1, 1, 0, 16, 2)                                     # the link stays broken
  assert refused(c, tag, P.EPEER).startswith(send_text(1, a.addr))
  run(c, 2, 1, 0, 16, 7)                                            # the session's other link goes on
  h, data = b.msg()
  assert (h["seq"], h["channel"], data) == (1, 7, b"\x33" * 16), h
  ok(c)
  a.close(); b.close()

@section("Links between runners", "Tlaunch, Rlaunch", "Tgraphrun, Rgraphrun")
@VIA
@pytest.mark.parametrize("how", ["tunlink", "session-ends"])
def test_a_send_whose_receiving_session_frees_the_link_or_ends_fails_with_epeer(target, c, via, how):
  d = target.connect()
  pair(target, c, d, sl=1, rl=2, sprog=1)
  c.alloc(1, N)
  tag = sending(c, via)
  time.sleep(0.5)
  if how == "tunlink":
    d.req(P.TUNLINK, link=2)
    ok(d)
  else: d.close()
  text = refused(c, tag, P.EPEER)
  assert text.startswith(send_text(1, target.addr)), text
  ok(c)                                                             # the session goes on
  if how == "tunlink": d.close()

# *** the spec's answers to what a second implementer would guess

@section("Links between runners", "Tload")
def test_a_link_programs_name_follows_tloads_rule(c):
  """A link program's name is any name Tload takes: 1 to 255 bytes of UTF-8 without NUL."""
  load_link(c, 1, SEND, 1, name=b"s" * 255)
  for bad in (b"", b"s" * 256, b"a\0b", b"\xff"):
    tag = load_link(c, 2, RECV, 1, name=bad)
    one_error(c, P.EINVAL, tag)
  load_link(c, 2, RECV, 1, name=b"r")
  ok(c)

@section("Links between runners", "Tpeer, Rpeer")
@pytest.mark.parametrize("count", [1, 1 << 40])
def test_a_links_tpeer_with_a_count_is_einval_and_leaves_the_link_unconnected(target, c, count):
  g, sec = listen(c, 1)
  d = Dialer(target.addr, g, sec, count=count)                     # the right proof, over a count that is not 0
  t, f, p = d.reply
  assert (t, f.get("code")) == (P.RERROR, P.EINVAL), (P.TYPE_NAMES.get(t, t), f, p)
  assert eof(d.s)
  c.alloc(1, 16)
  load_link(c, 1, RECV, 1)
  tag = xfer(c, 1, 1, 0, 16, 1)                                     # nobody is connected; the grant is used up
  assert "no runner has connected" in refused(c, tag, P.EPEER)
  c.req(P.TUNLINK, link=1)                                          # the client frees it and makes a new one
  d = dialer(c, 1)
  d.send(linkmsg(1, 1, b"k" * 16))
  run(c, 1, 1, 0, 16, 1)
  assert c.read(1, 0, 16) == b"k" * 16
  d.close()

@section("Links between runners")
def test_no_runner_connected_yet_is_epeer_and_does_not_break_the_link(c):
  c.alloc(1, 16)
  load_link(c, 1, RECV, 1)
  g, sec = listen(c, 1)
  tag = xfer(c, 1, 1, 0, 16, 3)
  text = refused(c, tag, P.EPEER)
  assert text.startswith(recv_text(1)) and "no runner has connected" in text, text
  d = Dialer("%s:%d" % c.s.getpeername()[:2], g, sec).proved()      # the grant is still good
  ok(c)
  d.send(linkmsg(1, 3, b"q" * 16))
  run(c, 1, 1, 0, 16, 3)
  assert c.read(1, 0, 16) == b"q" * 16
  d.close()

@section("Links between runners", "Tgraphrun, Rgraphrun")
def test_a_run_that_stops_at_a_failed_entry_ends_after_its_earlier_sends_were_taken(c):
  """The reply of a run that fails at a link entry comes only once the sends before it were taken, and the runner keeps no
  bytes after it: nothing waits for a later request to go out."""
  a = Acceptor(rcvbuf=65536).connected(c, 1)
  n = 12 << 20
  c.alloc(1, n); c.write(1, 0, b"\x5a" * n); c.alloc(2, 16)
  load_link(c, 1, SEND, 1); load_link(c, 2, RECV, 2)
  d = dialer(c, 2)
  d.send(linkmsg(1, 99, b"\0" * 16))                               # another channel than the run's: the receive fails
  graph(c, 1, link_rec(1, 1, 0, n, 4), link_rec(2, 2, 0, 16, 5))
  got = {}
  def reader():
    time.sleep(1.0)
    got["msg"] = a.msg()
  th = threading.Thread(target=reader, daemon=True)
  t0 = time.monotonic()
  th.start()
  tag = graphrun(c, 1)
  assert refused(c, tag, P.EPEER).startswith(recv_text(2))
  took = time.monotonic() - t0
  th.join(20)                                                       # no further request: the bytes went out all the same
  assert took >= 0.9, f"the Rerror came after {took:.2f} s, before the receiving side (reading after 1 s) took the send"
  h, data = got["msg"]
  assert (h["seq"], h["channel"], h["count"], data == b"\x5a" * n) == (1, 4, n, True), h
  ok(c)
  a.close(); d.close()

@section("Tprofile, Rprofile", "Links between runners")
def test_link_launches_and_link_entries_have_profile_records_with_their_bytes(c):
  a = Acceptor().connected(c, 1)
  c.alloc(1, 4096)
  load_link(c, 1, SEND, 1)
  graph(c, 1, link_rec(1, 1, 0, 100, 2), link_rec(1, 1, 0, 4096, 3))
  profile(c, P.PROFILE_ON, 0)
  t1 = xfer(c, 1, 1, 0, 64, 1)
  launched(c, t1)
  t2 = graphrun(c, 1)
  graph_done(c, t2)
  tag = xfer(c, 1, 1, 0, 0, 9)                                      # a failed link launch makes no record
  refused(c, tag, P.ERANGE)
  f, recs = profile(c)
  got = [(r["kind"], r["tag"], r["entry"], r["handle"], r["aux"], r["count"]) for r in recs]
  assert got == [(P.PROF_LAUNCH, t1, 0, 1, 0, 64), (P.PROF_GRAPH, t2, 0, 1, 1, 100), (P.PROF_GRAPH, t2, 1, 1, 1, 4096)], got
  assert all(0 < r["start"] <= r["end"] for r in recs), recs
  assert recs[0]["end"] <= recs[1]["start"] and recs[1]["end"] <= recs[2]["start"], recs
  for _ in range(3): a.msg()
  a.close()
