# tinygrad on a Metal runner (device METAL), checked against tinygrad's own CPU device and numpy. On Linux the runner is
# daemon/metal_runner_emu, the daemon on the Metal emulator (tests/metal_emulator, a test harness); with METAL_RUNNER set (a
# Mac's runner) the same tests run on its GPU. Every test reaches the runner: one that cannot be built or reached fails.
import os, re
import numpy as np
import pytest
from conftest import ROOT, metal_runner_proc, needs_own_metal_runner, run_python
from test_tinygrad_remote import DTYPES, TOL, Spy, beam_in_few_handles, dtype_ops, shard_across, train_losses

pytestmark = pytest.mark.metal

@pytest.fixture(scope="module")
def metal(metal_addr):
  saved, os.environ["METAL_RUNNER"] = os.environ.get("METAL_RUNNER"), metal_addr
  try:
    import client.remote_metal  # noqa: F401
    from tinygrad import Device
    dev = Device["METAL"]
    assert dev.runner.addr == metal_addr and dev.runner.info.backend == "metal", "METAL was opened before this module set METAL_RUNNER"
  finally:
    if saved is None: del os.environ["METAL_RUNNER"]
    else: os.environ["METAL_RUNNER"] = saved
  return "METAL"

@pytest.fixture
def spy(metal, monkeypatch):
  from tinygrad import Device
  return Spy(monkeypatch, Device[metal].runner, names=("launch", "graph", "graph_run", "load", "unload", "read", "write", "sync"))

def both(metal, fn):
  return fn(metal).numpy(), fn("CPU").numpy()

def test_renderer_follows_the_runner(metal):
  from tinygrad import Device
  from client.remote_metal import MetalRenderer
  dev = Device[metal]
  assert isinstance(dev.renderer, MetalRenderer) and dev.renderer.target.arch == dev.runner.info.arch

@pytest.mark.parametrize("name", DTYPES)
def test_elementwise_dtypes(metal, name):
  from tinygrad import Device, dtypes
  dt = getattr(dtypes, name)
  if dt not in Device[metal].renderer.supported_dtypes(): pytest.skip(f"MetalRenderer has no {name} for {Device[metal].renderer.target.arch}")
  if dt not in Device["CPU"].renderer.supported_dtypes(): pytest.skip(f"tinygrad's CPU device, the reference, has no {name} here")
  def ops(dev): return dtype_ops(dev, dt, dtypes.float32)   # Metal has no float64
  try: want = [t.numpy() for t in ops("CPU")]
  except Exception as e: pytest.skip(f"{name}: tinygrad's own CPU device cannot run it here either ({type(e).__name__})")
  got = [t.numpy() for t in ops(metal)]
  for i, (g, w) in enumerate(zip(got, want)):
    if dtypes.is_float(dt): np.testing.assert_allclose(g, w, rtol=max(TOL[name], 1e-5), atol=max(TOL[name], 1e-5), err_msg=f"op {i}")
    else: np.testing.assert_array_equal(g, w, err_msg=f"op {i}")

def test_reductions(metal):
  from tinygrad import Tensor, dtypes
  x = np.random.default_rng(1).normal(size=(4, 5, 37)).astype(np.float32)
  for fn in [lambda t: t.sum(), lambda t: t.sum(axis=1), lambda t: t.max(axis=2), lambda t: t.min(axis=0), lambda t: t.mean(axis=(0, 2)),
             lambda t: t.argmax(axis=2), lambda t: t.cumsum(axis=2), lambda t: t.std(), lambda t: t.softmax(axis=-1),
             lambda t: (t * 100).cast(dtypes.int32).sum(axis=2), lambda t: t.reshape(20, 37).logsumexp(axis=1)]:
    r, c = both(metal, lambda d: fn(Tensor(x, device=d)))
    np.testing.assert_allclose(r, c, rtol=1e-5, atol=1e-5)
  big = np.random.default_rng(2).normal(size=(1 << 16,)).astype(np.float32)   # a reduction through threadgroup memory
  assert Tensor(big, device=metal).sum().item() == pytest.approx(float(big.astype(np.float64).sum()), abs=1e-2)

@pytest.mark.parametrize("m,k,n,dt", [(1, 1, 1, "float32"), (16, 16, 16, "float32"), (33, 47, 19, "float32"), (64, 128, 96, "float32"),
                                      (16, 16, 16, "float16"), (64, 64, 64, "float16")])
def test_matmul(metal, spy, m, k, n, dt):
  from tinygrad import Tensor
  rng = np.random.default_rng(m * k * n)
  a, b = rng.normal(size=(m, k)).astype(dt), rng.normal(size=(k, n)).astype(dt)
  r = (Tensor(a, device=metal) @ Tensor(b, device=metal)).numpy()
  tol = 1e-4 if dt == "float32" else 3e-2
  np.testing.assert_allclose(r.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=tol, atol=tol * max(1, k ** 0.5))

def test_tensor_cores(metal, spy):
  # on an Apple7+ family MetalRenderer multiplies 8x8 tiles with simdgroup matrices across the 32 threads of a simdgroup
  from tinygrad import Device, Tensor
  if not Device[metal].renderer.tensor_cores: pytest.skip(f"MetalRenderer has no tensor cores for {Device[metal].renderer.target.arch}")
  rng = np.random.default_rng(4)   # a shape no other test uses: its kernels are loaded here, not found already loaded
  a, b = rng.normal(size=(40, 56)).astype(np.float16), rng.normal(size=(56, 24)).astype(np.float16)
  r = (Tensor(a, device=metal) @ Tensor(b, device=metal)).numpy()
  np.testing.assert_allclose(r.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=3e-2, atol=0.3)
  assert any(b"simdgroup_multiply_accumulate" in bytes(c[1][3]) for c in spy.calls if c[0] == "load"), "no tensor-core kernel ran"

def test_int_matmul(metal):
  from tinygrad import Tensor, dtypes
  a, b = np.arange(35).reshape(5, 7) % 9 - 4, np.arange(21).reshape(7, 3) % 5 - 2
  r = (Tensor(a, dtype=dtypes.int32, device=metal) @ Tensor(b, dtype=dtypes.int32, device=metal)).numpy()
  np.testing.assert_array_equal(r, a @ b)

@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1)])
def test_conv2d(metal, stride, padding):
  from tinygrad import Tensor
  rng = np.random.default_rng(3)
  x, w, b = (rng.normal(size=s).astype(np.float32) for s in [(2, 3, 11, 9), (4, 3, 3, 3), (4,)])
  r, c = both(metal, lambda d: Tensor(x, device=d).conv2d(Tensor(w, device=d), Tensor(b, device=d), stride=stride, padding=padding)
              .relu().max_pool2d())
  np.testing.assert_allclose(r, c, rtol=1e-4, atol=1e-4)

def test_mlp_training_is_one_graph_per_step(metal, spy):
  r, c = train_losses(metal), train_losses("CPU")
  np.testing.assert_allclose(r, c, rtol=1e-4, atol=1e-5)
  assert r[-1] < 0.7 * r[0], f"loss did not fall: {r}"
  runs = [c for c in spy.calls if c[0] == "graph_run"]
  assert len([c for c in spy.calls if c[0] == "graph"]) >= 1 and len(runs) >= 10, "TinyJit should run each step as one runner graph"

def test_jit_symbolic_shape(metal, spy):
  from tinygrad import Tensor, TinyJit, Variable
  def fn(x): return ((x * 2).contiguous().sum() + x.max()).realize()
  jit, base = TinyJit(fn), np.random.default_rng(6).normal(size=(40,)).astype(np.float32)
  t = Tensor(base, device=metal).realize()
  for n in [3, 17, 40, 9, 25]:
    got = jit(t[:Variable("n", 1, 40).bind(n)]).item()
    assert got == pytest.approx(float((base[:n] * 2).sum() + base[:n].max()), rel=1e-5, abs=1e-5), n
  assert len([c for c in spy.calls if c[0] == "graph_run"]) == 4

def test_variable_past_int32(metal, spy):
  # MetalRenderer declares it `constant long&`: bound with 8 bytes (defect a: 4 bytes, or refused above 2**32)
  from tinygrad import Tensor, Variable, dtypes
  t = Tensor([1, 2, 3, 4], dtype=dtypes.int64, device=metal).realize()
  for v in (2**33 + 5, 7, 2**40 - 1):
    assert (t + Variable("big", 1, 2**40).bind(v)).tolist() == [v + 1, v + 2, v + 3, v + 4]
  assert any(b"constant long&" in bytes(c[1][3]) and c[2].get("entry") == 1 for c in spy.calls if c[0] == "load")

def test_beam(metal, spy):
  from tinygrad import Tensor
  from tinygrad.helpers import Context
  a, b = np.random.default_rng(8).normal(size=(2, 32, 32)).astype(np.float32)
  with Context(BEAM=2, CACHELEVEL=0): out = (Tensor(a, device=metal) @ Tensor(b, device=metal)).numpy()
  np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
  timed = [c for c in spy.calls if c[0] == "launch" and c[2].get("wait")]
  assert len(timed) > 5 and all(isinstance(c[3], float) and c[3] > 0 for c in timed), "BEAM should time candidates on the runner"
  assert len({c[1][0] for c in timed}) > 2, "BEAM should have timed several different programs"

def test_debug2_shows_runner_time(metal, spy, capsys):
  from tinygrad import Device, Tensor
  from tinygrad.helpers import Context, time_to_str
  x = Tensor(np.arange(4096, dtype=np.float32).reshape(64, 64), device=metal).realize()
  with Context(DEBUG=2): (x @ x + 1).realize()
  out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
  launches = [c for c in spy.calls if c[0] == "launch"]
  assert launches and all(c[2].get("wait") for c in launches), "DEBUG=2 waits for each kernel to get its time"
  for c in launches:   # each kernel's line shows the time the runner measured (Rlaunch.ns: GPUEndTime - GPUStartTime)
    name = Device[metal].runner._names[c[1][0]]
    line = next(ln for ln in out.splitlines() if ln.startswith("*** METAL") and f" {name} " in ln)
    assert f"tm {time_to_str(c[3], w=9)}/" in line, (line, c[3])

def test_compile_error_reaches_the_user(metal):
  from tinygrad import Device
  from tinygrad.device import TinyELF
  from client.connection import RunnerError
  dev = Device[metal]
  bad = "#include <metal_stdlib>\nusing namespace metal;\nkernel void broken(device float* out) {\n" + \
        "".join(f"  out[{i}] = missing_{i};\n" for i in range(30)) + "}\n"
  prog = dev.runtime(TinyELF(bad.encode(), "broken", dev.renderer.target, ()))
  del prog
  with pytest.raises(RunnerError) as e: dev.synchronize()
  assert e.value.code_name == "EPROGRAM" and "missing_0" in e.value.text and "missing_12" in e.value.text, e.value.text[-400:]

# *** several runners, the example, a dead runner (fresh processes)

def test_shard_across_two_metal_runners(metal_addr):
  needs_own_metal_runner()
  second = metal_runner_proc()
  try: shard_across("METAL", metal_addr, second.addr)
  finally: second.stop()

def test_beam_search_fits_in_few_runner_handles(metal_addr):
  """Defect d on the Metal backend: BEAM's dropped candidates are unloaded, so a search fits a runner allowing 16 handles."""
  needs_own_metal_runner()
  r16 = metal_runner_proc("--max-handles", "16")
  try: beam_in_few_handles("METAL", r16.addr, 32)
  finally: r16.stop()

def test_train_mlp_example(metal_addr):
  r = run_python(f"import runpy, sys; sys.argv = ['train_mlp.py', '--steps', '40']; runpy.run_path({str(ROOT / 'examples' / 'train_mlp.py')!r}, "
                 "run_name='__main__')", {"METAL_RUNNER": metal_addr}, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "METAL" in r.stdout and "loss" in r.stdout, r.stdout[-2000:]
  losses = [float(x) for x in re.findall(r"loss\s+([0-9.]+)", r.stdout)]
  assert len(losses) >= 2 and losses[-1] < losses[0], r.stdout[-2000:]

def test_no_runner_fails(tmp_path):
  # the Metal tests must never pass without reaching a runner: pointed at a dead address, they fail
  r = run_python(f"import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {str(ROOT / 'tests' / 'test_tinygrad_metal.py')!r}, "
                 "'-k', 'test_int_matmul']))", {"METAL_RUNNER": "127.0.0.1:1"}, timeout=300)
  assert r.returncode != 0 and "does not answer" in r.stdout, r.stdout[-2000:]
