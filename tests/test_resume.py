# Sessions that survive a dropped link (protocol.md, "Resuming a session"): a TinyJit training run whose connection is cut several
# times by a relay (tests/link_cutter.py, a test harness on 127.0.0.1, not a network) ends with exactly the losses of an uncut run;
# and each bad resume is refused without harm to the session it names. Both isolation modes.
import hashlib, hmac, json, os, struct, time
import numpy as np
import pytest
from conftest import run_python
from runner_proc import RunnerProc, until
from link_cutter import LinkCutter
from wire import Raw
from client import protocol as P
from client.connection import Runner, RunnerConnectionError
from client.resume import LABEL_CLIENT, LABEL_SERVER

ISO = ["process", "thread"]   # runners come from RunnerProc: METAL_RUNNER_BIN (e.g. a sanitizer build) if set

# *** the done-when: a TinyJit training run, cut in the middle of a program upload, a large write, a graph run request and a reply

TRAIN = """
import client.remote_metal, json, numpy as np
from tinygrad import Tensor, TinyJit, Device, nn
from tinygrad.helpers import Context
rng = np.random.default_rng(7)
X = rng.normal(size=(64, 256)).astype(np.float32)
Y = ((X[:, 0] * X[:, 1] > 0).astype(np.int32) + 2 * (X[:, 2] > 0).astype(np.int32))
w1 = rng.normal(size=(256, 1024)).astype(np.float32) * 0.05    # a 1 MiB upload
w2 = rng.normal(size=(1024, 4)).astype(np.float32) * 0.05
params = [Tensor(w1, device="REMOTE"), Tensor.zeros(1024, device="REMOTE").contiguous(), Tensor(w2, device="REMOTE"),
          Tensor.zeros(4, device="REMOTE").contiguous()]
opt = nn.optim.Adam(params, lr=0.01, device="REMOTE")
@TinyJit
def step(x, y):
  with Context(TRAINING=1):
    opt.zero_grad()
    loss = ((x @ params[0] + params[1]).relu() @ params[2] + params[3]).sparse_categorical_crossentropy(y).backward()
    return loss.realize(*opt.schedule_step())
big = None
if (mib := int(__import__("os").environ.get("BIG_MIB", 0))):   # weights of that size, uploaded before training and checked after it
  big = Tensor(np.random.default_rng(9).standard_normal(mib << 18, dtype=np.float32), device="REMOTE").realize()
losses = [step(Tensor(X[i % 2::2], device="REMOTE"), Tensor(Y[i % 2::2], device="REMOTE")).item() for i in range(10)]
w = params[0].numpy()   # a 1 MiB read at the end
print(json.dumps({"losses": losses, "wsum": float(np.abs(w).sum()), "big": None if big is None else big.abs().sum().item(),
                  "stats": Device["REMOTE"].runner.stats()}))
"""

def train(addr:str, big_mib:int=0) -> dict:
  r = run_python(TRAIN, env={"METAL_RUNNER": addr, "BIG_MIB": str(big_mib)})
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])

@pytest.mark.slow   # four training runs of ~10 s each on a loaded 2-core machine
@pytest.mark.cpu_only
@pytest.mark.parametrize("iso", ISO)
def test_training_run_survives_cuts(daemon_bin, iso):
  r = RunnerProc("-v", "--isolation", iso)
  try:
    uncut = train(r.addr)
    with LinkCutter(r.addr) as lc:
      lc.cut_in(up=P.TLOAD, skip=3)                      # in the middle of a program upload
      lc.cut_in(up=P.TWRITE, min_size=1 << 19)           # in the middle of the 1 MiB weight upload
      lc.cut_in(up=P.TGRAPHRUN, skip=4)                  # in the middle of a JIT step's request
      lc.cut_in(down=P.RREAD, skip=5)                    # while a loss is on its way back
      lc.cut_in(down=P.RREAD, min_size=1 << 18)          # in the middle of the final 1 MiB read
      cut = train(lc.addr)
      assert lc.pending() == 0 and lc.cuts >= 5, (lc.pending(), lc.cuts)
    log = r.log_text(0.3)
  finally: r.stop()
  assert cut["losses"] == uncut["losses"] and cut["wsum"] == uncut["wsum"], (cut, uncut)   # exactly, not approximately
  assert cut["losses"][-1] < cut["losses"][0]
  assert uncut["stats"]["resumes"] == 0 and cut["stats"]["resumes"] == 5, cut["stats"]
  assert log.count("resumed from") == 5, log[-4000:]

@pytest.mark.slow   # 256 MiB of weights through a relay, twice
@pytest.mark.cpu_only
def test_training_run_cut_in_the_middle_of_a_256_mib_upload(daemon_bin):
  """The bulk path: a 256 MiB upload goes as Twrites straight from the caller's memory (the resume log refers to it); the link drops
  in the middle of one of them, 160 MiB in, the session resumes, and training and the weights end exactly as without the cut."""
  r = RunnerProc("--isolation", "process")
  try:
    uncut = train(r.addr, 256)
    with LinkCutter(r.addr) as lc:
      lc.cut_in(up=P.TWRITE, min_size=256 << 10, skip=320)
      cut = train(lc.addr, 256)
      assert lc.pending() == 0 and lc.cuts == 1
  finally: r.stop()
  assert (cut["losses"], cut["wsum"], cut["big"]) == (uncut["losses"], uncut["wsum"], uncut["big"]), (cut, uncut)
  assert uncut["stats"]["resumes"] == 0 and cut["stats"]["resumes"] == 1, cut["stats"]

# *** a resume by hand, with raw frames

def key(c:Raw) -> dict:
  tag = c.req(P.TRESUMEKEY, mode=P.RESUME_ON)
  t, f, _ = c.frame()
  assert (t, f["tag"], f["size"]) == (P.RRESUMEKEY, tag, 56), (t, f)
  return f

def tresume(addr:str, session:int, secret:bytes, sent:int, received:int) -> tuple[Raw, bytes, bytes]:
  """A new connection's Tresume (after its hello); returns the connection, the Tresume frame and its cnonce."""
  c = Raw(addr)
  cn = os.urandom(32)
  mac = hmac.new(secret, LABEL_CLIENT + c.info["nonce"] + cn + struct.pack("<IQQ", session, sent, received), hashlib.sha256).digest()
  frame = P.pack(P.TRESUME, 7, session=session, sent=sent, received=received, cnonce=cn, mac=mac)
  c.send(frame)
  return c, frame, cn

def session(addr:str, memory:int=4096) -> tuple[Raw, dict, int, int]:
  """A resumable session holding buffer 1 (memory bytes, filled with 7): (connection, key, requests sent, reply bytes received)."""
  c = Raw(addr)
  k = key(c)
  c.alloc(1, memory)
  c.write(1, 0, b"\7" * memory)
  assert c.ping(b"abc") == b"abc"
  return c, k, 4, 56 + 16 + 3

@pytest.fixture(params=ISO)
def rp(request, daemon_bin):
  r = RunnerProc("-v", "--isolation", request.param, "--resume-grace", "2", "--total-mem", "64K", "--resume-log", "64K")
  yield r
  r.stop()

def test_resume_by_hand(rp):
  c, k, sent, received = session(rp.addr)
  c.s.close()
  n, frame, cn = tresume(rp.addr, c.info["session"], k["secret"], sent, received)
  t, f, _ = n.frame()
  assert t == P.RRESUME and f["processed"] == 4 and f["tag"] == 7
  assert f["mac"] == hmac.new(k["secret"], LABEL_SERVER + cn + n.info["nonce"], hashlib.sha256).digest()
  tag = n.req(P.TREAD, handle=1, offset=0, count=4096)   # the buffer is still there, and its contents
  t, f, p = n.frame()
  assert (t, f["tag"], p) == (P.RREAD, tag, b"\7" * 4096)

def test_resume_sends_again_what_was_not_processed_and_not_received(rp):
  c, k, sent, received = session(rp.addr)
  # a write and a read the runner gets, whose reply the client "loses"; then a request it "never got" (sent again)
  c.write(1, 0, b"\1" * 100)
  c.req(P.TREAD, handle=1, offset=0, count=8)
  t, f, p = c.frame()
  assert p == b"\1" * 8
  c.s.close()
  time.sleep(0.2)
  n, _, _ = tresume(rp.addr, c.info["session"], k["secret"], sent + 2, received)
  t, f, _ = n.frame()
  assert t == P.RRESUME and f["processed"] == sent + 2     # nothing runs twice: both were processed
  t, f, p = n.frame()                                       # the reply the client missed comes again
  assert t == P.RREAD and p == b"\1" * 8
  assert n.ping(b"z") == b"z"

def test_resume_of_unknown_session(rp):
  n, _, _ = tresume(rp.addr, 987654, os.urandom(32), 0, 0)
  code, tag, text = n.error()
  assert (code, tag) == (P.ERESUME, 7) and "no session" in text and n.closed()

def test_resume_with_wrong_proof_leaves_the_session_alone(rp):
  c, k, sent, received = session(rp.addr)
  n, _, _ = tresume(rp.addr, c.info["session"], os.urandom(32), sent, received)   # another client, without the key
  code, _, text = n.error()
  assert code == P.EAUTH and "wrong proof" in text and n.closed()
  assert c.ping(b"still mine") == b"still mine"   # the owner's connection is untouched

def test_replayed_resume_is_refused(rp):
  c, k, sent, received = session(rp.addr)
  c.s.close()
  n, frame, _ = tresume(rp.addr, c.info["session"], k["secret"], sent, received)
  assert n.frame()[0] == P.RRESUME
  m = Raw(rp.addr)   # an eavesdropper sends the same Tresume again on a connection of its own: its nonce differs
  m.send(frame)
  code, _, _ = m.error()
  assert code == P.EAUTH and m.closed()
  assert n.ping(b"ok") == b"ok"

def test_resume_while_the_old_connection_stands_closes_it(rp):
  c, k, sent, received = session(rp.addr)
  n, _, _ = tresume(rp.addr, c.info["session"], k["secret"], sent, received)   # e.g. a half-open link after a network change
  assert n.frame()[0] == P.RRESUME
  assert c.closed()                      # the proven client wins; the old connection is closed
  assert n.ping(b"new") == b"new"

@pytest.mark.parametrize("claim", ["fewer requests", "more replies"])
def test_inconsistent_claims_lose_the_session(rp, claim):
  c, k, sent, received = session(rp.addr, 65536)
  c.s.close()
  n, _, _ = tresume(rp.addr, c.info["session"], k["secret"], sent - 1 if claim == "fewer requests" else sent,
                    received + (1 if claim == "more replies" else 0))
  code, _, text = n.error()
  assert code == P.ERESUME and n.closed(), text
  # the session ended at once: its memory (all of --total-mem) is free for a new one
  m = Raw(rp.addr)
  m.alloc(2, 65536)
  assert m.until_pong() == []

def test_missed_replies_past_the_log_lose_the_session(rp):
  c, k, sent, received = session(rp.addr, 65536)
  # replies the client does not read, more than --resume-log 64K in all, of the kind the runner copies (Rread data of more than 4096
  # bytes it keeps by reference: test_rread_data_is_kept_by_reference_past_the_log)
  for _ in range(17): c.req(P.TREAD, handle=1, offset=0, count=4096)
  time.sleep(0.3)
  c.s.close()
  n, _, _ = tresume(rp.addr, c.info["session"], k["secret"], sent + 17, received)
  code, _, text = n.error()
  assert code == P.ERESUME and "no longer held" in text, text

def test_tresume_must_come_first(rp):
  c, k, sent, received = session(rp.addr)
  m = Raw(rp.addr)
  m.ping()
  cn = os.urandom(32)
  m.req(P.TRESUME, session=c.info["session"], sent=0, received=0, cnonce=cn, mac=bytes(32))
  code, _, _ = m.error()
  assert code == P.ESTATE and m.closed()

def test_grace_period_expiry_frees_the_session(rp):
  c, k, sent, received = session(rp.addr, 65536)   # all of --total-mem
  c.s.close()
  m = Raw(rp.addr)
  m.alloc(2, 65536)
  assert [e[0] for e in m.until_pong()] == [P.ELIMIT]   # the waiting session still holds its memory
  deadline = time.monotonic() + 10                       # --resume-grace 2, from when the session saw the close
  while [e[0] for e in (m.alloc(2, 65536), m.until_pong())[1]] == [P.ELIMIT]:
    assert time.monotonic() < deadline, "the session's memory was not freed after its grace period"
    time.sleep(0.1)
  n, _, _ = tresume(rp.addr, c.info["session"], k["secret"], sent, received)
  code, _, text = n.error()
  assert code == P.ERESUME and "grace" in text
  assert "not resumed within 2 s; ending it" in rp.log_text()

@pytest.mark.parametrize("iso", ISO)
def test_a_waiting_session_gives_up_its_place_but_not_its_memory(iso):
  # so that a client can come back to a full runner (--max-sessions 1: an appliance with one user)
  r = RunnerProc("--isolation", iso, "--max-sessions", "1", "--resume-grace", "3", "--total-mem", "64K")
  try:
    c, k, sent, received = session(r.addr, 65536)
    c.s.close()
    time.sleep(0.3)
    other = Raw(r.addr)                  # the place is free: another client gets in...
    other.alloc(2, 1024)
    assert [e[0] for e in other.until_pong()] == [P.ELIMIT]   # ...but the memory is still the waiting session's
    full = Raw(r.addr, hello=False)      # now the runner is full, for a resume too
    assert full.error()[0] == P.ELIMIT
    other.close()
    time.sleep(0.3)
    n, _, _ = tresume(r.addr, c.info["session"], k["secret"], sent, received)
    assert n.frame()[0] == P.RRESUME and n.read(1, 0, 16) == b"\7" * 16
    time.sleep(0.3)
    assert Raw(r.addr, hello=False).error()[0] == P.ELIMIT   # the resumed session holds the place again
  finally: r.stop()

def test_no_resume_without_grace():
  r = RunnerProc("--resume-grace", "0")
  try:
    c = Raw(r.addr)
    assert not c.info["caps"] & P.CAP_RESUME
    c.req(P.TRESUMEKEY, mode=P.RESUME_ON)
    code, _, _ = c.error()
    assert code == P.EPROTO and c.closed()
    with Runner(r.addr) as rc:
      assert rc._rs is None and rc.ping(b"x") == b"x"
  finally: r.stop()

# *** the client: reconnects by itself, and raises only when the grace period is over

def test_client_resumes_by_itself_and_raises_after_the_grace_period(rp):
  with LinkCutter(rp.addr) as lc:
    c = Runner(lc.addr)
    c.alloc(1, 1024)
    c.write(1, 0, np.arange(256, dtype=np.float32))
    c.sync()
    lc.cut()
    out = np.empty(256, dtype=np.float32)
    c.read(1, 0, out)
    assert (out == np.arange(256)).all() and c.stats()["resumes"] == 1
    lc.blocked = True       # the link stays down: every new connection is dropped at once
    lc.cut()
    t0 = time.monotonic()
    with pytest.raises(RunnerConnectionError, match="grace period"):
      c.sync()
    assert 1.9 <= time.monotonic() - t0 < 5
    with pytest.raises(RunnerConnectionError): c.ping()

def test_client_close_ends_the_session_at_once(rp):
  with Runner(rp.addr) as c:
    c.alloc(1, 65536)
    c.sync()
    assert c._rs.key is not None
  # no grace period to wait out: close() said it was meant. The runner frees the session's memory just after the close, so
  # allow it a moment, well inside the 2 s grace period that would hold the memory without the close
  deadline = time.monotonic() + 1.0
  while True:
    (m := Raw(rp.addr)).alloc(2, 65536)
    if (errs := m.until_pong()) == []: break
    assert time.monotonic() < deadline, errs
    m.s.close()
    time.sleep(0.05)

# *** the client's bookkeeping (client/resume.py), without a runner

def test_replay_log_trims_on_replies_and_rewinds_to_what_was_not_processed():
  from client.resume import Replay
  ping = lambda tag, n: P.pack(P.TPING, tag, payload_len=n, count=n) + bytes([tag]) * n
  rs = Replay(10)                                        # request 0 has tag 10
  a, b = bytearray(ping(10, 1) + ping(11, 2)), bytearray(ping(12, 3) + ping(13, 4))
  rs.sent_own(a, 11)                                     # two flushes; the fifth request (tag 14) is still queued
  rs.log([b], 13)
  assert rs.sent == len(a) + len(b) and rs.nsent == 4
  rs.frame(P.RPING, 16, 11, {}, 14)                      # a reply to tag 11: requests 0 and 1 were processed
  assert (rs.acked, rs.base, rs.held, rs.received) == (2, len(a), len(b), 16)
  rs.frame(P.RERROR, 20, 999, {}, 14)                    # a tag outside the window changes nothing but the count
  assert (rs.acked, rs.received) == (2, 36)
  assert b"".join(rs.rewind(3)) == ping(13, 4)           # the runner processed tag 12 too: tag 13 goes again
  assert rs.acked == 3 and rs.nsent == 4
  with pytest.raises(ValueError): rs.rewind(5)          # more than the client sent: the resume fails (ERESUME)
  with pytest.raises(ValueError): rs.rewind(2)          # fewer than a reply already showed

def test_replay_log_rewinds_across_a_payload_sent_from_the_callers_memory():
  """A Twrite's fixed part ends one send buffer and its data, the caller's memory, is the next: a rewind finds the requests after it
  by their frame headers, and the caller's memory goes again until the call that lent it returns (Runner._release)."""
  from client.resume import Replay
  data = memoryview(bytearray(b"D" * 100))
  rs = Replay(0xfffffffe)                               # tags wrap: requests 0..3 have tags 0xfffffffe, 0xffffffff, 0, 1
  rs.log([bytearray(P.pack(P.TPING, 0xfffffffe) + P.pack(P.TWRITE, 0xffffffff, payload_len=100, handle=1, count=100)), data], 0xffffffff)
  rs.sent_own(bytearray(P.pack(P.TPING, 0) + P.pack(P.TPING, 1)), 1)
  assert (rs.nsent, rs.lent) == (4, 100)
  assert b"".join(rs.rewind(1)) == P.pack(P.TWRITE, 0xffffffff, payload_len=100, handle=1, count=100) + b"D" * 100 + \
    P.pack(P.TPING, 0) + P.pack(P.TPING, 1)
  assert b"".join(rs.rewind(2)) == P.pack(P.TPING, 0) + P.pack(P.TPING, 1) and rs.lent == 0
  rs.frame(P.RPING, 16, 1, {}, 1)                        # the reply to the newest: the log is empty
  assert (rs.acked, rs.held, list(rs.chunks)) == (4, 0, [])

def test_a_large_upload_keeps_the_replay_log_bounded_and_survives_a_cut():
  from client.resume import WINDOW
  r = RunnerProc("--isolation", "thread")
  try:
    with LinkCutter(r.addr) as lc, Runner(lc.addr) as c:
      data = np.random.default_rng(1).integers(0, 255, 48 << 20, dtype=np.uint8)
      peak, log = [0], c._rs.log
      def logged(bufs, newest):
        log(bufs, newest)
        peak[0] = max(peak[0], c._rs.held)
      c._rs.log = logged
      c.alloc(1, data.nbytes)
      # in the middle of the 48 MiB upload, in its 41st frame (WRITE_FRAME, 512 KiB): the log holds the caller's memory, not a copy
      lc.cut_in(up=P.TWRITE, min_size=256 << 10, skip=40)
      c.write(1, 0, data)
      out = np.empty_like(data)
      c.read(1, 0, out)
      assert (out == data).all() and c.stats()["resumes"] == 1 and lc.pending() == 0
      assert peak[0] <= 2 * WINDOW + WINDOW // 2 + 4096, peak[0]
  finally: r.stop()

@pytest.mark.parametrize("copy", [True, False], ids=["copied", "confirmed"])
def test_memory_the_caller_changes_after_a_write_is_not_what_goes_again(copy):
  """The resume log refers to the caller's memory while its call runs. Before write() returns, what the runner may not have processed is
  copied (cheaper than a round trip: copy_max, set here to take each way) or confirmed by the runner: data the caller changes
  afterwards never goes again in place of what it wrote. The cut lands in the middle of the Twrite, which fits the socket buffers,
  so write() has handed all of it to the socket before the link drops."""
  r = RunnerProc("--isolation", "thread")
  size = 256 << 10
  try:
    with LinkCutter(r.addr) as lc, Runner(lc.addr) as c:
      c._rs.copy_max = size if copy else 0
      data = bytearray(np.random.default_rng(3).integers(0, 255, size, dtype=np.uint8).tobytes())
      want = bytes(data)
      c.alloc(1, size)
      lc.cut_in(up=P.TWRITE, min_size=size)
      c.write(1, 0, data)
      data[:] = bytes(size)   # the caller reuses its memory
      out = bytearray(size)
      c.read(1, 0, out)
      assert out == want and c.stats()["resumes"] == 1 and lc.pending() == 0
  finally: r.stop()

def test_the_client_resumes_with_its_token(tmp_path):
  tok = tmp_path / "token"
  tok.write_bytes(b"resume token\n")
  tok.chmod(0o600)
  r = RunnerProc("--token-file", str(tok))
  try:
    with LinkCutter(r.addr) as lc, Runner(lc.addr, token=b"resume token") as c:
      assert c.info.caps & P.CAP_AUTH and c.info.caps & P.CAP_RESUME
      c.alloc(1, 64)
      c.write(1, 0, bytes(range(64)))
      lc.cut_in(down=P.RREAD)
      out = bytearray(64)
      c.read(1, 0, out)
      assert out == bytes(range(64)) and c.stats()["resumes"] == 1
  finally: r.stop()

def test_uploads_through_the_cache_survive_cuts(tmp_path):
  """Process isolation with a cache: the session process forks its cache helper (cachelink.c) and still takes the resumed
  connection; a cut in the middle of a Twrite that the runner also caches, and one among Twritehash frames, both resume."""
  r = RunnerProc("--isolation", "process", "--cache-dir", str(tmp_path / "cache"))
  try:
    data = np.random.default_rng(2).integers(0, 255, 8 << 20, dtype=np.uint8)
    for cut in ((P.TWRITE, 1 << 20, 2), (P.TWRITEHASH, 0, 3)):   # the first session stores the chunks, the second names them
      with LinkCutter(r.addr) as lc, Runner(lc.addr) as c:
        assert c.info.caps & P.CAP_CACHE and c.info.caps & P.CAP_RESUME
        c.alloc(1, data.nbytes)
        lc.cut_in(up=cut[0], min_size=cut[1], skip=cut[2])
        c.write(1, 0, data)
        out = np.empty_like(data)
        c.read(1, 0, out)
        assert (out == data).all() and c.stats()["resumes"] == 1 and lc.pending() == 0
      # the cache stores after the write, while the session goes on: wait for all 8 chunks
      assert until(lambda: len([f for f in (tmp_path / "cache").iterdir() if not f.name.startswith(".")]) >= 8, 10), \
        "the first session's 8 chunks were never all stored"
    assert c.stats()["bytes_sent"] < 1 << 20, c.stats()   # the second session named its 8 chunks instead of sending them
  finally: r.stop()

@pytest.mark.parametrize("iso", ISO)
def test_many_resumes_at_once_all_reach_their_sessions(iso):
  """4 clients resume 200 sessions between them: with thread isolation a slot freed and taken again at once used to drop a resume
  its last session had just passed up (the session then waited out its grace period and the client timed out)."""
  import threading, leakcheck
  r = RunnerProc("--isolation", iso, "--resume-grace", "5")
  try:
    k, fails = leakcheck.Kernels(), []
    def client(j):
      for i in range(j, 200, 4):
        try: leakcheck.resume_cycle(r.addr, k, i)
        except Exception as e: fails.append((i, repr(e)))  # noqa: BLE001 - reported below
    ts = [threading.Thread(target=client, args=(j,)) for j in range(4)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert fails == [] and "not resumed" not in r.log_text(0.2), (fails, r.log_text(0))
  finally: r.stop()
