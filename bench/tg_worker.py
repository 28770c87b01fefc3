"""One tinygrad device in its own process, for bench/run.py: sets up, prints {"ready": ...}, then runs one measurement per line
of stdin ("name") and answers one JSON line each. Works with tinygrad 0.14 (this project's) and 0.11 (its REMOTE device, --remote011).
The client (REMOTE, 0.14) is the one on PYTHONPATH when that holds a client/ (bench/run.py --compare points it at another commit's
tree), else this tree's; the ready line names it.

  python3 bench/tg_worker.py DEVICE     DEVICE: REMOTE (a metal_runner, METAL_RUNNER=host:port) or CPU; with tinygrad 0.11 REMOTE is
                                        0.11's own REMOTE device (HOST=host:port)

What is timed (the same code on every device):
  launch    a raw compiled program, out = a + 1 on one float, taken from tinygrad's own lowering (0.14: compile_linear + get_runtime,
            0.11: lower_schedule_item) and called 1,000 times the way tinygrad's exec_kernel calls it, then one device sync; the
            figure is the wall time divided by 1,000.
  roundtrip one launch of that program, then a 4-byte copyout of its output (Allocator._copyout, what tinygrad runs for .item());
            timed one at a time, median and p90 (bench/run.py pins this one: see its docstring).
  ping      REMOTE (0.14) only: Runner.ping() on the device's own connection, timed one at a time, median and p90: the protocol's
            round trip in the same process and pinning as roundtrip.
  copyin / copyout  Allocator._copyin (then a device sync) / _copyout of 64 MiB between host memory and a device buffer: what a COPY
            between the host and the device runs, without tinygrad's scheduler around it.
  mlp_item / mlp_sync  a TinyJit training step of a 784-128-10 MLP (ReLU, sparse categorical cross-entropy, SGD lr 0.01), batch 64,
            batches already on the device (4 of them, used in turn); mlp_item reads the loss (.item()) every step, mlp_sync syncs the
            device once per 50 steps. Steps per second over at least 100 steps and 0.4 s (--quick: 50 steps, 0.2 s).
  weights   Tensor(a numpy array of 256 MiB of float32).to(DEVICE).realize(), then a device sync: what loading a model's weights runs
            (a copy from tinygrad's NPY device; after the first, the device buffer is the previous one's, from tinygrad's LRU allocator);
            GB/s, the best of 3 (the array is made once).
"""
from __future__ import annotations
import json, os, pathlib, sys, time

OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # anything else printed to stdout (tinygrad, the client) goes to stderr: stdout carries only results
DEV = sys.argv[1]
if not any(pathlib.Path(d, "client", "connection.py").is_file() for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tinygrad import Tensor, TinyJit, nn, Device  # noqa: E402
V014 = not hasattr(Tensor, "train")   # 0.11 has Tensor.train(); 0.14 uses Context(TRAINING=1)
if DEV == "REMOTE" and V014: import client.remote_metal  # noqa: E402,F401  # installs REMOTE: a metal_runner with the CPU backend

MIB = 1 << 20

def train_ctx():
  if not V014: return Tensor.train()
  from tinygrad.helpers import Context
  return Context(TRAINING=1)

class Kernel:
  """out = a + 1 on one float: the compiled program and its arguments, exactly as tinygrad's runtime would call it."""
  def __init__(self):
    self.a = Tensor.ones(1, device=DEV).contiguous().realize()
    t = self.a + 1
    if V014:
      from tinygrad.engine.realize import compile_linear, get_runtime, resolve_params, run_linear
      from tinygrad.uop.ops import Ops
      linear = compile_linear(t.schedule_linear())
      call = next(c for c in linear.src if c.src[0].op is Ops.PROGRAM)
      ast, dev = call.src[0], call.src[1].device
      self.bufs = [b.buffer.ensure_allocated() for b in (resolve_params(call, ())[i] for i in ast.arg.globals)]
      self.prg, (gs, ls) = get_runtime(dev, ast), ast.arg.launch_dims({})
      self.args = [b.get_buf(dev) for b in self.bufs]
      self.kw = dict(global_size=tuple(gs), local_size=tuple(ls) if ls is not None else None, vals=tuple(ast.arg.vals({})))
      run_linear(linear)
    else:
      from tinygrad.engine.realize import lower_schedule_item
      si = t.schedule()[-1]
      ei = lower_schedule_item(si)
      self.bufs = [b.ensure_allocated() for b in ei.bufs]
      gs, ls = ei.prg.p.launch_dims({})
      self.prg, self.args = ei.prg._prg, [b._buf for b in self.bufs]
      self.kw = {k: tuple(v) for k, v in (("global_size", gs), ("local_size", ls)) if v is not None} | {"vals": ()}
      ei.run()
    self.out = self.bufs[0]
    self.four = memoryview(bytearray(4))
    assert self.read() == 2.0, f"{DEV}: a + 1 gave {self.read()}"

  def launch(self): self.prg(*self.args, **self.kw)
  def read(self) -> float:
    self.out.allocator._copyout(self.four, self.out._buf)
    return self.four.cast("f")[0]

def sync():
  # tinygrad 0.11's REMOTE has no synchronize(): its queue goes out only with a request that waits, so sync by a 4-byte copyout
  if DEV == "REMOTE" and not V014: KERNEL.read()
  else: Device[DEV].synchronize()

class MLP:
  def __init__(self): self.l1, self.l2 = nn.Linear(784, 128), nn.Linear(128, 10)
  def __call__(self, x): return self.l2(self.l1(x).relu())

def setup_mlp():
  global MODEL, OPT, STEP, STEP_FUSED, XS, YS
  with train_ctx():
    Tensor.manual_seed(0)
    MODEL = MLP()
    params = nn.state.get_parameters(MODEL)
    for p in params: p.realize()
    OPT = nn.optim.SGD(params, lr=0.01)
  XS = [Tensor.randn(64, 784, device=DEV).realize() for _ in range(4)]
  YS = [Tensor.randint(64, high=10, device=DEV).realize() for _ in range(4)]

  @TinyJit
  def step(x, y):
    with train_ctx():
      OPT.zero_grad()
      loss = MODEL(x).sparse_categorical_crossentropy(y).backward()
      OPT.step()
      return loss.realize()
  STEP = step
  for i in range(6): STEP(XS[i % 4], YS[i % 4]).item()  # capture the JIT, warm up

  # the same step with the loss realized together with the update (tinygrad's examples do this): tinygrad 0.14 schedules step() above
  # with the first layer's forward matmul twice (the loss after OPT.step() is computed anew), 0.11 with it once; this one is the same
  # work in both (bench/link_worker.py mlp_fused)
  @TinyJit
  def step_fused(x, y):
    with train_ctx():
      OPT.zero_grad()
      loss = MODEL(x).sparse_categorical_crossentropy(y).backward()
      return loss.realize(*OPT.schedule_step())
  STEP_FUSED = step_fused
  for i in range(6): STEP_FUSED(XS[i % 4], YS[i % 4]).item()

def m_launch(n=1000):
  sync()
  t = time.perf_counter()
  for _ in range(n): KERNEL.launch()
  sync()
  return {"us_per_launch": (time.perf_counter() - t) / n * 1e6}

def m_roundtrip(n=500):
  ts = []
  for _ in range(n):
    t = time.perf_counter()
    KERNEL.launch()
    KERNEL.read()
    ts.append(time.perf_counter() - t)
  ts.sort()
  return {"median_us": ts[n // 2] * 1e6, "p90_us": ts[n * 9 // 10] * 1e6}

def m_ping(n=500):
  r, ts = Device[DEV].runner, []
  sync()
  for _ in range(n):
    t = time.perf_counter()
    r.ping()
    ts.append(time.perf_counter() - t)
  ts.sort()
  return {"median_us": ts[n // 2] * 1e6, "p90_us": ts[n * 9 // 10] * 1e6}

def m_weights(size=256 * MIB, n=3):
  import numpy as np
  global WEIGHTS
  if "WEIGHTS" not in globals(): WEIGHTS = np.random.default_rng(0).random(size // 4, dtype=np.float32)
  best = None
  for _ in range(n):
    t = time.perf_counter()
    w = Tensor(WEIGHTS).to(DEV).realize()
    sync()
    s = time.perf_counter() - t
    best = s if best is None else min(best, s)
    del w   # its device buffer goes before the next one is made
  return {"gbps": size / best / 1e9}

def m_copy(size=64 * MIB):
  from tinygrad.device import Buffer
  from tinygrad.dtype import dtypes
  global COPYBUF, HOST
  if "COPYBUF" not in globals():
    COPYBUF = Buffer(DEV, size, dtypes.uint8).ensure_allocated()
    HOST = memoryview(bytearray(os.urandom(1024) * (size // 1024)))
    COPYBUF.allocator._copyin(COPYBUF._buf, HOST)  # first touch of both sides' pages is not what is measured
    sync()
  al = COPYBUF.allocator
  t = time.perf_counter()
  al._copyin(COPYBUF._buf, HOST)
  sync()
  t_in = time.perf_counter() - t
  t = time.perf_counter()
  al._copyout(HOST, COPYBUF._buf)
  t_out = time.perf_counter() - t
  return {"copyin_gbps": size / t_in / 1e9, "copyout_gbps": size / t_out / 1e9}

def m_mlp(every:int, min_steps=100, min_s=0.4):
  sync()
  n, t = 0, time.perf_counter()
  while n < min_steps or time.perf_counter() - t < min_s:
    for _ in range(50):
      loss = STEP(XS[n % 4], YS[n % 4])
      n += 1
      if every == 1: loss.item()
    if every != 1: sync()
  return {"steps_per_s": n / (time.perf_counter() - t), "steps": n}

METRICS = {"launch": m_launch, "roundtrip": m_roundtrip, "ping": m_ping, "copy": m_copy, "weights": m_weights, "mlp_item": lambda: m_mlp(1), "mlp_sync": lambda: m_mlp(50),
           "mlp_item quick": lambda: m_mlp(1, 50, 0.2), "mlp_sync quick": lambda: m_mlp(50, 50, 0.2)}

if __name__ == "__main__":
  from tinygrad.helpers import getenv
  t0 = time.perf_counter()
  KERNEL = Kernel()
  from importlib.metadata import version
  info = {"ready": True, "device": DEV, "tinygrad": version("tinygrad"),
          "threads": getenv("NUM_CPU_THREADS", 0), "setup_s": None}
  if DEV == "REMOTE" and V014: info.update(runner_ncores=Device[DEV].runner.info.ncores, client=sys.modules["client"].__file__)
  setup_mlp()
  info["setup_s"] = time.perf_counter() - t0
  OUT.write(json.dumps(info) + "\n")
  for line in sys.stdin:
    if not (name := line.strip()): continue
    try: res = METRICS.get(name, METRICS.get(name.split()[0]))()
    except Exception as e:  # a benchmark reports, it does not stop: the orchestrator prints the error in the table
      import traceback
      traceback.print_exc()
      res = {"error": f"{type(e).__name__}: {e}"}
    OUT.write(json.dumps(res) + "\n")
