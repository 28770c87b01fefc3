# tinygrad on a metal_runner (client/remote_metal.py), checked against tinygrad's own CPU device.
# In-process tests share one CPU runner (tinygrad opens a device once per process); tests that need a fresh Device table, other
# environment variables or a runner of their own run python in a subprocess.
import gc, json, os, re, select, signal, socket, subprocess, sys, threading, time
import numpy as np
import pytest
from conftest import ROOT, run_python, runner
from client import protocol as P

@pytest.fixture(scope="module")
def remote(cpu_runner):
  saved, os.environ["METAL_RUNNER"] = os.environ.get("METAL_RUNNER"), cpu_runner
  try:
    import client.remote_metal  # noqa: F401
    from tinygrad import Device
    assert Device["REMOTE"].runner.addr == cpu_runner, "REMOTE was opened before this module set METAL_RUNNER"
  finally:  # the device keeps its connection; later tests and subprocesses must not inherit the address
    if saved is None: del os.environ["METAL_RUNNER"]
    else: os.environ["METAL_RUNNER"] = saved
  return "REMOTE"

class Spy:
  """Records the Runner calls a device makes (name, args, kwargs, result), passing them through."""
  def __init__(self, monkeypatch, runner, names=("launch", "graph", "graph_run", "load", "unload", "read", "write", "sync")):
    self.calls = []
    for name in names:
      def wrap(*a, _f=getattr(runner, name), _n=name, **kw):
        self.calls.append([_n, a, kw, None])
        self.calls[-1][3] = ret = _f(*a, **kw)
        return ret
      monkeypatch.setattr(runner, name, wrap)
  def names(self): return [c[0] for c in self.calls]

def patches_of(call) -> list[tuple]:
  """The (entry, kind, index, handle, value) patches of a recorded graph_run call: given as a list, or packed (body=(bytes, count))."""
  if (body:=call[2].get("body")) is None: return list(call[1][1]) if len(call[1]) > 1 else list(call[2].get("patches", ()))
  data, count = body
  assert len(data) == count * P.PATCH.size, (len(data), count)
  return [(f["entry"], f["kind"], f["index"], f["handle"], f["value"]) for f in (P.PATCH.unpack(data, i * P.PATCH.size) for i in range(count))]

@pytest.fixture
def spy(remote, monkeypatch):
  from tinygrad import Device
  return Spy(monkeypatch, Device[remote].runner)

def both(fn):
  """fn(device) -> Tensor, run on the runner and on the local CPU device; returns (remote, local) as numpy."""
  return fn("REMOTE").numpy(), fn("CPU").numpy()

@pytest.mark.cpu_only
def test_renderer_follows_the_runner(remote):
  # kernels are compiled on this host for the CPU the runner reports in Rhello, never for this host's -march=native
  from tinygrad import Device
  from tinygrad.renderer.cstyle import ClangRenderer
  from client.cpu_image import clang_arch
  dev = Device[remote]
  info, ren = dev.runner.info, dev.renderer
  assert info.backend == "cpu" and type(ren) is ClangRenderer and ren.target.arch == clang_arch(info.arch, info.cpu, info.features)
  assert f"-march={info.cpu}" in ren.compiler.args or f"-mcpu={info.cpu}" in " ".join(ren.compiler.args) or info.arch == "riscv64"
  assert "native" not in ren.target.arch

# *** elementwise over every dtype the CPU renderer supports

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"]
TOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}

def dtype_ops(dev:str, dt, fdt) -> list:
  """Elementwise ops, comparisons, casts and small reductions over 16 values of dtype dt on device dev (floats cast to fdt)."""
  from tinygrad import Tensor, dtypes
  if dt == dtypes.bool: vals = [v % 3 == 1 for v in range(16)]
  elif dtypes.is_float(dt): vals = [v * 0.375 - 2.5 for v in range(16)]
  else: vals = [(v * 7) % 11 - (0 if dtypes.is_unsigned(dt) else 5) for v in range(16)]
  a, b = Tensor(vals, dtype=dt, device=dev), Tensor(vals[::-1], dtype=dt, device=dev)
  out = [a + b, a * b, a.maximum(b), a < b, a == b, (a < b).where(a, b), a.cast(dtypes.float32)]
  if dt != dtypes.bool: out += [a - b, a.minimum(b) * 3, a.max().reshape(1), a.sum(dtype=dt).reshape(1)]
  if dtypes.is_int(dt): out += [a // (b.abs() + 1), a % (b.abs() + 1), a & b, a | b, a ^ b, a << 1]
  if dtypes.is_float(dt): out += [a / (b.abs() + 1), (a.abs() + 1).log(), a.exp(), (a.abs() + 0.5).sqrt(), a.sin(), a.relu(), -a]
  return [t.cast(fdt if dtypes.is_float(dt) else t.dtype) for t in out]

@pytest.mark.cpu_only
@pytest.mark.parametrize("name", DTYPES)
def test_elementwise_dtypes(remote, name):
  from tinygrad import Device, Tensor, dtypes
  dt = getattr(dtypes, name)
  if dt not in Device[remote].renderer.supported_dtypes() & Device["CPU"].renderer.supported_dtypes():
    pytest.skip(f"{name} is not supported by the CPU renderer for this runner")
  def ops(dev): return dtype_ops(dev, dt, dtypes.float64)
  try: want = [t.numpy() for t in ops("CPU")]
  except subprocess.CalledProcessError as e:  # e.g. clang < 15 has no __bf16 on x86: the local CPU device cannot run it either
    pytest.skip(f"{name}: this host's clang cannot compile it for tinygrad's own CPU device either ({' '.join(e.cmd[-6:-3])})")
  got = [t.numpy() for t in ops(remote)]
  for i, (g, w) in enumerate(zip(got, want)):
    if dtypes.is_float(dt): np.testing.assert_allclose(g, w, rtol=TOL[name], atol=TOL[name], err_msg=f"op {i}")
    else: np.testing.assert_array_equal(g, w, err_msg=f"op {i}")

# *** reductions, matmul, conv

@pytest.mark.cpu_only
def test_reductions(remote):
  from tinygrad import Tensor, dtypes
  x = np.random.default_rng(1).normal(size=(4, 5, 37)).astype(np.float32)
  for fn in [lambda t: t.sum(), lambda t: t.sum(axis=1), lambda t: t.max(axis=2), lambda t: t.min(axis=0), lambda t: t.mean(axis=(0, 2)),
             lambda t: t.argmax(axis=2), lambda t: t.cumsum(axis=2), lambda t: t.std(), lambda t: t.softmax(axis=-1),
             lambda t: (t * 100).cast(dtypes.int32).sum(axis=2), lambda t: t.reshape(20, 37).logsumexp(axis=1)]:
    r, c = both(lambda d: fn(Tensor(x, device=d)))
    np.testing.assert_allclose(r, c, rtol=1e-5, atol=1e-5)

@pytest.mark.cpu_only
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (16, 16, 16), (33, 47, 19), (64, 128, 96)])
def test_matmul(remote, m, k, n):
  from tinygrad import Tensor
  rng = np.random.default_rng(m * k * n)
  a, b = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(k, n)).astype(np.float32)
  r, c = both(lambda d: Tensor(a, device=d) @ Tensor(b, device=d))
  np.testing.assert_allclose(r, c, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(r, a @ b, rtol=1e-3, atol=1e-3)

@pytest.mark.cpu_only
def test_int_matmul(remote):
  from tinygrad import Tensor, dtypes
  a, b = np.arange(35).reshape(5, 7) % 9 - 4, np.arange(21).reshape(7, 3) % 5 - 2
  r, _ = both(lambda d: Tensor(a, dtype=dtypes.int32, device=d) @ Tensor(b, dtype=dtypes.int32, device=d))
  np.testing.assert_array_equal(r, a @ b)

@pytest.mark.cpu_only
@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1)])
def test_conv2d(remote, stride, padding):
  from tinygrad import Tensor
  rng = np.random.default_rng(3)
  x, w, b = (rng.normal(size=s).astype(np.float32) for s in [(2, 3, 11, 9), (4, 3, 3, 3), (4,)])
  r, c = both(lambda d: Tensor(x, device=d).conv2d(Tensor(w, device=d), Tensor(b, device=d), stride=stride, padding=padding).relu().max_pool2d())
  np.testing.assert_allclose(r, c, rtol=1e-4, atol=1e-4)

# *** training

def train_losses(device:str, steps:int=12) -> list[float]:
  from tinygrad import Tensor, TinyJit, nn
  from tinygrad.helpers import Context
  rng = np.random.default_rng(7)
  X = rng.normal(size=(64, 8)).astype(np.float32)
  Y = (X[:, 0] * X[:, 1] > 0).astype(np.int32) + 2 * (X[:, 2] > 0).astype(np.int32)
  w1, w2 = rng.normal(size=(8, 32)).astype(np.float32) * 0.3, rng.normal(size=(32, 4)).astype(np.float32) * 0.3
  params = [Tensor(w1, device=device), Tensor.zeros(32, device=device).contiguous(), Tensor(w2, device=device),
            Tensor.zeros(4, device=device).contiguous()]
  opt = nn.optim.Adam(params, lr=0.05, device=device)
  @TinyJit
  def step(x:Tensor, y:Tensor) -> Tensor:
    with Context(TRAINING=1):
      opt.zero_grad()
      loss = ((x @ params[0] + params[1]).relu() @ params[2] + params[3]).sparse_categorical_crossentropy(y).backward()
      return loss.realize(*opt.schedule_step())
  return [step(Tensor(X[i % 2::2], device=device), Tensor(Y[i % 2::2], device=device)).item() for i in range(steps)]

@pytest.mark.cpu_only
def test_mlp_training_step(remote):
  r, c = train_losses(remote), train_losses("CPU")
  np.testing.assert_allclose(r, c, rtol=1e-4, atol=1e-5)
  assert r[-1] < 0.7 * r[0], f"loss did not fall: {r}"

# *** TinyJit: one Tgraph at capture, then one Tgraphrun per call carrying only patches

@pytest.mark.cpu_only
def test_jit_changing_inputs(remote, spy):
  from tinygrad import Tensor, TinyJit
  def fn(x, y): return ((x @ y).contiguous().relu().contiguous().sum(axis=1) + x.max(axis=1)).realize()
  jit, rng = TinyJit(fn), np.random.default_rng(5)
  for i in range(5):
    a, b = rng.normal(size=(16, 16)).astype(np.float32), rng.normal(size=(16, 16)).astype(np.float32)
    x, y = Tensor(a, device=remote).realize(), Tensor(b, device=remote).realize()
    start = len(spy.calls)
    out = jit(x, y)
    sent = spy.names()[start:]
    np.testing.assert_allclose(out.numpy(), fn(Tensor(a, device="CPU"), Tensor(b, device="CPU")).numpy(), rtol=1e-5, atol=1e-5)
    if i >= 1:  # captured (call 1 captures, then runs the graph): the kernels go as one graph request
      run = spy.calls[start + sent.index("graph_run")]
      assert sent.count("graph_run") == 1 and "launch" not in sent, sent
      # the input buffers change every call: the run patches exactly this call's x and y into the kernels that read them
      assert {p[3] for p in patches_of(run) if p[1] == P.PATCH_BUF} == {x.uop.buffer._buf[0], y.uop.buffer._buf[0]}
    if i >= 2: assert not run[2].get("wait") and sent == ["graph_run"], f"a JIT call should be one request that does not wait: {sent}"
  assert len([c for c in spy.calls if c[0] == "graph"]) == 1

@pytest.mark.cpu_only
def test_jit_symbolic_shape(remote, spy):
  from tinygrad import Tensor, TinyJit, Variable
  def fn(x): return ((x * 2).contiguous().sum() + x.max()).realize()
  jit, base = TinyJit(fn), np.random.default_rng(6).normal(size=(40,)).astype(np.float32)
  t = Tensor(base, device=remote).realize()
  for n in [3, 17, 40, 9, 25]:
    got = jit(t[:Variable("n", 1, 40).bind(n)]).item()
    assert got == pytest.approx(float((base[:n] * 2).sum() + base[:n].max()), rel=1e-5, abs=1e-5), n
  runs = [c for c in spy.calls if c[0] == "graph_run"]
  assert [sorted({p[4] for p in patches_of(c) if p[1] == P.PATCH_VAL}) for c in runs] == [[17], [40], [9], [25]]

# *** BEAM and DEBUG=2: device time measured by the runner

@pytest.mark.cpu_only
def test_beam_matmul(remote, spy):
  from tinygrad import Tensor
  from tinygrad.helpers import Context
  rng = np.random.default_rng(8)
  a, b = rng.normal(size=(32, 48)).astype(np.float32), rng.normal(size=(48, 32)).astype(np.float32)
  with Context(BEAM=2, CACHELEVEL=0): out = (Tensor(a, device=remote) @ Tensor(b, device=remote)).numpy()
  np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
  timed = [c for c in spy.calls if c[0] == "launch" and c[2].get("wait")]
  assert len(timed) > 5 and all(isinstance(c[3], float) and c[3] > 0 for c in timed), "BEAM should time candidates on the runner"
  assert len({c[1][0] for c in timed}) > 2, "BEAM should have timed several different programs"

@pytest.mark.cpu_only
def test_debug2_shows_runner_time(remote, spy, capsys):
  from tinygrad import Device, Tensor
  from tinygrad.helpers import Context, time_to_str
  x = Tensor(np.arange(4096, dtype=np.float32).reshape(64, 64), device=remote).realize()
  with Context(DEBUG=2): (x @ x + 1).realize()
  out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
  launches = [c for c in spy.calls if c[0] == "launch"]
  assert launches and all(c[2].get("wait") for c in launches), "DEBUG=2 waits for each kernel to get its time"
  for c in launches:  # each kernel's line shows the time the runner measured (Rlaunch.ns), not a host wall clock
    name = Device[remote].runner._names[c[1][0]]
    line = next(ln for ln in out.splitlines() if ln.startswith("*** REMOTE") and f" {name} " in ln)
    assert f"tm {time_to_str(c[3], w=9)}/" in line, (line, c[3])

# *** programs tinygrad drops are unloaded; the ones a JIT graph uses stay loaded

@pytest.mark.cpu_only
def test_freed_programs_are_unloaded_but_not_a_graphs(remote, spy):
  from tinygrad import Device, Tensor, TinyJit
  from tinygrad.engine.realize import runtime_cache, time_call
  dev, x = Device[remote], Tensor(np.arange(64, dtype=np.float32).reshape(8, 8), device=remote).realize()
  # time_call runs a kernel as BEAM times a candidate: a new uncached Program each run, dropped after it
  timer = time_call((x * 1234.5 + 3).contiguous().schedule_linear().src[-1])
  assert all(next(timer) > 0 for _ in range(3))
  del timer
  gc.collect()
  dev.synchronize()   # sends the pending Tunloads
  loaded, unloaded = [c[1][0] for c in spy.calls if c[0] == "load"], [c[1][0] for c in spy.calls if c[0] == "unload"]
  assert len(loaded) == 3 and sorted(unloaded) == loaded and not set(loaded) & {h for h, _ in dev.programs.values()}, (loaded, unloaded)
  # a TinyJit graph names its programs by handle: they stay loaded while it lives, though nothing else holds them
  @TinyJit
  def f(t:Tensor) -> Tensor: return ((t * 4321.5).contiguous().sum(axis=0) + t.max()).realize()
  want = (np.arange(64, dtype=np.float32).reshape(8, 8) * 4321.5).sum(axis=0) + 63
  for _ in range(3): np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-6)
  progs = {r[0] for c in spy.calls if c[0] == "graph" for r in c[1][1]}
  assert len(progs) >= 2, progs
  for k in [k for k, rt in runtime_cache.items() if getattr(rt, "prog", None) in progs]: del runtime_cache[k]  # only the graph holds them
  gc.collect()
  dev.synchronize()
  assert not progs & {c[1][0] for c in spy.calls if c[0] == "unload"}
  np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-6)   # a graph run of an unloaded program would fail with EHANDLE
  del f
  gc.collect()
  dev.synchronize()
  assert progs <= {c[1][0] for c in spy.calls if c[0] == "unload"}, "the JIT is gone: its programs should be unloaded"

def beam_in_few_handles(device:str, addr:str, n:int=64):
  """BEAM=2 on an n x n x n matmul through the runner at addr (started with --max-handles 16): checks the result, and that the
  search loaded more programs than the runner allows handles and left at most 2 loaded."""
  r = run_python(f"""
import json, numpy as np, client.remote_metal
from tinygrad import Device, Tensor
from tinygrad.helpers import Context
runner, n = Device["{device}"].runner, {{"load": 0, "unload": 0}}
for name in n:
  def count(*a, _f=getattr(runner, name), _n=name, **kw):
    n[_n] += 1
    return _f(*a, **kw)
  setattr(runner, name, count)
a, b = np.random.default_rng(9).normal(size=(2, {n}, {n})).astype(np.float32)
with Context(BEAM=2, CACHELEVEL=0): out = (Tensor(a, device="{device}") @ Tensor(b, device="{device}")).numpy()
Device["{device}"].synchronize()
print(json.dumps({{"err": float(np.abs(out - a @ b).max()), **n}}))""", {"METAL_RUNNER": addr}, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.splitlines()[-1])
  assert out["err"] < 1e-3 and out["load"] > 16 and out["load"] - out["unload"] <= 2, out

@pytest.mark.cpu_only
def test_release_from_a_finalizer_never_lands_inside_a_frame(remote, monkeypatch):
  # Buffer.__del__ (and a graph's, a program's) can run from the garbage collector in the middle of a Runner call that is writing a
  # frame. Simulate that at the worst moment, between a Tlaunch's fixed part and its arguments: the Tfree must wait for a request
  # boundary (it was sent there, and the runner read it as the launch's arguments and ended the session).
  import client.connection as conn
  from tinygrad import Device, Tensor
  from tinygrad.device import BufferSpec
  dev = Device[remote]
  victim, x = dev.allocator._alloc(64, BufferSpec()), Tensor(np.arange(16, dtype=np.float32), device=remote).realize()
  real = conn._args_struct
  def args_struct(nb, nv):
    if victim is not None: dev.allocator._free(victim, BufferSpec())   # "the garbage collector runs here"
    return real(nb, nv)
  monkeypatch.setattr(conn, "_args_struct", args_struct)
  np.testing.assert_allclose((x * 3 + 1).numpy(), np.arange(16) * 3 + 1)
  victim = None
  assert dev.runner._dead is None, dev.runner._dead
  dev.synchronize()   # the Tfree went out at a boundary; a second free of the handle would be EHANDLE here

@pytest.mark.cpu_only
def test_beam_search_fits_in_few_runner_handles(daemon_bin):
  """A BEAM search compiles and times dozens of candidates and drops them. They are unloaded, so it fits in a runner that allows a
  session 16 handles in each namespace; were every candidate kept loaded, the search would hit ELIMIT among the programs."""
  with runner("--max-handles", "16") as (addr, _): beam_in_few_handles("REMOTE", addr)

@pytest.mark.cpu_only
def test_rejected_load_is_not_unloaded(daemon_bin):
  """A program whose Tload failed holds no handle: dropping it sends no Tunload, whose EHANDLE would fail a later request."""
  with runner("--max-handles", "1") as (addr, _):
    r = run_python("""
import gc, client.remote_metal
from tinygrad import Device, Tensor
from tinygrad.device import BufferSpec
from tinygrad.engine.realize import compile_linear
from tinygrad.uop.ops import Ops
from client.connection import RunnerError
dev, al = Device["REMOTE"], Device["REMOTE"].allocator
def program(k):
  prg = next(c.src[0] for c in compile_linear((Tensor.empty(4, device="REMOTE") * k).contiguous().schedule_linear()).src
             if c.src[0].op is Ops.PROGRAM)
  return prg.to_elf(), prg.arg.launch_dims({}), prg.arg.vals({})
(elf, (gs, ls), vals), (elf5, _, _) = program(3), program(5)
buf = al._alloc(16, BufferSpec())
other = dev.runtime(elf5)   # the session's one program handle
other(buf, buf, global_size=gs, local_size=ls, vals=vals, wait=True)
p = dev.runtime(elf)        # no room for a second program
try: p(buf, buf, global_size=gs, local_size=ls, vals=vals, wait=True)
except RunnerError as err: print("load failed", err.code_name, err.request)
del p, other
gc.collect()   # the exception's traceback holds p in a cycle
dev.synchronize()   # unloads the other program; nothing to unload for p: a Tunload would fail with EHANDLE here
print("ran", dev.runtime(elf)(buf, buf, global_size=gs, local_size=ls, vals=vals, wait=True) > 0)""", {"METAL_RUNNER": addr})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "load failed ELIMIT Tload" in r.stdout and "ran True" in r.stdout, r.stdout

# *** devices, several runners, the local runner, failures (fresh processes)

@pytest.mark.cpu_only
def test_device_names_and_mismatch(cpu_runner):
  r = run_python("""
import json, client.remote_metal
from tinygrad import Device, Tensor
out = {"default": Device.DEFAULT, "dev": Tensor([1, 2, 3]).device, "x": (Tensor([1, 2, 3]) * 2).tolist()}
for d in ("REMOTE:1", "METAL"):
  try: Device[d]; out[d] = "opened"
  except Exception as e: out[d] = f"{type(e).__name__}: {e}"
print(json.dumps(out))""", {"METAL_RUNNER": cpu_runner, "DEV": "REMOTE"})
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout.splitlines()[-1])
  assert out["default"] == "REMOTE" and out["dev"] == "REMOTE" and out["x"] == [2, 4, 6]
  assert "has no runner for index 1" in out["REMOTE:1"]
  assert "METAL needs a runner with the metal backend" in out["METAL"] and cpu_runner in out["METAL"] and "use REMOTE" in out["METAL"]

def shard_across(device:str, a0:str, a1:str):
  """Tensor.shard over DEVICE:0 and DEVICE:1, the runners at a0 and a1, against tinygrad's CPU device; both runners run a shard."""
  r = run_python(f"""
import json, numpy as np, client.remote_metal
from tinygrad import Device, Tensor
devs = ("{device}:0", "{device}:1")
x, w = np.arange(64 * 24, dtype=np.float32).reshape(64, 24) / 500, np.linspace(-1, 1, 24 * 8, dtype=np.float32).reshape(24, 8)
def f(dev, shard):
  t, tw = Tensor(x, device=dev[0]), Tensor(w, device=dev[0])
  if shard: t, tw = t.shard(dev, axis=0), tw.shard(dev)
  return ((t @ tw).relu().sum(axis=0) + t.max()).numpy()
sharded, local = f(devs, True), f(("CPU",), False)
print(json.dumps({{"err": float(np.abs(sharded - local).max()), "addrs": [Device[d].runner.addr for d in devs],
                  "kernels": [len(Device[d].runner._names) for d in devs]}}))""", {"METAL_RUNNER": f"{a0},{a1}"})
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.splitlines()[-1])
  assert out["addrs"] == [a0, a1] and min(out["kernels"]) >= 2 and out["err"] < 1e-4, out  # both runners ran their shard

@pytest.mark.cpu_only
def test_shard_across_two_runners(daemon_bin):
  with runner() as (a0, _), runner() as (a1, _): shard_across("REMOTE", a0, a1)

@pytest.mark.cpu_only
def test_local_runner_by_default(daemon_bin):
  r = run_python("""
import json, client.remote_metal as rm
from tinygrad import Device, Tensor
x = (Tensor([1.0, 2.0, 3.0]) * 2).tolist()
print(json.dumps({"x": x, "dev": Device.DEFAULT, "addr": Device["REMOTE"].runner.addr, "pid": rm.local_runners[0].pid}))""",
                 {"DEV": "REMOTE"}, unset=("METAL_RUNNER",))
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout.splitlines()[-1])
  assert out["x"] == [2.0, 4.0, 6.0] and out["dev"] == "REMOTE" and out["addr"].startswith("127.0.0.1:")
  with pytest.raises(ProcessLookupError): os.kill(out["pid"], 0)  # stopped (and reaped) at exit

@pytest.mark.cpu_only
def test_runner_dies_mid_run(own_runner):
  addr, proc = own_runner
  code = """
import sys, client.remote_metal
from tinygrad import Tensor
x = Tensor.rand(256, 256, device="REMOTE").realize()
try:
  for i in range(100000):
    x = (x @ x / 256).contiguous().realize()
    if i == 1: print("ready", x.sum().item() > 0, flush=True)  # compiled and running
  x.numpy()
  print("finished without noticing")
except Exception as e: print("raised", type(e).__name__, str(e).replace(chr(10), " "))
"""
  env = {**{k: v for k, v in os.environ.items() if k not in ("DEV", "DEBUG", "BEAM")}, "METAL_RUNNER": addr, "PYTHONPATH": str(ROOT)}
  p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert select.select([p.stdout], [], [], 120)[0] and p.stdout.readline().strip() == "ready True", "client did not start"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the runner and its session processes, mid-run
    out, err = p.communicate(timeout=60)
  finally:
    if p.poll() is None: p.kill()
  assert out.startswith("raised RunnerConnectionError") and addr in out, (out, err)

# *** Metal path on any host: a fake runner that speaks the protocol records what the client sends

class FakeMetalRunner(threading.Thread):
  """Answers hello as a Metal runner (Metal source only), replies to every waiting request with zeros and records all frames."""
  def __init__(self):
    super().__init__(daemon=True)
    self.server = socket.create_server(("127.0.0.1", 0))
    self.addr, self.frames = f"127.0.0.1:{self.server.getsockname()[1]}", []
  def run(self):
    while True:
      try: conn, _ = self.server.accept()
      except OSError: return
      threading.Thread(target=self.serve, args=(conn,), daemon=True).start()
  def serve(self, conn):
    with conn, conn.makefile("rb") as rf:
      while (frame:=self.recv(rf)) is not None:
        self.frames.append(frame)
        if (reply:=self.reply(frame[0], frame[1])) is not None: conn.sendall(reply)
  @staticmethod
  def recv(rf):
    if len(buf:=rf.read(P.HDR_SIZE)) < P.HDR_SIZE or len(buf:=buf + rf.read(P.HDR.unpack(buf)["size"] - P.HDR_SIZE)) < P.HDR.unpack(buf)["size"]:
      return None
    t, f = P.unpack(buf)
    return t, f, buf[P.MSGS[t].size:]
  @staticmethod
  def reply(t, f):
    tag = f["tag"]
    if t == P.THELLO: return P.pack(P.RHELLO, tag, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG, backend=P.BACKEND_METAL,
                                    caps=P.CAP_METAL_SOURCE | P.CAP_UNIFIED, ncores=1, memory=1 << 30, maxbuf=1 << 30, maxhandles=65536,
                                    name=b"fake Apple GPU", arch=b"Apple9")
    if t == P.TSYNC: return P.pack(P.RSYNC, tag)
    if t == P.TREAD: return P.pack(P.RREAD, tag, 0, f["count"], count=f["count"]) + bytes(f["count"])
    if t in (P.TLAUNCH, P.TGRAPHRUN) and f["flags"] & P.FWAIT: return P.pack(t + 1, tag, ns=1000)
    return None

@pytest.fixture
def fake_metal():
  (fake:=FakeMetalRunner()).start()
  yield fake
  fake.server.close()

def test_metal_sends_metal_source(fake_metal):
  r = run_python("""
import client.remote_metal
from tinygrad import Device, Tensor, TinyJit, Variable
x = Tensor.ones(64, device="METAL").contiguous().realize()
((x * 3 + 1).reshape(8, 8) @ x.reshape(8, 8)).sum().realize()
@TinyJit
def f(t): return ((t * 2).contiguous().sum() + t.max()).realize()
for n in (5, 13, 21, 34, 55): f(x[:Variable("n", 1, 64).bind(n)])
Device["METAL"].synchronize()
print("renderer", type(Device["METAL"].renderer).__name__)
try: Device["REMOTE"]
except RuntimeError as e: print("REMOTE:", e)""", {"METAL_RUNNER": fake_metal.addr, "METAL_RUNNER_SOURCE": "1"})
  assert r.returncode == 0, r.stderr
  assert "renderer MetalRenderer" in r.stdout
  assert "REMOTE needs a runner with the cpu backend" in r.stdout and "has the metal backend (use METAL for it)" in r.stdout
  loads = [(f, data) for t, f, data in fake_metal.frames if t == P.TLOAD]
  assert len(loads) >= 3
  for f, data in loads:
    name, src = data[:f["namelen"]].decode(), data[f["namelen"]:].decode()
    assert f["kind"] == P.PROG_METAL_SOURCE and f["arch"] == P.ARCH_NONE and f["corearg"] == P.NO_CORE and f["datalen"] == len(src)
    assert f"kernel void {name}(" in src and "#include <metal_stdlib>" in src
  # the JIT: one Tgraph, then one Tgraphrun per call, patching the symbolic value and the launch dims it changes
  graphs, runs = [f for t, f, _ in fake_metal.frames if t == P.TGRAPH], [(f, d) for t, f, d in fake_metal.frames if t == P.TGRAPHRUN]
  assert len(graphs) == 1 and len(runs) == 4
  patches = [[P.PATCH.unpack(d, i * P.PATCH.size) for i in range(f["count"])] for f, d in runs]
  assert [sorted({p["value"] for p in ps if p["kind"] == P.PATCH_VAL}) for ps in patches] == [[13], [21], [34], [55]]
  dims = [sorted(p["value"] for p in ps if p["kind"] == P.PATCH_GLOBAL and p["value"] > 1) for ps in patches]
  assert dims[0] != dims[1] != dims[2] != dims[3], dims

@pytest.mark.cpu_only
def test_allocation_over_the_runner_limit_frees_the_cache_and_retries(daemon_bin):
  """Talloc has no reply, so the client checks the limit the runner reported: MemoryError at once lets tinygrad's LRU allocator
  free its cached buffers and retry, and a request that can never fit fails clearly."""
  with runner("--total-mem", "1M") as (addr, _):
    r = run_python("""
import client.remote_metal
from tinygrad import Device
al = Device["REMOTE"].allocator
a = al.alloc(600 << 10); al.free(a, 600 << 10)   # LRUAllocator keeps it cached: still allocated on the runner
b = al.alloc(700 << 10)                          # fits only once the cache is freed
al._copyin(b, memoryview(bytearray(b"x" * (700 << 10))))
out = memoryview(bytearray(700 << 10)); al._copyout(out, b)
print("b", bytes(out[:2]).decode(), len(al.cache[(600 << 10, None)]))
try:
  al.alloc(2 << 20)                              # never fits
  print("no error")
except MemoryError as e: print("MemoryError:", e)
""", env={"METAL_RUNNER": addr, "DEV": "REMOTE"})
  assert r.returncode == 0, r.stderr
  assert "b xx 0" in r.stdout, r.stdout   # the cached 600 KiB buffer was freed to make room
  assert "MemoryError: Allocation of 2.00 MB failed on REMOTE" in r.stdout, r.stdout
