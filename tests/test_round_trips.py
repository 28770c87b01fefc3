# Round trips and byte counts: Runner.stats() on the client, the runner's per-session totals in its -v log. Not timed: these count what
# crosses the link, which is what a real network makes expensive (bench/run.py --only link times it over an emulated one).
import re
import numpy as np
import pytest
from conftest import run_python
from runner_proc import RunnerProc
from client.connection import Runner, WRITE_FRAME, READ_PART
from client import protocol as P

def test_stats_count_requests_round_trips_and_bytes(daemon_bin):
  # the base protocol's exact accounting: without CAP_RESUME (the key exchange adds a request each way; tests/test_resume.py)
  r = RunnerProc("-v", "--resume-grace", "0", binary=daemon_bin)
  try:
    with Runner(r.addr) as c:
      s0 = c.stats()
      assert s0["round_trips"] == 1 and s0["requests"] == 1 and s0["replies"] == 1   # Thello
      c.alloc(1, 1 << 20)
      c.write(1, 0, np.arange(1 << 18, dtype=np.float32))   # 1 MiB in Twrites of WRITE_FRAME
      c.alloc(2, 64)
      nw, nr = -(-(1 << 20) // WRITE_FRAME), -(-(1 << 20) // READ_PART)
      s1 = c.stats()
      assert s1["round_trips"] == 1 and s1["requests"] == 3 + nw and s1["bytes_received"] == s0["bytes_received"]   # pipelined: no wait
      out = np.empty(1 << 18, dtype=np.float32)
      c.read(1, 0, out)   # 1 MiB in Treads of READ_PART, pipelined: one round trip
      assert (out == np.arange(1 << 18)).all()
      s2 = c.stats()
      assert s2["round_trips"] == 2 and s2["requests"] == 3 + nw + nr and s2["replies"] == 1 + nr
      assert s2["bytes_sent"] - s0["bytes_sent"] >= 1 << 20 and s2["bytes_received"] - s1["bytes_received"] >= 1 << 20
      c.ping(b"x" * 100)
      c.sync()
      s3 = c.stats()
      assert s3["round_trips"] == 4 and s3["requests"] == 5 + nw + nr
    log = r.wait_log(" requests, ", " answered, ")
  finally: r.stop()
  m = re.search(r"session \d+: ended: .*; [\d.]+ s, (\d+) requests, (\d+) answered, (\d+) bytes in, (\d+) bytes out", log)
  assert m, log
  assert tuple(map(int, m.groups())) == (s3["requests"], s3["replies"], s3["bytes_sent"], s3["bytes_received"]), log

def test_split_read_is_one_round_trip(daemon_bin):
  # a read larger than a frame goes out as several Treads at once; waiting for the later parts costs no further round trip
  r = RunnerProc("--max-msg", "65536", binary=daemon_bin)
  try:
    with Runner(r.addr) as c:
      n = c.maxmsg * 2 + 100
      c.alloc(1, n)
      c.write(1, 0, data := np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8))
      c.sync()   # a resumable session has its key now, and with it the size of the runner's reply log
      before, out = c.stats(), np.empty(n, dtype=np.uint8)
      c.read(1, 0, out)
      after = c.stats()
      # reads go in parts of READ_PART (at most a frame); a resumable session acknowledges each part of more than P.RREAD_INLINE
      # bytes with a Tack (no reply), and without CAP_ACK reads in parts of a quarter of the runner's reply log (client/resume.py)
      ack = c._rs is not None and c.info.caps & P.CAP_ACK
      step = min(READ_PART, c.maxmsg - 16) if c._rs is None or ack else min(READ_PART, c.maxmsg - 16, c._rs.key["log"] // 4)
  finally: r.stop()
  parts = -(-n // step)
  tacks = sum(min(step, n - i) > P.RREAD_INLINE for i in range(0, n, step)) if ack else 0
  assert c.maxmsg == 65536 and (out == data).all()
  assert parts == 3 and after["requests"] - before["requests"] == parts + tacks and after["replies"] - before["replies"] == parts
  assert after["round_trips"] - before["round_trips"] == 1

JIT_STEPS = """
import client.remote_metal, json
from tinygrad import Tensor, TinyJit, Device, Context, nn
from tinygrad.nn.optim import SGD
Tensor.manual_seed(0)
l1, l2 = nn.Linear(32, 16), nn.Linear(16, 4)
params = nn.state.get_parameters([l1, l2])
opt = SGD(params, lr=0.01)
X, Y = Tensor.randn(8, 32).realize(), Tensor.randint(8, high=4).realize()
@TinyJit
def step():
  with Context(TRAINING=1):
    opt.zero_grad()
    loss = l2(l1(X).relu()).sparse_categorical_crossentropy(Y).backward()
    return loss.realize(*opt.schedule_step())
runner = Device["REMOTE"].runner
out = {}
for read in (True, False):
  step.reset()
  for _ in range(3): loss = step(); loss.item()          # capture, then the first replay
  Device["REMOTE"].synchronize()
  s0 = runner.stats()
  losses = [step().item() if read else step() for _ in range(5)]
  s1 = runner.stats()
  out[str(read)] = {k: s1[k] - s0[k] for k in s0}
  out[str(read) + "_losses"] = [float(x) for x in losses] if read else []
print(json.dumps(out))
"""

def test_captured_jit_step_round_trips(cpu_runner):
  # after capture, a TinyJit step that reads the loss costs exactly one round trip; one that does not read costs none
  import json
  r = run_python(JIT_STEPS, env={"METAL_RUNNER": cpu_runner, "DEV": "REMOTE"})
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  read, noread = out["True"], out["False"]
  assert read["round_trips"] == 5, out
  assert noread["round_trips"] == 0 and noread["bytes_received"] == 0, out
  assert noread["requests"] >= 5, out   # the steps did go out (each one Tgraphrun at least), pipelined
  assert read["requests"] - noread["requests"] == 5, out   # reading adds just the Tread per step
  assert len(set(out["True_losses"])) > 1, out   # training moved: the reads were real
