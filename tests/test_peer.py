"""Copies between runners (protocol.md, Copies between runners): the bytes go from runner to runner, authenticated by a one-time grant
from the destination's session, never through the client; and every way a grant or a peer can be wrong is refused. Runner.stats()
byte counts are the proof that the client carried no tensor bytes."""
import contextlib, json, os, re, socket, struct, threading, time
import numpy as np
import pytest
from conftest import run_python
from runner_proc import RunnerProc
from client.connection import Runner, RunnerError
import client.protocol as P

pytestmark = pytest.mark.cpu_only

@contextlib.contextmanager
def runners(n:int=2, *args:str):
  rs = [RunnerProc("-v", *args) for _ in range(n)]
  try: yield rs
  finally:
    for r in rs: r.stop()

def hostport(addr:str) -> tuple[str, int]:
  h, p = addr.rsplit(":", 1)
  return h, int(p)

def delta(a:dict, b:dict) -> dict: return {k: b[k] - a[k] for k in a}

def pattern(n:int, seed:int=1) -> bytes: return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()

def send(src:Runner, h:int, off:int, n:int, dst_addr:str, grant:int, secret:bytes) -> float:
  return src.peer_send(h, off, n, *hostport(dst_addr), grant, secret)

def code_of(fn) -> tuple[int, str]:
  with pytest.raises(RunnerError) as e: fn()
  return e.value.code, e.value.text

# *** the copy

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_copy_goes_runner_to_runner(daemon_bin, iso):
  # process isolation: the source session is confined, so the runner's broker dials; thread isolation: the session dials itself
  n = 16 << 20
  with runners(2, "--isolation", iso) as (ra, rb), Runner(ra.addr) as a, Runner(rb.addr) as b:
    assert a.info.caps & P.CAP_PEER and b.info.caps & P.CAP_PEER
    data = pattern(n)
    a.alloc(1, n); a.write(1, 0, data); b.alloc(2, n)
    a.sync(); b.sync()
    sa, sb = a.stats(), b.stats()
    grant, secret = b.grant(2, 0, n)
    assert grant >> 32 == b.info.session and len(secret) == 32
    assert send(a, 1, 0, n, rb.addr, grant, secret) > 0
    da, db = delta(sa, a.stats()), delta(sb, b.stats())
    # one Tgrant and one Tpeersend: under 300 bytes each way on the client's two connections, for 16 MiB moved
    assert da["bytes_sent"] + da["bytes_received"] < 300 and db["bytes_sent"] + db["bytes_received"] < 300, (da, db)
    out = bytearray(n)
    b.read(2, 0, out)
    assert out == data
  assert re.search(rf"sent {n} bytes to the runner at {re.escape(rb.addr)}", ra.log_text()), ra.log_text()
  assert re.search(rf"received {n} bytes from a peer into buffer 2", rb.log_text()), rb.log_text()

def test_copy_of_a_range_touches_nothing_else(daemon_bin):
  with runners() as (ra, rb), Runner(ra.addr) as a, Runner(rb.addr) as b:
    src = pattern(10000, 2)
    a.alloc(1, 10000); a.write(1, 0, src)
    b.alloc(2, 8192); b.write(2, 0, b"\xee" * 8192)
    grant, secret = b.grant(2, 4103, 1000)
    send(a, 1, 777, 1000, rb.addr, grant, secret)
    out = bytearray(8192)
    b.read(2, 0, out)
    assert out == b"\xee" * 4103 + src[777:1777] + b"\xee" * (8192 - 5103)

def test_copy_observes_earlier_work_and_later_work_observes_it(daemon_bin):
  # source: a Tcopy queued (device work, no reply) right before the Tpeersend; destination: a Tcopy right after the Tpeersend returns
  n = 1 << 20
  with runners() as (ra, rb), Runner(ra.addr) as a, Runner(rb.addr) as b:
    data = pattern(n, 3)
    a.alloc(1, n); a.alloc(9, n); a.write(9, 0, data)
    b.alloc(2, n); b.alloc(3, n)
    grant, secret = b.grant(2, 0, n)
    a.copy(1, 0, 9, 0, n)   # pipelined: it goes out with the Tpeersend
    send(a, 1, 0, n, rb.addr, grant, secret)
    b.copy(3, 0, 2, 0, n)
    out = bytearray(n)
    b.read(3, 0, out)
    assert out == data

def test_a_runner_with_a_token_takes_a_peer_by_its_grant(daemon_bin, tmp_path):
  (tok := tmp_path / "token").write_bytes(b"shared token of both runners")
  tok.chmod(0o600)
  with runners(2, "--token-file", str(tok)) as (ra, rb), Runner(ra.addr, token=tok.read_bytes()) as a, \
       Runner(rb.addr, token=tok.read_bytes()) as b:
    a.alloc(1, 4096); a.write(1, 0, pattern(4096, 4)); b.alloc(2, 4096)
    send(a, 1, 0, 4096, rb.addr, *b.grant(2, 0, 4096))
    out = bytearray(4096)
    b.read(2, 0, out)
    assert out == pattern(4096, 4)

# *** tinygrad: .to(), shard, allreduce

TO_SCRIPT = """
import json, numpy as np, client.remote_metal
from tinygrad import Device, Tensor
a, b = Device["REMOTE:0"].runner, Device["REMOTE:1"].runner
x = np.random.default_rng(5).standard_normal(4 << 20).astype(np.float32)   # 16 MiB
t = Tensor(x, device="REMOTE:0").realize()
Device["REMOTE:1"].synchronize()
sa, sb = a.stats(), b.stats()
u = t.to("REMOTE:1").realize()
Device["REMOTE:1"].synchronize()
da, db = ({k: v - s[k] for k, v in r.stats().items()} for r, s in ((a, sa), (b, sb)))
print(json.dumps({"equal": bool((u.numpy() == x).all()), "a": da, "b": db, "bytes": x.nbytes}))
"""

def test_tinygrad_to_moves_no_tensor_bytes_through_the_client(daemon_bin):
  with runners() as (ra, rb):
    r = run_python(TO_SCRIPT, {"METAL_RUNNER": f"{ra.addr},{rb.addr}"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["equal"], out
    moved = sum(out[k]["bytes_sent"] + out[k]["bytes_received"] for k in ("a", "b"))
    assert moved < 4096 < out["bytes"], out   # kernels and requests only; the 16 MiB went runner to runner
    assert re.search(r"received 16777216 bytes from a peer", rb.log_text()), rb.log_text()

SHARD_SCRIPT = """
import json, numpy as np, client.remote_metal
from tinygrad import Device, Tensor
devs = ("REMOTE:0", "REMOTE:1")
x = np.arange(256 * 96, dtype=np.float32).reshape(256, 96) / 1000
w = np.linspace(-1, 1, 96 * 32, dtype=np.float32).reshape(96, 32)
t, tw = Tensor(x).shard(devs, axis=0), Tensor(w).shard(devs)
allreduce = t.sum(axis=0).numpy()                     # a reduce over the sharded axis: tinygrad's allreduce between the runners
mm = ((t @ tw).relu().sum(axis=0) + t.max()).numpy()
want_mm = np.maximum(x @ w, 0).sum(axis=0) + x.max()
print(json.dumps({"allreduce": float(np.abs(allreduce - x.sum(axis=0)).max()), "mm": float(np.abs(mm - want_mm).max() / np.abs(want_mm).max())}))
"""

def test_shard_and_allreduce_equal_local(daemon_bin):
  with runners() as (ra, rb):   # the allreduce's copies are small: METAL_RUNNER_PEER_MIN=0 sends them runner to runner all the same
    r = run_python(SHARD_SCRIPT, {"METAL_RUNNER": f"{ra.addr},{rb.addr}", "METAL_RUNNER_PEER_MIN": "0"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["allreduce"] < 1e-3 and out["mm"] < 1e-5, out
    logs = ra.log_text() + rb.log_text()
    assert re.search(r"received \d+ bytes from a peer", logs), logs   # the allreduce's copies went runner to runner

SMALL_SCRIPT = """
import json, numpy as np, client.remote_metal
from tinygrad import Device, Tensor
a, b = Device["REMOTE:0"].runner, Device["REMOTE:1"].runner
x = np.arange(512, dtype=np.float32)   # 2 KiB, below METAL_RUNNER_PEER_MIN (1 MiB)
t = Tensor(x, device="REMOTE:0").realize()
Device["REMOTE:1"].synchronize()
sa = a.stats()
u = t.to("REMOTE:1").realize()
print(json.dumps({"equal": bool((u.numpy() == x).all()), "rt": a.stats()["round_trips"] - sa["round_trips"]}))
"""

def test_a_small_copy_goes_through_the_client(daemon_bin):
  """A direct copy costs a grant and a peer connection's proofs, several round trips; under 1 MiB one read through the client is cheaper."""
  with runners() as (ra, rb):
    r = run_python(SMALL_SCRIPT, {"METAL_RUNNER": f"{ra.addr},{rb.addr}"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["equal"] and out["rt"] == 1, out   # the read of 2 KiB from REMOTE:0
    assert "from a peer" not in ra.log_text() + rb.log_text()

# *** fallback through the client

@contextlib.contextmanager
def one_connection_relay(target:str):
  """A TCP relay on loopback that forwards the first connection to target and then stops listening: the client reaches the runner
  through it, and anyone else who tries the address (the other runner) finds nothing there, as behind a NAT only the client sees."""
  ls = socket.socket()
  ls.bind(("127.0.0.1", 0))
  ls.listen(1)
  addr = f"127.0.0.1:{ls.getsockname()[1]}"
  def pump(src, dst):
    try:
      while (b := src.recv(1 << 16)): dst.sendall(b)
    except OSError: pass
    finally:
      with contextlib.suppress(OSError): dst.shutdown(socket.SHUT_WR)
  socks = []
  def serve():
    try: c, _ = ls.accept()
    except OSError: return
    finally: ls.close()
    t = socket.create_connection(hostport(target))
    socks.extend([c, t])
    for s, d in ((c, t), (t, c)): threading.Thread(target=pump, args=(s, d), daemon=True).start()
  th = threading.Thread(target=serve, daemon=True)
  th.start()
  try: yield addr
  finally:
    ls.close()
    for s in socks: s.close()

FALLBACK_SCRIPT = """
import json, numpy as np, client.remote_metal
from tinygrad import Device, Tensor
x = np.random.default_rng(6).standard_normal(1 << 18).astype(np.float32)
t = Tensor(x, device="REMOTE:0").realize()
ok = [bool((t.to("REMOTE:1").numpy() == x).all()) for _ in range(2)]   # the second copy does not try the peer again
print(json.dumps({"ok": ok}))
"""

def test_fallback_through_the_client_when_the_destination_is_unreachable(daemon_bin):
  with runners() as (ra, rb), one_connection_relay(rb.addr) as relay:
    r = run_python(FALLBACK_SCRIPT, {"METAL_RUNNER": f"{ra.addr},{relay}", "DEBUG": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1])["ok"] == [True, True]
    lines = [l for l in r.stderr.splitlines() if "copying through this host" in l]
    assert len(lines) == 1 and "EPEER" in lines[0] and f"cannot connect to the destination runner at {relay}" in lines[0], r.stderr[-3000:]

def test_unreachable_destination_is_epeer_at_once(daemon_bin):
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]   # bound, never listening: connections are refused
  with runners(1) as (ra,), Runner(ra.addr) as a:
    a.alloc(1, 64)
    t0 = time.monotonic()
    code, text = code_of(lambda: a.peer_send(1, 0, 64, "127.0.0.1", port, 1 << 32 | 1, bytes(32)))
    assert code == P.EPEER and "cannot connect" in text and time.monotonic() - t0 < 2
    a.sync()   # the session carries on
  s.close()

def test_destination_at_its_session_limit_is_epeer(daemon_bin):
  # the peer connection is refused like any connection over --max-sessions: for this copy the destination cannot be reached
  with runners(1) as (ra,), runners(1, "--max-sessions", "1") as (rb,), Runner(ra.addr) as a, Runner(rb.addr) as b:
    a.alloc(1, 64); b.alloc(2, 64)
    code, text = code_of(lambda: send(a, 1, 0, 64, rb.addr, *b.grant(2, 0, 64)))
    assert code == P.EPEER and "serving as many sessions as it allows" in text, text

def test_destination_that_cannot_prove_the_grant_gets_no_data(daemon_bin):
  # something listening at the address that is not the runner that issued the grant: it answers with an Rpeer whose mac is wrong
  ls = socket.socket()
  ls.bind(("127.0.0.1", 0))
  ls.listen(1)
  got = []
  def fake():
    c, _ = ls.accept()
    got.append(c.recv(4096))
    c.sendall(P.pack(P.RPEER, 1, count=0, mac=bytes(32)))
    time.sleep(0.5)
    c.setblocking(False)
    with contextlib.suppress(OSError): got.append(c.recv(1 << 20))
    c.close()
  th = threading.Thread(target=fake, daemon=True)
  th.start()
  with runners(1) as (ra,), Runner(ra.addr) as a:
    a.alloc(1, 4096); a.write(1, 0, b"\x42" * 4096)
    code, text = code_of(lambda: a.peer_send(1, 0, 4096, "127.0.0.1", ls.getsockname()[1], 7 << 32 | 1, os.urandom(32)))
    assert code == P.EPEER and "did not prove the grant" in text
  th.join(5)
  ls.close()
  assert len(got[0]) == P.MSGS[P.TPEER].size and b"\x42" not in b"".join(got[1:])

# *** bad grants

@pytest.fixture(scope="module")
def pair(daemon_bin):
  with runners(3) as rs: yield rs

def setup(ra, rb, n:int=4096):
  a, b = Runner(ra.addr), Runner(rb.addr)
  a.alloc(1, n); a.write(1, 0, pattern(n, 7)); b.alloc(2, n)
  return a, b

def test_replayed_grant_is_refused(pair):
  ra, rb, _ = pair
  a, b = setup(ra, rb)
  g = b.grant(2, 0, 4096)
  send(a, 1, 0, 4096, rb.addr, *g)
  code, text = code_of(lambda: send(a, 1, 0, 4096, rb.addr, *g))
  assert code == P.EGRANT and "already used" in text
  a.sync(); b.sync()   # both sessions carry on

def test_grant_of_another_session_is_refused(pair):
  ra, rb, rc = pair
  a, b = setup(ra, rb)
  b2 = Runner(rb.addr)
  b2.alloc(2, 4096)
  g, sec = b.grant(2, 0, 4096)
  g2, _ = b2.grant(2, 0, 4096)
  assert g2 & 0xffffffff == g & 0xffffffff   # same sequence number, another session
  # b's secret under b2's grant number: routed to b2, whose grant has another secret
  assert code_of(lambda: send(a, 1, 0, 4096, rb.addr, g2, sec))[0] == P.EGRANT
  # b's grant sent to another runner: no session there holds it
  code, text = code_of(lambda: send(a, 1, 0, 4096, rc.addr, g, sec))
  assert code == P.EGRANT and "no session of this runner holds that grant" in text
  send(a, 1, 0, 4096, rb.addr, g, sec)   # the right one, to the right runner, still works: failed attempts do not use it up
  out = bytearray(4096)
  b.read(2, 0, out)
  assert out == pattern(4096, 7)

def test_forged_grant_is_refused(pair):
  ra, rb, _ = pair
  a, b = setup(ra, rb)
  g, sec = b.grant(2, 0, 4096)
  code, text = code_of(lambda: send(a, 1, 0, 4096, rb.addr, g, os.urandom(32)))
  assert code == P.EGRANT and "proof is wrong" in text
  assert code_of(lambda: send(a, 1, 0, 4096, rb.addr, g + 1, sec))[0] == P.EGRANT   # a number never issued
  send(a, 1, 0, 4096, rb.addr, g, sec)

def test_expired_grant_is_refused(pair):
  ra, rb, _ = pair
  a, b = setup(ra, rb)
  g = b.grant(2, 0, 4096, ttl=1)
  time.sleep(1.3)
  code, text = code_of(lambda: send(a, 1, 0, 4096, rb.addr, *g))
  assert code == P.EGRANT and "expired" in text

def test_grant_outside_the_buffer_is_refused(pair):
  ra, rb, _ = pair
  _, b = setup(ra, rb)
  assert code_of(lambda: b.grant(2, 4000, 97))[0] == P.ERANGE
  assert code_of(lambda: b.grant(2, 1 << 63, 1 << 63))[0] == P.ERANGE   # no wrap
  assert code_of(lambda: b.grant(3, 0, 1))[0] == P.EHANDLE
  assert code_of(lambda: b.grant(2, 0, 0))[0] == P.EINVAL
  assert code_of(lambda: b.grant(2, 0, 1, ttl=0))[0] == P.EINVAL
  assert code_of(lambda: b.grant(2, 0, 1, ttl=P.MAX_GRANT_TTL + 1))[0] == P.EINVAL
  for _ in range(P.MAX_GRANTS): b.grant(2, 0, 1)
  assert code_of(lambda: b.grant(2, 0, 1))[0] == P.ELIMIT

def test_bad_tpeersend_is_refused(pair):
  ra, rb, _ = pair
  a, b = setup(ra, rb)
  g = b.grant(2, 0, 4096)
  assert code_of(lambda: a.peer_send(1, 0, 4096, "", hostport(rb.addr)[1], *g))[0] == P.EINVAL
  assert code_of(lambda: a.peer_send(1, 0, 4096, "127.0.0.1\0x", hostport(rb.addr)[1], *g))[0] == P.EINVAL
  assert code_of(lambda: send(a, 5, 0, 4096, rb.addr, *g))[0] == P.EHANDLE
  assert code_of(lambda: send(a, 1, 1, 4096, rb.addr, *g))[0] == P.ERANGE
  send(a, 1, 0, 4096, rb.addr, *g)   # none of those reached the destination: the grant is still good

# *** peers that misbehave: the test is the source runner, speaking Tpeer itself

def peer(addr:str, grant:int, secret:bytes|None, count:int, mac:bytes|None=None, cnonce:bytes|None=None,
         magic:int=P.MAGIC) -> tuple[socket.socket, tuple]:
  s = socket.create_connection(hostport(addr), timeout=10)
  cn = cnonce or os.urandom(32)
  s.sendall(P.pack(P.TPEER, 9, magic=magic, grant=grant, count=count, cnonce=cn,
                   mac=mac if mac is not None else P.peer_mac(secret, P.PEER_SRC, grant, count, cn)))
  return s, (cn, frame(s))

def frame(s:socket.socket) -> tuple[int, dict, bytes]:
  def exact(n):
    b = bytearray()
    while len(b) < n:
      if not (c := s.recv(n - len(b))): raise EOFError(f"closed after {len(b)} of {n} bytes")
      b += c
    return bytes(b)
  h = exact(P.HDR_SIZE)
  b = h + exact(struct.unpack_from("<I", h)[0] - P.HDR_SIZE)
  t, f = P.unpack(b)
  return t, f, b[P.MSGS[t].size:]

def closed(s:socket.socket) -> bool:
  s.settimeout(5)
  try: return s.recv(1) == b""
  except ConnectionResetError: return True

def test_peer_without_a_grant_is_refused(pair):
  _, rb, _ = pair
  b = Runner(rb.addr)
  b.alloc(2, 64)
  for grant in (b.info.session << 32 | 1, 0xfffffff0 << 32 | 1):   # this session, which issued nothing; a session that does not exist
    s, (_, (t, f, text)) = peer(rb.addr, grant, os.urandom(32), 64)
    assert t == P.RERROR and f["code"] == P.EGRANT and f["tag"] == 9, text
    assert closed(s)
  # a connection that sends nothing is closed at the handshake deadline, like any other (that runner's default: 10 s; not waited here)
  s = socket.create_connection(hostport(rb.addr))
  s.sendall(P.pack(P.TPEER, 9, magic=P.MAGIC)[:50])   # half a Tpeer, then silence: still no grant, nothing written
  s.close()
  out = bytearray(64)
  b.read(2, 0, out)
  assert out == bytes(64)

def test_peer_with_a_bad_magic_is_refused(pair):
  _, rb, _ = pair
  b = Runner(rb.addr)
  b.alloc(2, 64)
  g, sec = b.grant(2, 0, 64)
  s, (_, (t, f, text)) = peer(rb.addr, g, sec, 64, magic=0x12345678)
  assert t == P.RERROR and f["code"] == P.EVERSION and b"not a metal_runner peer" in text
  s, (_, (t, f, _)) = peer(rb.addr, g, sec, 64)   # its proof was right: the grant is used
  assert t == P.RERROR and f["code"] == P.EGRANT

def test_tpeer_in_a_session_ends_it(pair):
  _, rb, _ = pair
  from wire import Raw
  c = Raw(rb.addr)
  c.req(P.TPEER, magic=P.MAGIC, grant=1, count=1)
  code, _, text = c.error()
  assert code == P.ESTATE and "first frame of a peer connection" in text

def test_peer_offering_more_than_granted_is_refused(pair):
  _, rb, _ = pair
  b = Runner(rb.addr)
  b.alloc(2, 8192); b.write(2, 0, b"\x11" * 8192)
  g, sec = b.grant(2, 1000, 100)
  s, (_, (t, f, text)) = peer(rb.addr, g, sec, 101)
  assert t == P.RERROR and f["code"] == P.ERANGE and b"grant allows 100" in text
  assert closed(s)
  s, (_, (t, f, _)) = peer(rb.addr, g, sec, 100)   # the proof was right, so that attempt used the grant up
  assert t == P.RERROR and f["code"] == P.EGRANT
  # a peer that sends more bytes than it offered: the runner reads the count, answers, closes; nothing lands past the range
  g, sec = b.grant(2, 1000, 100)
  s, (cn, (t, f, _)) = peer(rb.addr, g, sec, 100)
  assert t == P.RPEER and f["count"] == 0 and f["mac"] == P.peer_mac(sec, P.PEER_DST, g, 100, cn)
  s.sendall(b"\x22" * 100 + b"\x33" * 5000)
  t, f, _ = frame(s)
  assert t == P.RPEER and f["count"] == 100 and f["mac"] == P.peer_mac(sec, P.PEER_DONE, g, 100, cn)
  s.close()
  out = bytearray(8192)
  b.read(2, 0, out)
  assert out == b"\x11" * 1000 + b"\x22" * 100 + b"\x11" * 7092

def test_peer_that_stops_short_leaves_the_session_running(pair):
  _, rb, _ = pair
  b = Runner(rb.addr)
  b.alloc(2, 1 << 20)
  g, sec = b.grant(2, 0, 1 << 20)
  s, (_, (t, _, _)) = peer(rb.addr, g, sec, 1 << 20)
  assert t == P.RPEER
  s.sendall(b"\x44" * 1000)
  s.close()   # 1000 of 1 MiB, then gone
  out = bytearray(1000)
  b.read(2, 0, out)   # the session noticed, and serves its client
  assert out == b"\x44" * 1000
