#!/usr/bin/env python3
"""mac_report.py: a Mac owner's first run of metal_runner, written as one Markdown file to send back as an issue.

  ./setup.sh && .venv/bin/python tests/mac_report.py        # writes mac_report.md; exits 0 only if everything passed

THIS HAS NEVER RUN ON A MAC. It was written on Linux, where it runs (tests/test_mac_report.py, in ./test.sh) against the Metal
emulator. What it does on macOS (Apple's compiler and GPU, tinygrad's own METAL device, sysctl, sw_vers, system_profiler) has not
been observed: where it breaks there, the report (or the traceback) is the first news of it.

On macOS, in order:
  1. builds the runner: make -C daemon (the Metal backend, daemon/runner.m);
  2. starts it with the Metal backend on 127.0.0.1 (a free port), -v (every failed request in its log) and MTL_DEBUG_LAYER=1 (Apple's
     Metal API Validation);
  3. runs the Metal tests against it: pytest -m metal with METAL_RUNNER naming it and MTL_DEBUG_LAYER=1. The tests that start runners
     with options of their own skip then (tests/conftest.py); they run in a second pass without METAL_RUNNER, their runners inheriting
     MTL_DEBUG_LAYER=1;
  4. runs the computations of CASES in two processes, one after the other, with the same inputs (numpy, fixed seeds): "local" on
     tinygrad's own METAL device, "runner" through the runner (import client.remote_metal, METAL_RUNNER set); compares every output
     bit for bit and gives the largest difference in ULP where they differ;
  5. stops that runner, starts a second one without MTL_DEBUG_LAYER (the validation layer costs time), and times both sides with the
     same code (FIGURES), in two more processes, one after the other;
  6. times the start of a session of a tinygrad.llm-sized model (issue 35, item 2), on two more runners, one with --isolation thread
     and one with the default process isolation (each session a fresh process, which compiles every program again): the Tloads the
     runner process made in "llm decode" (step 4) are sent again by a session of their own, then one waited launch; the time from
     connect to that launch's answer, for the runner's first session and its second. Whether macOS's shader cache (under the runner's
     user's cache directory, docs/service.md) makes a spawned session's compiles fast is what the second spawned session says;
  7. writes the report: the Mac, macOS, the GPU family, macOS and newest Metal language version the runner reports, whether its GPU has
     unified memory, whether the client sent it metallibs or source, what passed, what failed with its output, the figures, the session
     starts, the Tloads and launches the runner refused for their bindings or a misaligned offset (in the tests, and in the
     computations), and what Metal's reflection gave for a few of tinygrad's kernels (the runner logs it at -v: whether Apple's compiler
     lists a parameter the kernel does not use, and marks it unused, decides how strict the runner's Tload check may be; issue 35,
     item 3).
It takes a few minutes on Linux against the emulator at full size (--quick: under a minute); how long on a Mac is not known.

On Linux the same steps run against daemon/metal_runner_emu (make -C daemon emu: the daemon on the Metal emulator, a test harness that
runs kernels on the CPU), with tinygrad's CPU device as the reference in place of tinygrad's METAL and a tolerance per computation in
place of bit equality. The report says so at its top; no figure in it is a GPU figure. --quick makes every shape small and every timing
short (the test uses it); -k EXPR runs only the Metal tests matching EXPR.
"""
from __future__ import annotations
import argparse, datetime, json, os, pathlib, platform, re, shlex, shutil, subprocess, sys, tempfile, time, traceback
import xml.etree.ElementTree as ET
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAC = sys.platform == "darwin"
OWN_RUNNER_SKIP = "METAL_RUNNER names one already running"   # tests/conftest.py needs_own_metal_runner()
SIMDGROUP = "simdgroup_multiply_accumulate"                 # MetalRenderer's tensor cores: 8x8 simdgroup matrices
# the runner's log line for a Tload refused for its bindings or a launch for a misaligned offset (daemon/runner.m, daemon/launch.c)
REFUSAL = re.compile(r"binds \d+ buffers, Tload says|binds no buffer at index|bytes in the kernel, Tload says|is not a multiple of \d+, the size|"
                     r"the runner binds buffers only")

# *** the computations: each returns its named outputs (Tensors, realized together); inputs come from numpy with a fixed seed, so both
# processes compute on the same bytes. tol: (rtol, atol) for floating outputs where bit equality is not expected (Linux: the CPU reference)

def rng(seed:int): return np.random.default_rng(seed)

def c_elementwise(dev:str, quick:bool) -> dict:
  from tinygrad import Tensor, dtypes
  g, n = rng(1), 4096 if quick else 1 << 20
  a, b, c = (Tensor(g.standard_normal(n, dtype=np.float32), device=dev) for _ in range(3))
  i, j = (Tensor(g.integers(0, 1000, n, dtype=np.int32), device=dev) for _ in range(2))
  return {"a*b+c": a * b + c, "relu(a-b)": (a - b).relu(), "max(a,b)": a.maximum(b), "where(a>b,a,c)": (a > b).where(a, c),
          "a/(|b|+1)": a / (b.abs() + 1), "(i*3+j)%7": (i * 3 + j) % 7, "i//(j+1)": i // (j + 1),
          "int32(a*100)": (a * 100).cast(dtypes.int32), "float(i)*0.5": i.cast(dtypes.float32) * 0.5}

def c_transcendental(dev:str, quick:bool) -> dict:
  from tinygrad import Tensor
  g, n = rng(2), 4096 if quick else 1 << 20
  x = Tensor(g.uniform(-10, 10, n).astype(np.float32), device=dev)
  p = Tensor(g.uniform(0.01, 100, n).astype(np.float32), device=dev)
  big = Tensor(g.uniform(-1000, 1000, n).astype(np.float32), device=dev)
  return {"exp(x)": x.exp(), "exp2(x)": x.exp2(), "log(p)": p.log(), "log2(p)": p.log2(), "sqrt(p)": p.sqrt(), "rsqrt(p)": p.rsqrt(),
          "1/p": p.reciprocal(), "sin(x)": x.sin(), "cos(x)": x.cos(), "sin(big)": big.sin(), "tanh(x)": x.tanh(),
          "sigmoid(x)": x.sigmoid(), "p**1.7": p ** 1.7, "gelu(x)": x.gelu(), "erf(x)": x.erf()}

def c_reductions(dev:str, quick:bool) -> dict:
  from tinygrad import Tensor, dtypes
  g = rng(3)
  x = Tensor(g.standard_normal((16, 256) if quick else (256, 4096), dtype=np.float32), device=dev)
  big = Tensor(g.standard_normal(1 << 16 if quick else 1 << 22, dtype=np.float32), device=dev)
  return {"sum(axis=1)": x.sum(axis=1), "max(axis=0)": x.max(axis=0), "mean()": x.mean(), "argmax(axis=1)": x.argmax(axis=1),
          "cumsum(axis=1)": x.cumsum(axis=1), "softmax(axis=1)": x.softmax(axis=1), "logsumexp(axis=1)": x.logsumexp(axis=1),
          "std(axis=0)": x.std(axis=0), "sum(int32(x*100))": (x * 100).cast(dtypes.int32).sum(), "sum(big)": big.sum()}

def matmul(dev:str, quick:bool, dt) -> dict:
  from tinygrad import Tensor, dtypes
  n = 64 if quick else 1024    # multiples of 8: MetalRenderer's tensor cores (8x8x8 simdgroup matrices, Apple7 and later)
  g = rng(4 if dt == "float32" else 5)
  a, b = (Tensor(g.standard_normal((n, n), dtype=np.float32).astype(dt), device=dev) for _ in range(2))
  out = {f"a@b ({dt})": a @ b}
  if dt == "float16": out["a.dot(b, dtype=float32)"] = a.dot(b, dtype=dtypes.float32)
  return out

def c_conv2d(dev:str, quick:bool) -> dict:
  from tinygrad import Tensor
  g = rng(6)
  (bs, cin, hw, cout) = (2, 8, 16, 16) if quick else (8, 64, 64, 128)
  x = Tensor(g.standard_normal((bs, cin, hw, hw), dtype=np.float32), device=dev)
  w = Tensor(g.standard_normal((cout, cin, 3, 3), dtype=np.float32) * 0.1, device=dev)
  b = Tensor(g.standard_normal(cout, dtype=np.float32), device=dev)
  return {"max_pool2d(relu(conv2d(x, w, b, padding=1)))": x.conv2d(w, b, padding=1).relu().max_pool2d(),
          "conv2d(x, w, stride=2, padding=1)": x.conv2d(w, stride=2, padding=1)}

def c_half(dev:str, quick:bool) -> dict:
  from tinygrad import Tensor, dtypes
  g, n = rng(7), 4096 if quick else 1 << 20
  a, b, c = (Tensor(g.standard_normal(n, dtype=np.float32).astype(np.float16), device=dev) for _ in range(3))
  wide = Tensor((g.standard_normal(n) * 3e4).astype(np.float32), device=dev)   # past float16's range: inf; tiny ones: subnormal or 0
  tiny = Tensor((g.standard_normal(n) * 1e-6).astype(np.float32), device=dev)
  return {"a*b+c": a * b + c, "exp(a)": a.exp(), "sqrt(|a|)": a.abs().sqrt(), "sin(a)": a.sin(), "a.sum()": a.sum(),
          "softmax(a.reshape(-1, 64))": a.reshape(-1, 64).softmax(axis=1), "float16(wide)": wide.cast(dtypes.float16),
          "float16(tiny)": tiny.cast(dtypes.float16), "float32(a)*3": a.cast(dtypes.float32) * 3}

STATE: dict = {}   # what the MLP and LLM cases built, for their figures

def mlp_sizes(quick:bool) -> tuple[int, int, int, int]: return (64, 32, 10, 16) if quick else (784, 128, 10, 64)  # in, hidden, out, batch

def c_mlp(dev:str, quick:bool) -> dict:
  """A TinyJit training step (forward, backward, SGD) of a 2-layer MLP, weights and batches from numpy; the losses and final weights."""
  from tinygrad import Tensor, TinyJit, nn, dtypes
  from tinygrad.helpers import Context
  g = rng(8)
  din, dh, dout, bs = mlp_sizes(quick)
  class MLP:
    def __init__(self): self.l1, self.l2 = nn.Linear(din, dh), nn.Linear(dh, dout)
    def __call__(self, x): return self.l2(self.l1(x).relu())
  with Context(TRAINING=1):
    model = MLP()
    for k, p in sorted(nn.state.get_state_dict(model).items()):
      p.replace(Tensor((g.uniform(-1, 1, p.shape) / np.sqrt(p.shape[-1])).astype(np.float32), device=dev))
    params = nn.state.get_parameters(model)
    Tensor.realize(*params)
    opt = nn.optim.SGD(params, lr=0.05)
  xs = [Tensor(g.standard_normal((bs, din), dtype=np.float32), device=dev).realize() for _ in range(4)]
  ys = [Tensor(g.integers(0, dout, bs, dtype=np.int32), dtype=dtypes.int32, device=dev).realize() for _ in range(4)]
  @TinyJit
  def step(x, y):
    with Context(TRAINING=1):
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      opt.step()
      return loss.realize()
  losses = [step(xs[i % 4], ys[i % 4]).item() for i in range(5 if quick else 20)]   # TinyJit captures at the 2nd call, replays from the 3rd
  STATE["mlp"] = (step, xs, ys)
  return {"losses": np.array(losses, dtype=np.float32), **{f"final {k}": v for k, v in sorted(nn.state.get_state_dict(model).items())}}

LLM = {True: dict(num_blocks=1, dim=64, hidden_dim=128, n_heads=2, n_kv_heads=1, head_dim=32, vocab_size=256, max_context=32),
       False: dict(num_blocks=4, dim=256, hidden_dim=768, n_heads=4, n_kv_heads=2, head_dim=64, vocab_size=2048, max_context=128)}
PROMPT = 4

def llm_model(dev:str, quick:bool):
  """tinygrad.llm's Transformer (a small config, float16 weights from numpy as Transformer.from_gguf loads them) whose forward returns the
  last position's logits: its own forward without the sampling step (which, at temperature 0, is the argmax of these logits)."""
  from tinygrad import Tensor, nn
  from client.llm_kernels import install
  install()   # tinygrad 0.14.0's wheel lacks tinygrad/llm/kernels/ (model.py imports it): what it means off AMD GPUs, where it is missing
  from tinygrad.llm.model import Transformer, TransformerConfig
  class Logits(Transformer):
    def forward(self, tokens, start_pos, temperature):
      x = self.token_embd(tokens).float()
      for block in self.blk: x = block(x, start_pos)
      return self.output(self.output_norm(x[:, -1:]))[:, -1, :]
  cfg = LLM[quick]
  model, g = Logits(TransformerConfig(**cfg, norm_eps=1e-5, rope_theta=10000.0, rope_dim=cfg["head_dim"], v_head_dim=cfg["head_dim"])), rng(9)
  for k, p in sorted(nn.state.get_state_dict(model).items()):
    w = g.standard_normal(p.shape, dtype=np.float32) * 0.02 if len(p.shape) > 1 else 1 + 0.1 * g.standard_normal(p.shape, dtype=np.float32)
    p.replace(Tensor(w.astype(np.float16), device=dev))
  Tensor.realize(*nn.state.get_parameters(model))
  return model

def c_llm(dev:str, quick:bool) -> dict:
  """A prefill of PROMPT tokens, then decode steps one token at a time, as Transformer.generate runs them (start_pos a bound variable, the
  rollout TinyJit), each fed the next token of a fixed sequence rather than its own pick, so that a near tie cannot make the two devices'
  sequences diverge; the logits of every step."""
  from tinygrad import Tensor, UOp, dtypes
  cfg = LLM[quick]
  model, mc = llm_model(dev, quick), cfg["max_context"]
  toks = [int(t) for t in rng(10).integers(0, cfg["vocab_size"], mc)]
  v_sp, v_toks = UOp.variable("start_pos", 0, mc - 1), UOp.variable("toks", 1, 32)
  temp = Tensor([0.0], device=dev)
  t = Tensor(toks[:PROMPT] + [0] * (mc - PROMPT), dtype=dtypes.int32, device=dev).reshape(1, mc)
  sp, nt = v_sp.bind(0), v_toks.bind(PROMPT)
  logits = [model(t[:, sp:sp + nt], sp, temp).numpy()]
  def decode(pos:int): return model(Tensor([[toks[pos]]], dtype=dtypes.int32, device=dev), v_sp.bind(pos), temp).numpy()
  logits += [decode(pos) for pos in range(PROMPT, PROMPT + (4 if quick else 16))]
  STATE["llm"] = (decode, PROMPT + len(logits) - 1, mc - 1)
  out = np.concatenate(logits)
  return {"logits": out, "greedy tokens": out.argmax(axis=1).astype(np.int32)}

CASES = [  # name, what, function, (rtol, atol) on Linux
  ("elementwise", "float32 and int32 arithmetic, comparisons, casts", c_elementwise, (1e-6, 1e-6)),
  ("transcendental", "exp, exp2, log, log2, sqrt, rsqrt, 1/x, sin, cos (also of |x| up to 1000), tanh, sigmoid, pow, gelu, erf",
   c_transcendental, (1e-5, 1e-5)),
  ("reductions", "sums, max, mean, argmax, cumsum, softmax, logsumexp, std, an int32 sum, one long sum", c_reductions, (1e-5, 1e-3)),
  ("matmul float32", "square float32 matmul, sides a multiple of 8 (tensor cores: simdgroup matrices)", lambda d, q: matmul(d, q, "float32"),
   (1e-4, 1e-3)),
  ("matmul float16", "square float16 matmul, float16 and float32 accumulation (tensor cores: simdgroup matrices)",
   lambda d, q: matmul(d, q, "float16"), (1e-2, 0.1)),
  ("conv2d", "3x3 convolution, padding 1, bias, relu, 2x2 max pool; and stride 2", c_conv2d, (1e-4, 1e-4)),
  ("half", "float16 arithmetic, exp, sqrt, sin, a sum, softmax; float32 to float16 past its range and below its normals", c_half, (1e-2, 1e-2)),
  ("mlp step", "TinyJit training step of a 2-layer MLP (forward, backward, SGD), the losses and weights after it", c_mlp, (1e-4, 1e-5)),
  ("llm decode", "tinygrad.llm Transformer, random float16 weights: prefill, then decode steps (rollout TinyJit); the logits", c_llm,
   (2e-3, 2e-3)),
]

# *** the figures: the same code in both processes; wall-clock time.perf_counter() in that process

class Kernel:
  """out = a + 1 on one float: the compiled program and its arguments, called as tinygrad's exec_kernel calls it (bench/tg_worker.py)."""
  def __init__(self, dev:str):
    from tinygrad import Tensor
    from tinygrad.engine.realize import compile_linear, get_runtime, resolve_params, run_linear
    from tinygrad.uop.ops import Ops
    self.a = Tensor.ones(1, device=dev).contiguous().realize()
    linear = compile_linear((self.a + 1).schedule_linear())
    call = next(c for c in linear.src if c.src[0].op is Ops.PROGRAM)
    ast, d = call.src[0], call.src[1].device
    self.bufs = [b.buffer.ensure_allocated() for b in (resolve_params(call, ())[i] for i in ast.arg.globals)]
    self.prg, (gs, ls) = get_runtime(d, ast), ast.arg.launch_dims({})
    self.args = [b.get_buf(d) for b in self.bufs]
    self.kw = dict(global_size=tuple(gs), local_size=tuple(ls) if ls is not None else None, vals=tuple(ast.arg.vals({})))
    run_linear(linear)
    self.four = memoryview(bytearray(4))
    assert self.read() == 2.0, f"{dev}: a + 1 gave {self.read()}"
  def launch(self): self.prg(*self.args, **self.kw)
  def read(self) -> float:
    self.bufs[0].allocator._copyout(self.four, self.bufs[0]._buf)
    return self.four.cast("f")[0]

def f_launch(dev:str, quick:bool) -> dict:
  from tinygrad import Device
  k, n = Kernel(dev), 50 if quick else 2000
  Device[dev].synchronize()
  t = time.perf_counter()
  for _ in range(n): k.launch()
  Device[dev].synchronize()
  return {"launch": ((time.perf_counter() - t) / n * 1e6, "µs", f"{n} launches of a 1-float kernel (a + 1), then one synchronize; the total / {n}")}

def f_roundtrip(dev:str, quick:bool) -> dict:
  k, n, ts = Kernel(dev), 20 if quick else 500, []
  for _ in range(n):
    t = time.perf_counter()
    k.launch()
    k.read()
    ts.append(time.perf_counter() - t)
  ts.sort()
  how = f"one launch of that kernel, then its 4-byte output copied out (Allocator._copyout, as .item() does); of {n}"
  return {"launch + 4-byte read": (ts[n // 2] * 1e6, "µs", f"{how}: the median"),
          "launch + 4-byte read, p90": (ts[n * 9 // 10] * 1e6, "µs", f"{how}: the 90th percentile")}

def f_copy(dev:str, quick:bool) -> dict:
  from tinygrad import Device
  from tinygrad.device import Buffer
  from tinygrad.dtype import dtypes
  size, reps = (4 << 20, 3) if quick else (64 << 20, 5)
  buf = Buffer(dev, size, dtypes.uint8).ensure_allocated()
  host = memoryview(bytearray(os.urandom(1 << 20) * (size >> 20)))
  al, tin, tout = buf.allocator, [], []
  al._copyin(buf._buf, host)   # the first touch of the pages on both sides is not measured
  Device[dev].synchronize()
  for _ in range(reps):
    t = time.perf_counter()
    al._copyin(buf._buf, host)
    Device[dev].synchronize()
    tin.append(time.perf_counter() - t)
    t = time.perf_counter()
    al._copyout(host, buf._buf)
    tout.append(time.perf_counter() - t)
  mib = size >> 20
  return {"copy in": (size / sorted(tin)[reps // 2] / 1e9, "GB/s", f"{mib} MiB from host memory into a device buffer (Allocator._copyin, then "
                      f"synchronize); median of {reps}"),
          "copy out": (size / sorted(tout)[reps // 2] / 1e9, "GB/s", f"{mib} MiB from a device buffer into host memory (Allocator._copyout); "
                       f"median of {reps}")}

def f_mlp(dev:str, quick:bool) -> dict:
  step, xs, ys = STATE["mlp"]
  n, t, least = 0, time.perf_counter(), (3, 0.0) if quick else (200, 2.0)
  while n < least[0] or time.perf_counter() - t < least[1]:
    step(xs[n % 4], ys[n % 4]).item()
    n += 1
  din, dh, dout, bs = mlp_sizes(quick)
  return {"MLP training steps": (n / (time.perf_counter() - t), "steps/s", f"the TinyJit step of 'mlp step' ({din}-{dh}-{dout}, batch {bs}), "
                                 f"the loss read (.item()) every step; {n} steps" + ("" if quick else ", at least 2 s"))}

def f_llm(dev:str, quick:bool) -> dict:
  decode, pos, last = STATE["llm"]
  n = min(3 if quick else 64, last - pos)
  t = time.perf_counter()
  for p in range(pos + 1, pos + 1 + n): decode(p)
  cfg = LLM[quick]
  blocks = f"{cfg['num_blocks']} block{'s' if cfg['num_blocks'] != 1 else ''}"
  return {"LLM decode": (n / (time.perf_counter() - t), "tokens/s", f"decode steps of 'llm decode' ({blocks}, dim {cfg['dim']}, vocabulary "
                         f"{cfg['vocab_size']}), each a 4-byte token in and the logits out; {n} steps at positions {pos + 1}..{pos + n}")}

FIGURES = [f_launch, f_roundtrip, f_copy, f_mlp, f_llm]
LOADS = "llm-loads.json"   # the Tloads of "llm decode" on the runner, for the session starts
# the launch that ends a timed session start: one tiny kernel, loaded after the model's
FIRST = ("#include <metal_stdlib>\nusing namespace metal;\n"
         "kernel void mr_first(device int* out, uint3 gid [[threadgroup_position_in_grid]]) { out[0] = 1; }\n")
SETUP = {f_mlp: ("mlp", c_mlp), f_llm: ("llm", c_llm)}   # what a figure uses: the STATE a case leaves

def worker(role:str, part:str, d:pathlib.Path, quick:bool):
  """One side in a process of its own, part "cases" (CASES, outputs to d/ROLE-N.npz) or "figures" (FIGURES, after building what the MLP
  and LLM figures use, untimed); writes d/ROLE-PART.json."""
  if role == "runner": import client.remote_metal  # noqa: F401  # METAL: the runner named by METAL_RUNNER
  from importlib.metadata import version
  from tinygrad import Device, Tensor
  dev = "METAL" if role == "runner" or MAC else "CPU"
  device = Device[dev]
  res: dict = {"role": role, "device": dev, "arch": str(device.renderer.target.arch), "renderer": type(device.renderer).__name__,
               "tinygrad": version("tinygrad"), "python": platform.python_version(), "cases": {}, "figures": {}}
  if role == "runner":
    from client.protocol import PROG_METALLIB
    res["runner"] = {"addr": device.runner.addr, "name": device.runner.info.name, "arch": device.runner.info.arch,
                     "sends": "metallibs" if device.kind == PROG_METALLIB else "Metal source", "host_macos": platform.mac_ver()[0]}
  loads: list = []   # the runner process's Tloads (RemoteDevice.load's arguments), for the session starts (Run.sessions)
  if role == "runner" and part == "cases":
    orig = device.load
    def load(*a):
      loads.append(a)
      return orig(*a)
    device.load = load
  from tinygrad.codegen import to_program_cache
  from tinygrad.uop.ops import Ops
  def sources(keys) -> list[str]:   # the kernels compiled for this device since keys (tinygrad may render them in a pool of processes)
    return [u.arg for k, p in list(to_program_cache.items()) if k not in keys and k[1] is type(device.renderer)
            for u in p.src if u.op is Ops.SOURCE]
  for i, (name, _, fn, _) in enumerate(CASES if part == "cases" else []):
    keys, t, mark = set(to_program_cache), time.perf_counter(), len(loads)
    try:
      outs = fn(dev, quick)
      if tensors:=[v for v in outs.values() if isinstance(v, Tensor)]: Tensor.realize(*tensors)
      arrs = {k: v.numpy() if isinstance(v, Tensor) else v for k, v in outs.items()}
      device.synchronize()
      np.savez(d / f"{role}-{i}.npz", **{f"o{j}": a for j, a in enumerate(arrs.values())})
      srcs = sources(keys)
      res["cases"][name] = {"outputs": list(arrs), "seconds": time.perf_counter() - t, "kernels": len(srcs),
                            "simdgroup": sum(SIMDGROUP in s for s in srcs)}
      if fn is c_llm and loads[mark:]:   # kind, name, data, nbufs, nvals, corearg, entry, arch
        (d / LOADS).write_text(json.dumps([[k, nm, bytes(data).hex(), *rest] for k, nm, data, *rest in loads[mark:]]))
    except Exception:
      res["cases"][name] = {"error": trim(traceback.format_exc(), 60)}
  for fig in FIGURES if part == "figures" else []:
    try:
      if fig in SETUP and SETUP[fig][0] not in STATE: SETUP[fig][1](dev, quick)   # the model and its TinyJit, untimed
      res["figures"].update(fig(dev, quick))
    except Exception: res["figures"][fig.__name__[2:]] = {"error": trim(traceback.format_exc(), 30)}
  (d / f"{role}-{part}.json").write_text(json.dumps(res))

# *** comparing outputs

def ordered(x):
  """Floats as integers in the order of their values (-0.0 and 0.0 both 0), so that the difference of two is their distance in ULP."""
  it = {2: np.int16, 4: np.int32, 8: np.int64}[x.dtype.itemsize]
  i = x.view(it).astype(np.int64)
  return np.where(i < 0, np.int64(np.iinfo(it).min) - i, i)

def compare(got, ref, rtol:float, atol:float) -> dict:
  """got (the runner's) against ref: bit identity, elements that differ, the largest difference in ULP (floats) or value (integers), and
  whether they agree within rtol/atol (floats; integers must be equal)."""
  r = {"dtype": str(ref.dtype), "shape": list(ref.shape), "n": int(ref.size)}
  if got.shape != ref.shape or got.dtype != ref.dtype:
    return {**r, "identical": False, "close": False, "ndiff": int(ref.size), "why": f"the runner gave {got.dtype}{list(got.shape)}"}
  got, ref = got.reshape(-1), ref.reshape(-1)
  diff = (got.view(np.uint8).reshape(got.size, -1) != ref.view(np.uint8).reshape(ref.size, -1)).any(axis=1) if ref.size else np.zeros(0, bool)
  r.update(identical=not diff.any(), ndiff=int(diff.sum()))
  if np.issubdtype(ref.dtype, np.floating):
    gn, rn = np.isnan(got), np.isnan(ref)
    both = ~gn & ~rn
    r["nan_mismatch"] = int((gn != rn).sum())
    r["max_ulp"] = int(np.abs(ordered(got[both]) - ordered(ref[both])).max()) if both.any() else 0
    g64, r64 = got[both].astype(np.float64), ref[both].astype(np.float64)
    with np.errstate(invalid="ignore"):   # inf - inf
      r["max_abs"] = float(np.nan_to_num(np.abs(g64 - r64), nan=0.0).max()) if both.any() else 0.0
    r["close"] = r["nan_mismatch"] == 0 and bool(np.allclose(g64, r64, rtol=rtol, atol=atol))
  else:
    r["max_abs"] = int(np.abs(got.astype(np.int64) - ref.astype(np.int64)).max()) if ref.size else 0
    r["close"] = r["identical"]
  return r

# *** the run: facts, build, runner, tests, workers, report

def trim(text:str, lines:int=40, width:int=300) -> str:
  ls = [ln if len(ln) <= width else ln[:width] + " [...]" for ln in text.rstrip().splitlines()]
  return "\n".join(ls if len(ls) <= lines else ls[:lines // 4] + [f"[... {len(ls) - lines} lines left out ...]"] + ls[-(lines - lines // 4):])

def sh(*cmd:str, timeout:float=60) -> str|None:
  try: r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  except (OSError, subprocess.TimeoutExpired): return None
  return r.stdout.strip() if r.returncode == 0 else None

def machine() -> list[tuple[str, str, str]]:
  """(what, value, where it came from)."""
  rows = []
  def add(what, value, src): rows.append((what, value if value else "(not available)", src))
  if MAC:
    add("Mac model", sh("sysctl", "-n", "hw.model"), "`sysctl -n hw.model`")
    add("chip", sh("sysctl", "-n", "machdep.cpu.brand_string"), "`sysctl -n machdep.cpu.brand_string`")
    mem = sh("sysctl", "-n", "hw.memsize")
    add("memory", f"{int(mem) / 2**30:.0f} GiB" if mem and mem.isdigit() else None, "`sysctl -n hw.memsize`")
    ver, build = sh("sw_vers", "-productVersion"), sh("sw_vers", "-buildVersion")
    add("macOS", ver and ver + (f" ({build})" if build else ""), "`sw_vers -productVersion`, `sw_vers -buildVersion`")
    add("SDK", sh("xcrun", "--show-sdk-version"), "`xcrun --show-sdk-version`")
    sp = sh("system_profiler", "SPDisplaysDataType", timeout=120) or ""
    gpu = "; ".join(ln.strip() for ln in sp.splitlines() if ln.strip().split(":")[0] in ("Chipset Model", "Total Number of Cores", "Metal Support"))
    add("GPU", gpu, "`system_profiler SPDisplaysDataType` (Chipset Model, Total Number of Cores, Metal Support)")
  else:
    add("Mac model", "none: this is not a Mac", "`sys.platform`")
    osr = pathlib.Path("/etc/os-release").read_text() if pathlib.Path("/etc/os-release").exists() else ""
    add("OS", " ".join(filter(None, [(re.search(r'^PRETTY_NAME="?([^"\n]*)', osr, re.M) or [None, None])[1], sh("uname", "-srm")])),
        "`/etc/os-release`, `uname -srm`")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), None) \
      if os.path.exists("/proc/cpuinfo") else None
    add("CPU", f"{cpu}, {os.cpu_count()} logical CPUs" if cpu else None, "`/proc/cpuinfo`, `os.cpu_count()`")
  add("machine", platform.machine(), "`platform.machine()`")
  add("compiler", (sh("cc", "--version") or "").split("\n")[0], "`cc --version`")
  add("Python", platform.python_version(), "`platform.python_version()`")
  head, dirty = sh("git", "-C", str(ROOT), "rev-parse", "HEAD"), sh("git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no")
  add("metal_runner commit", head and head[:12] + (" with local changes" if dirty else ""), "`git rev-parse HEAD`, `git status`")
  return rows

class Run:
  def __init__(self, args):
    self.args, self.quick, self.t0 = args, args.quick, time.perf_counter()
    self.dir = pathlib.Path(tempfile.mkdtemp(prefix="mac_report."))
    self.runner, self.bin, self.logs = None, ROOT / "daemon" / ("metal_runner" if MAC else "metal_runner_emu"), []
    self.addr = self.fig_addr = None   # the runners' addresses: the first (validation layer on), the figures' (off)
    self.runner_events: list[str] = []   # the runner ended early, was started again
    self.crash: str|None = None          # this script's own failure, reported as such
    self.cases_mark: tuple[list, int]|None = None   # the first runner's log, and its length when the computations started
    self.starts: dict|None = None   # the session starts (sessions)

  def step(self, what:str): print(f"mac_report: {what} ({time.perf_counter() - self.t0:.0f} s)", file=sys.stderr, flush=True)

  def build(self) -> dict:
    cmd = ["make", "-C", "daemon", *([] if MAC else ["emu"])]
    t = time.perf_counter()
    try: r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    except (OSError, subprocess.TimeoutExpired) as e: return {"cmd": " ".join(cmd), "ok": False, "output": str(e), "seconds": time.perf_counter() - t}
    return {"cmd": " ".join(cmd), "ok": r.returncode == 0 and self.bin.exists(), "seconds": time.perf_counter() - t,
            "output": trim(r.stdout + r.stderr, 60), "exit": r.returncode}

  def start_runner(self, validate:bool):
    """A Metal runner on 127.0.0.1, with Metal's validation layer (for the tests and computations) or without (for the figures: the layer
    costs time). MTL_DEBUG_LAYER is taken out of this process's environment at start, so without means unset."""
    sys.path.insert(0, str(ROOT / "tests"))
    from runner_proc import RunnerProc
    self.validate = validate
    # -v: the log has every failed request, so the report can count binding and alignment refusals (Report.refusals)
    self.runner = RunnerProc("--backend", "metal", "-v", binary=self.bin, env={"MTL_DEBUG_LAYER": "1"} if validate else None)
    self.logs.append((self.runner.log, validate))

  def ensure_runner(self, before:str):
    """The runner is alive before each step: one that ended (a Metal validation failure stops the process) is reported, started again."""
    if self.runner.alive(): return
    code = self.runner.proc.returncode
    self.runner_events.append(f"the runner on {self.runner.addr} had ended (exit status {code}{', signal ' + str(-code) if code < 0 else ''}) "
                              f"before {before}; a new one was started")
    self.start_runner(self.validate)

  def hello(self) -> dict:
    from client.connection import Runner
    with Runner(self.runner.addr) as r:
      i = r.info
      return {"backend": i.backend, "name": i.name, "arch": i.arch, "memory": i.memory, "maxbuf": i.maxbuf, "ncores": i.ncores,
              "caps": i.caps, "macos": i.cpu, "language": i.features}

  def pytest(self, tag:str, args:list[str], env:dict) -> dict:
    xml = self.dir / f"junit-{tag}.xml"
    # tests/test_mac_report.py runs this script: not from here
    cmd = [sys.executable, "-m", "pytest", "-m", "metal", "-q", "-rs", "-p", "no:cacheprovider", "--ignore=tests/test_mac_report.py",
           f"--junitxml={xml}", *args]
    full = {k: v for k, v in os.environ.items() if k not in ("METAL_RUNNER", "DEV", "DEBUG", "BEAM")}
    full.update(env, MTL_DEBUG_LAYER="1")
    t = time.perf_counter()
    try:
      r = subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=self.args.test_timeout)
      out, status = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
      out, status = f"{as_text(e.stdout)}{as_text(e.stderr)}\npytest did not finish in {self.args.test_timeout} s", None
    shown = shlex.join(["pytest", *cmd[3:]]).replace(str(xml), "JUNIT.xml")
    envs = " ".join(f"{k}={v}" for k, v in {**env, "MTL_DEBUG_LAYER": "1"}.items())
    return {"cmd": f"{envs} {shown}", "exit": status, "seconds": time.perf_counter() - t, "output": out, "cases": junit(xml)}

  def tests(self) -> dict:
    sel = ["-k", self.args.k] if self.args.k else []
    first = self.pytest("runner", [*sel, "tests"], {"METAL_RUNNER": self.runner.addr})
    own = [c["id"] for c in first["cases"] if c["outcome"] == "skipped" and OWN_RUNNER_SKIP in c["message"]]
    second = self.pytest("own", own, {}) if own else None
    return {"first": first, "second": second}

  def workers(self, part:str, res:dict):
    """Both sides' processes for part (cases, figures), one after the other; their results merged into res[role]."""
    for role in ("local", "runner"):
      if role == "runner": self.ensure_runner(f"the runner's {part}")
      env = {k: v for k, v in os.environ.items() if k not in ("METAL_RUNNER", "DEV", "DEBUG", "BEAM", "JIT")}
      env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]), DEV="METAL" if role == "runner" or MAC else "CPU")
      if role == "runner": env["METAL_RUNNER"] = self.runner.addr
      cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", role, part, "--dir", str(self.dir)] + \
            (["--quick"] if self.quick else [])
      self.step(f"{part}: {role}")
      t = time.perf_counter()
      try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=self.args.worker_timeout)
        out, status = r.stdout + r.stderr, r.returncode
      except subprocess.TimeoutExpired as e:
        out, status = as_text(e.stdout) + as_text(e.stderr), f"none: it did not finish in {self.args.worker_timeout} s"
      js, mine = self.dir / f"{role}-{part}.json", res.setdefault(role, {"cases": {}, "figures": {}})
      got = json.loads(js.read_text()) if js.exists() else {"error": f"exit status {status}\n{trim(out, 60)}"}
      mine.update({k: v for k, v in got.items() if k not in ("cases", "figures", "error")})
      mine[part] = got.get(part, {})
      if "error" in got: mine.setdefault("errors", {})[part] = (got["error"], out)

  def session_start(self, addr:str, loads:list) -> float:
    """One session: connect, the model's Tloads, a buffer and one waited launch of FIRST; seconds from connect to its answer."""
    from client.connection import Runner
    from client import protocol as P
    t = time.perf_counter()
    with Runner(addr) as r:
      for i, (kind, name, data, nbufs, nvals, corearg, entry, arch) in enumerate(loads):
        r.load(i + 1, kind, name, bytes.fromhex(data), nbufs, nvals, corearg=corearg, entry=entry, arch=arch)
      r.alloc(1, 16)
      r.load(len(loads) + 1, P.PROG_METAL_SOURCE, "mr_first", FIRST.encode(), 1, 0)
      r.launch(len(loads) + 1, [(1, 0)], [], wait=True)
      return time.perf_counter() - t

  def sessions(self) -> dict:
    """The start of a first and a second session of the llm case's kernels, on a runner with --isolation thread and on one with the
    default process isolation (spawned sessions), each started for this alone, without MTL_DEBUG_LAYER."""
    from runner_proc import RunnerProc
    js = self.dir / LOADS
    if not js.exists(): return {"error": "the runner process of the computations recorded no Tloads for 'llm decode' (its error is above)"}
    loads, out = json.loads(js.read_text()), {"kernels": 0, "modes": {}}
    out["kernels"] = len(loads)
    from client import protocol as P
    out["kind"] = "metallibs" if loads and loads[0][0] == P.PROG_METALLIB else "Metal source"
    for mode, args in (("thread", ["--isolation", "thread"]), ("process", [])):
      self.step(f"session starts: {mode} isolation")
      r = RunnerProc("--backend", "metal", *args, binary=self.bin)
      try: out["modes"][mode] = [self.session_start(r.addr, loads) for _ in range(2)]
      except Exception: out["modes"][mode] = {"error": trim(traceback.format_exc(), 30) + "\n" + trim(r.log_text(), 20)}
      finally: r.stop()
    return out

  def compare(self, w:dict) -> list[dict]:
    rows = []
    for i, (name, what, _, (rtol, atol)) in enumerate(CASES):
      row = {"name": name, "what": what, "rtol": rtol, "atol": atol}
      sides = {role: w[role]["cases"].get(name, {"error": "no result: its process failed (below)"}) for role in ("local", "runner")}
      row.update(sides)
      row["ok"] = False
      if not any("error" in s for s in sides.values()):
        try:
          with np.load(self.dir / f"local-{i}.npz") as lz, np.load(self.dir / f"runner-{i}.npz") as rz:
            row["outputs"] = [{"name": o, **compare(rz[f"o{j}"], lz[f"o{j}"], rtol, atol)} for j, o in enumerate(sides["local"]["outputs"])]
          row["ok"] = all(o["identical"] if MAC else o["close"] for o in row["outputs"])
        except Exception: row["runner"] = {"error": "comparing the outputs failed:\n" + trim(traceback.format_exc(), 30)}
      rows.append(row)
    return rows

  def go(self) -> int:
    facts, build, hello, tests, work, rows = [], {"cmd": "make", "ok": False, "output": "not run", "seconds": 0}, None, None, {}, []
    try:
      facts = machine()
      self.step("building the runner")
      build = self.build()
      if build["ok"]:
        self.step(f"starting {self.bin.name}")
        try:
          self.start_runner(validate=True)
          self.addr, hello = self.runner.addr, self.hello()
        except Exception as e: build.update(ok=False, output=f"{build['output']}\n\nthe runner did not start or answer: {e}")
      if build["ok"]:
        self.step("the Metal tests (pytest -m metal)")
        tests = self.tests()
        self.ensure_runner("the computations")
        self.cases_mark = (self.runner.log, len(self.runner.log))
        self.workers("cases", work)
        rows = self.compare(work)
        self.ensure_runner("the figures' runner started")
        self.runner.stop()
        self.runner.log_text()
        self.step(f"starting {self.bin.name} without MTL_DEBUG_LAYER for the figures")
        self.start_runner(validate=False)
        self.fig_addr = self.runner.addr
        self.workers("figures", work)
        self.ensure_runner("the end")
        self.starts = self.sessions()
    except Exception: self.crash = trim(traceback.format_exc(), 60)
    finally:
      if self.runner is not None:
        self.runner.stop()
        self.runner.log_text()   # waits a moment for the last lines of its log
    try: report = Report(self, facts, build, hello, tests, work, rows).text()
    except Exception:   # a report of the failure, rather than none
      self.crash = (self.crash or "") + "\n\nwriting the report failed:\n" + trim(traceback.format_exc(), 60)
      report = f"# metal_runner: first-run report\n\nThis script (tests/mac_report.py) failed:\n\n{code(self.crash)}\n"
    out = pathlib.Path(self.args.out)
    out.write_text(report)
    self.step(f"wrote {out}")
    return 0 if build["ok"] and tests_ok(tests) and rows and all(r["ok"] for r in rows) and not self.runner_events and not self.crash else 1

def junit(xml:pathlib.Path) -> list[dict]:
  """pytest's JUnit XML as [{id, outcome, message, text, seconds}]; id is the node id pytest takes on its command line."""
  if not xml.exists(): return []
  cases = []
  for tc in ET.parse(xml).getroot().iter("testcase"):
    parts, name = tc.get("classname", "").split("."), tc.get("name", "")
    nodeid = f"{tc.get('classname')}::{name}"
    for k in range(len(parts), 0, -1):   # tests.conformance.test_x.TestY -> tests/conformance/test_x.py::TestY::name
      if (ROOT / ("/".join(parts[:k]) + ".py")).exists():
        nodeid = "::".join(["/".join(parts[:k]) + ".py", *parts[k:], name])
        break
    outcome, message, text = "passed", "", ""
    for child in tc:
      if child.tag in ("failure", "error", "skipped"):
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
        message, text = child.get("message", ""), child.text or ""
        break
    cases.append({"id": nodeid, "outcome": outcome, "message": message, "text": text, "seconds": float(tc.get("time", 0))})
  return cases

def merged(tests:dict) -> list[dict]:
  """The first pass's cases, those it skipped for wanting their own runner replaced by the second pass's result."""
  second = {c["id"]: {**c, "pass": 2} for c in (tests["second"]["cases"] if tests["second"] else [])}
  return [second.get(c["id"], {**c, "pass": 1}) for c in tests["first"]["cases"]]

def tests_ok(tests:dict|None) -> bool:
  if tests is None: return False
  passes = [p for p in (tests["first"], tests["second"]) if p]
  cases = merged(tests)
  return bool(cases) and all(p["exit"] in (0, 5) for p in passes) and not any(c["outcome"] in ("failed", "error") for c in cases)

def count(cases:list[dict]) -> str:
  n = {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "error", "skipped")}
  return ", ".join(f"{v} {k}" for k, v in n.items() if v or k in ("passed", "failed"))

def as_text(b) -> str: return b.decode(errors="replace") if isinstance(b, bytes) else b or ""   # TimeoutExpired keeps bytes

def cell(v) -> str: return str(v).replace("|", "\\|")   # inside a Markdown table, code spans too

def num(v) -> str: return f"{v:.3g}" if isinstance(v, float) else str(v)

def fmt(v:float) -> str: return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"

def code(text:str) -> str:
  fence = "````" if "```" in text else "```"
  return f"{fence}\n{text.rstrip()}\n{fence}"

class Report:
  def __init__(self, run:Run, facts, build, hello, tests, work, rows):
    self.run, self.facts, self.build, self.hello, self.tests, self.work, self.rows = run, facts, build, hello, tests, work, rows
    self.lines: list[str] = []

  def add(self, *ls:str): self.lines.extend(ls)

  def text(self) -> str:
    run, now = self.run, datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    self.add("# metal_runner: first-run report" + ("" if MAC else " (Linux, Metal emulator)"), "")
    if not MAC:
      self.add("> **Not a Mac, not a GPU.** This report was made on Linux: the runner is `daemon/metal_runner_emu`, the daemon on the **Metal "
               "emulator** (`tests/metal_emulator/`, a test harness that compiles Metal kernels as C++ with clang and runs them on this machine's "
               "CPU), and the reference is **tinygrad's CPU device**, not tinygrad's METAL. Outputs are compared within a tolerance, not bit "
               "for bit. **No figure in this report is a GPU figure**; the ratios compare the emulator with tinygrad's CPU device, nothing "
               "about Metal.", "")
    else:
      self.add("> Made by `tests/mac_report.py` on this Mac. The script was written on Linux and had never run on a Mac before: if something "
               "below looks wrong, the script may be what is wrong.", "")
    cmd = shlex.join(["tests/mac_report.py", *sys.argv[1:]]) if sys.argv[0].endswith("mac_report.py") else "tests/mac_report.py"
    self.add(f"Written by `{cmd}` on {now}, in {time.perf_counter() - run.t0:.0f} s. Result: **{self.verdict()}**.", "")
    if self.run.crash:
      self.add("## This script failed", "", "What would have come after the failure is missing from this report:", "", code(self.run.crash), "")
    self.machine()
    self.build_section()
    self.tests_section()
    self.computations()
    self.figures()
    self.session_starts()
    self.runner_log()
    self.add("## Sending this back", "",
             "Open an issue at the project with this file as its text (it is Markdown), or attach it. It holds no secrets: the machine "
             "facts above, test names and outputs, and the runner's log.", "")
    return "\n".join(self.lines) + "\n"

  def verdict(self) -> str:
    if self.run.crash: return "this script failed (see below)"
    if not self.build["ok"]: return "the runner did not build or start"
    t = merged(self.tests)
    ok = sum(r["ok"] for r in self.rows)
    how = "bit-identical" if MAC else "within tolerance"
    return f"Metal tests {count(t)}; computations {ok} of {len(self.rows)} {how}" + ("; the runner ended early" if self.run.runner_events else "")

  def machine(self):
    self.add("## Machine", "", "| | | where it came from |", "|---|---|---|")
    for what, value, src in self.facts: self.add(f"| {what} | {cell(value)} | {src} |")
    if self.hello:
      from client.protocol import CAP_METAL_SOURCE, CAP_UNIFIED
      h = self.hello
      self.add(f"| GPU family | {h['arch']} | the runner's Rhello arch: the newest Apple GPU family the device supports (Apple10 ... Apple1), "
               "else Mac2 (`daemon/runner.m`) |",
               f"| runner device | {h['name']} | the runner's Rhello name |",
               f"| runner memory | {h['memory'] / 2**30:.2f} GiB, buffers up to {h['maxbuf'] / 2**30:.2f} GiB | the runner's Rhello memory, maxbuf |",
               "| Metal source | " + ("compiles on the runner: it offers source (CAP_METAL_SOURCE)" if h["caps"] & CAP_METAL_SOURCE else
                                     "**does not compile on the runner** (Apple's compiler service out of reach?): it offers metallibs only; "
                                     "the runner log below says why") +
               " | the runner compiles a one-line kernel when it opens the GPU (issue 26, item 2; docs/service.md) |",
               f"| runner macOS | {h['macos'] or '(not reported)'}, newest Metal language {h['language'] or '(not reported)'} | the runner's "
               "Rhello cpu and features (`NSProcessInfo` operatingSystemVersion; Apple's language version table) |",
               "| unified memory | " + ("yes: buffers are Shared (CAP_UNIFIED)" if h["caps"] & CAP_UNIFIED else
                                       "**no**: buffers are Managed, synchronized by the runner (no CAP_UNIFIED)") +
               " | the runner's Rhello caps: Metal's `hasUnifiedMemory` (issue 26, item 5) |")
      if (r:=(self.work or {}).get("runner", {}).get("runner")) is not None:
        self.add(f"| programs sent | {r['sends']}, by a client on macOS {r['host_macos'] or '(none: not a Mac)'} | the runner process's "
                 "choice (`client/remote_metal.py` metal_kind): metallibs only to a runner whose macOS is at least the client's; "
                 "source, compiled at the runner's language version, otherwise (issue 26, item 1) |")
    w = self.work or {}
    for role in ("local", "runner"):
      if "arch" in w.get(role, {}):
        x = w[role]
        what = "reference" if not MAC and role == "local" else role
        self.add(f"| tinygrad, {what} | {x['device']}: {x['renderer']}, arch {x['arch']}; tinygrad {x['tinygrad']} | the {role} process: "
                 f"`Device[{x['device']!r}].renderer` |")
    self.add("")

  def build_section(self):
    b = self.build
    self.add("## Build", "", f"`{b['cmd']}`: {'ok' if b['ok'] else '**FAILED**'} in {b['seconds']:.1f} s.", "")
    if not b["ok"]: self.add(code(b["output"]), "")

  def tests_section(self):
    if self.tests is None: return
    first, second = self.tests["first"], self.tests["second"]
    cases = merged(self.tests)
    self.add("## Metal tests", "", f"`{first['cmd']}` (exit status {first['exit']}, {first['seconds']:.0f} s)")
    if second:
      self.add(f"then, for the tests that start runners with options of their own (they skip while METAL_RUNNER names one), `{second['cmd']}` "
               f"(exit status {second['exit']}, {second['seconds']:.0f} s)")
    self.add("", f"**{count(cases)}**" + (f" (of them, {sum(c['pass'] == 2 for c in cases)} in the second pass)" if second else "") + ".", "")
    if cases:
      self.add("| test file | passed | failed | skipped |", "|---|---|---|---|")
      files: dict[str, dict[str, int]] = {}
      for c in cases:
        f = files.setdefault(c["id"].split("::")[0], {"passed": 0, "failed": 0, "skipped": 0})
        f["failed" if c["outcome"] == "error" else c["outcome"]] += 1
      for f, n in files.items(): self.add(f"| `{f}` | {n['passed']} | {n['failed']} | {n['skipped']} |")
      self.add("")
    bad = [c for c in cases if c["outcome"] in ("failed", "error")]
    if not cases or any(p and p["exit"] not in (0, 1, 5) for p in (first, second)):
      for p in filter(None, (first, second)): self.add("pytest's output:", "", code(trim(p["output"], 80)), "")
    if bad:
      self.add("### Failed", "")
      for c in bad[:40]: self.add(f"- `{c['id']}` ({c['outcome']}): {trim(c['message'], 1, 200)}", "", code(trim(c["text"], 40)), "")
      if len(bad) > 40: self.add(f"and {len(bad) - 40} more: " + ", ".join(f"`{c['id']}`" for c in bad[40:]), "")
    skipped = [c for c in cases if c["outcome"] == "skipped"]
    if skipped:
      self.add("### Skipped", "", "| reason | tests |", "|---|---|")
      by: dict[str, list[str]] = {}
      for c in skipped: by.setdefault(re.sub(r"^Skipped: ", "", c["message"]), []).append(c["id"].split("::")[-1])
      for why, ids in by.items(): self.add(f"| {cell(trim(why, 1, 200))} | {len(ids)}: {cell(', '.join(ids[:6]))}{' ...' if len(ids) > 6 else ''} |")
      self.add("")

  def computations(self):
    if not self.rows: return
    ref = "tinygrad's own METAL device" if MAC else "tinygrad's CPU device (the reference on Linux: tinygrad's METAL needs macOS)"
    self.add("## Computations", "",
             f"Each computation ran twice with the same inputs (numpy, fixed seeds), in two processes one after the other: on {ref} "
             f"(\"local\"), and on METAL through the runner above (\"runner\", `import client.remote_metal`, METAL_RUNNER={self.run.addr}, "
             "the runner under MTL_DEBUG_LAYER=1). "
             + ("Outputs are compared bit for bit; where they differ, the largest difference is given in ULP (units in the last place of the "
                "output's float type). " if MAC else
                "Outputs pass when they agree within the tolerance given (numpy `allclose`; integer outputs must be equal); whether they are "
                "bit-identical and the largest difference in ULP are shown too. ")
             + "The distance in ULP counts the floats between two values, so two tiny values of opposite sign near 0 are billions of ULP "
             "apart: the largest absolute difference is given beside it. "
             + "Kernels compiled are those tinygrad compiled for that computation in that process (a kernel already compiled for an earlier "
             "one is not counted again); those with simdgroup matrices contain `simdgroup_multiply_accumulate` (tensor cores)"
             + ("" if MAC else "; tinygrad's CPU device has none") + ". Seconds: the computation's wall-clock time in that process, kernel "
             "compilation included.", "",
             "| computation | what | result | kernels compiled (with simdgroup matrices): runner / local | seconds: runner / local |",
             "|---|---|---|---|---|")
    la, ra = ((self.work or {}).get(s, {}).get("arch") for s in ("local", "runner"))
    if MAC and la and ra and la != ra:
      self.add(f"**The two processes rendered kernels for different GPU families: {la} (tinygrad's METAL) and {ra} (the runner's Rhello), so "
               "their kernels may differ and bit equality is not to be expected.**", "")
    for r in self.rows:
      self.add(f"| {r['name']} | {cell(r['what'])} | {cell(self.result(r))} | {self.kernels(r)} | {self.seconds(r)} |")
    self.add("", "Every output:", "", "| computation | output | dtype[shape] | bit-identical | elements that differ | largest ULP | largest abs. "
             "difference |", "|---|---|---|---|---|---|---|")
    for r in self.rows:
      for o in r.get("outputs", []):
        ulp = "-" if "max_ulp" not in o else str(o["max_ulp"]) + (f" (and {o['nan_mismatch']} NaN against a number)" if o.get("nan_mismatch") else "")
        self.add(f"| {r['name']} | `{cell(o['name'])}` | {o['dtype']}{o['shape']} | {'yes' if o['identical'] else 'no'} | {o['ndiff']} of {o['n']} | "
                 f"{ulp} | {num(o.get('max_abs', '-'))} |")
    self.add("")
    for r in self.rows:
      for role in ("runner", "local"):
        if "error" in r[role]: self.add(f"**{r['name']}, {role}: error**", "", code(r[role]["error"]), "")
    for role in ("local", "runner"):
      if (err:=(self.work or {}).get(role, {}).get("errors", {}).get("cases")):
        self.add(f"**The {role} process failed** ({err[0].splitlines()[0]}); its output:", "", code(trim(err[1], 60)), "")

  def result(self, r:dict) -> str:
    if "outputs" not in r: return "**ERROR** (below)"
    outs, n = r["outputs"], len(r["outputs"])
    ident = sum(o["identical"] for o in outs)
    worst = max(outs, key=lambda o: (o.get("max_ulp", 0), o.get("max_abs", 0)))
    tol = f"rtol {r['rtol']:g}, atol {r['atol']:g}"
    if MAC:
      if ident == n: return f"bit-identical ({n} outputs)"
      big = f"{worst['max_ulp']} ULP" if "max_ulp" in worst else f"{worst['max_abs']} (integer)"
      return f"**DIFFERS**: {n - ident} of {n} outputs; largest difference {big} (`{worst['name']}`); within the tolerance the Linux " \
             f"run allows ({tol}): {'yes' if all(o['close'] for o in outs) else 'no'}"
    if not r["ok"]:
      bad = [o["name"] for o in outs if not o["close"]]
      return f"**OUTSIDE TOLERANCE** ({tol}): " + ", ".join(f"`{b}`" for b in bad)
    return f"within tolerance ({tol}); {ident} of {n} outputs bit-identical" + \
           (f", largest difference {worst['max_ulp']} ULP (`{worst['name']}`)" if ident < n and "max_ulp" in worst else "")

  def kernels(self, r:dict) -> str:
    return " / ".join(f"{r[s]['kernels']} ({r[s]['simdgroup']})" if "kernels" in r[s] else "-" for s in ("runner", "local"))

  def seconds(self, r:dict) -> str:
    return " / ".join(f"{r[s]['seconds']:.2f}" if "seconds" in r[s] else "-" for s in ("runner", "local"))

  def figures(self):
    w = self.work
    if not w or self.run.fig_addr is None: return
    lf, rf = w["local"].get("figures", {}), w["runner"].get("figures", {})
    if MAC:
      self.add("## Figures", "", "Measured on this Mac, in two more processes, one after the other: \"local\" is tinygrad's own METAL device; "
               f"\"runner\" is METAL through a second `daemon/metal_runner` on {self.run.fig_addr} (loopback TCP), started without "
               "MTL_DEBUG_LAYER (the validation layer costs time). Wall-clock time (`time.perf_counter()`) in that Python process, the same "
               "code on both sides; each process first builds the MLP and the LLM of the computations above (untimed).", "")
    else:
      self.add("## Figures (NOT GPU figures)", "", "Measured on Linux, in two more processes, one after the other: \"local\" is tinygrad's "
               "CPU device (kernels compiled by clang, run on this CPU); \"runner\" is METAL through a second `daemon/metal_runner_emu` on "
               f"{self.run.fig_addr} (loopback TCP), started without MTL_DEBUG_LAYER, the **Metal emulator**, which runs every kernel on this "
               "CPU. Wall-clock time (`time.perf_counter()`) in that Python process, the same code on both sides; each process first builds "
               "the MLP and the LLM of the computations above (untimed). **These figures say nothing about a GPU or Metal**: they are here "
               "so that the code that takes them has run before a Mac runs it.", "")
    self.add("| figure | local | runner | runner/local | how it was measured |", "|---|---|---|---|---|")
    for name in dict.fromkeys([*lf, *rf]):
      l, r = lf.get(name), rf.get(name)
      if isinstance(l, dict) or isinstance(r, dict) or l is None or r is None:
        self.add(f"| {name} | {fmt(l[0]) + ' ' + l[1] if isinstance(l, list) else 'error'} | "
                 f"{fmt(r[0]) + ' ' + r[1] if isinstance(r, list) else 'error'} | - | failed: see below |")
        continue
      self.add(f"| {name} | {fmt(l[0])} {l[1]} | {fmt(r[0])} {r[1]} | {r[0] / l[0]:.3g} | {l[2]} |")
    self.add("", "runner/local is the runner's figure divided by local's: above 1 for a time (µs) means the runner takes longer, below 1 for a "
             "rate (GB/s, steps/s, tokens/s) means it is slower. The runner's figures include the loopback round trips of the protocol.", "")
    for role, f in (("local", lf), ("runner", rf)):
      for name, v in f.items():
        if isinstance(v, dict): self.add(f"**{name}, {role}: error**", "", code(v["error"]), "")
      if (err:=w[role].get("errors", {}).get("figures")):
        self.add(f"**The {role} process of the figures failed** ({err[0].splitlines()[0]}); its output:", "", code(trim(err[1], 60)), "")

  def session_starts(self):
    st = self.run.starts
    if st is None: return
    self.add("## Session start of a tinygrad.llm model" + ("" if MAC else " (NOT GPU figures)"), "")
    if "error" in st:
      self.add(st["error"], "")
      return
    self.add(f"A session of its own sends again the {st['kernels']} Tloads ({st['kind']}) that the runner process made for \"llm decode\" above "
             "(tinygrad.llm's Transformer, its prefill and decode kernels), then allocates a buffer, loads one tiny kernel and launches it, "
             "waiting: the time from connect to that launch's answer, in this script (loopback TCP). Two runners started for this, without "
             "MTL_DEBUG_LAYER, each given two such sessions one after the other: with `--isolation thread` the second session takes every "
             "pipeline from the runner's cache; with process isolation (the default) each session is a fresh process that compiles every "
             "program again, and only the system's own caches (macOS keeps a shader cache under the runner's user's cache directory, "
             "docs/service.md) can make the second faster than the first. The first sessions may find these kernels in that cache already, "
             "from the steps above. This is the figure the default isolation mode rests on (issue 35, item 2).", "")
    if not MAC:
      self.add("**On Linux: the Metal emulator, whose compiled kernels come from its own disk cache; nothing here is a Mac's figure.**", "")
    self.add("| isolation | first session | second session |", "|---|---|---|")
    for mode, name in (("thread", "`--isolation thread`"), ("process", "process (spawned, the default)")):
      v = st["modes"].get(mode)
      if isinstance(v, list): self.add(f"| {name} | {v[0] * 1e3:.1f} ms | {v[1] * 1e3:.1f} ms |")
      else: self.add(f"| {name} | error | error |")
    self.add("")
    for mode, v in st["modes"].items():
      if isinstance(v, dict): self.add(f"**{mode} isolation: error**", "", code(v["error"]), "")

  def runner_log(self):
    if not self.build["ok"] or self.run.runner is None: return
    self.add("## Runner log", "")
    for e in self.run.runner_events: self.add(f"- **{e}**")
    for i, (log, validate) in enumerate(self.run.logs):
      vl = [ln for ln in log if re.search(r"validation|MTLDebug|assert", ln, re.I)]
      self.add(f"Runner {i + 1}, `{self.run.bin.name} --backend metal` {'with MTL_DEBUG_LAYER=1' if validate else 'without MTL_DEBUG_LAYER'} "
               f"({'the tests and computations' if validate else 'the figures'}): {len(log)} lines on stderr, {len(vl)} mentioning "
               "validation or an assertion.", "", code(trim("\n".join(log), 40) or "(empty)"), "")
    self.refusals()

  def refusals(self):
    """Tloads refused for their bindings and launches for a misaligned offset: the tests provoke some, tinygrad's kernels never should."""
    tests, work = [], []
    mark_log, mark = self.run.cases_mark or (None, 0)
    for log, _ in self.run.logs:   # the first runner's, up to the mark, were the tests'; the rest, the computations' and figures'
      cut = mark if log is mark_log else len(log) if log is self.run.logs[0][0] else 0
      tests += [ln for ln in log[:cut] if REFUSAL.search(ln)]
      work += [ln for ln in log[cut:] if REFUSAL.search(ln)]
    self.add(f"Binding and alignment refusals (the runner checks each Tload against the kernel's buffer bindings, EPROGRAM, and each buffer "
             f"offset against its alignment, EINVAL, where Metal's validation layer would stop the process): **{len(tests)} during the "
             f"Metal tests** (some provoke them on purpose), **{len(work)} during the computations and figures** (tinygrad's own kernels: "
             "any there is a bug to report).", "")
    if work: self.add(code(trim("\n".join(work), 20)), "")
    self.reflection()

  def reflection(self):
    """What Metal's reflection gave for tinygrad's kernels: the runner logs the first few of each process at -v, and every one with a
    binding reported unused."""
    mark_log, mark = self.run.cases_mark or (None, 0)
    lines = [ln for ln in (mark_log or [])[mark:] if "metal: reflection of kernel" in ln]
    unused = [ln for ln in lines if "UNUSED" in ln]
    self.add("### Reflection of tinygrad's kernels", "",
             "What Metal's pipeline reflection gave for tinygrad's kernels during the computations (the runner logs, at -v, the first "
             "8 kernels each process compiles and every kernel with a binding reported unused): each buffer binding's index, size, "
             "alignment and whether the kernel uses it (`MTLBinding.used`, before macOS 13 `MTLArgument.isActive`). The runner holds only "
             "used bindings to Tload's count and widths (issue 35, item 3); whether Apple's compiler lists a parameter a kernel does not "
             f"use, and marks it so, is what these lines show. **{len(lines)} lines, {len(unused)} with a binding reported unused.**", "")
    if lines: self.add(code(trim("\n".join(unused[:10] + [ln for ln in lines if ln not in unused][:10]), 24)), "")

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the docstring at the top of this file.")
  ap.add_argument("--out", default="mac_report.md", help="the report's path (default mac_report.md)")
  ap.add_argument("--quick", action="store_true", help="small shapes and short timings (the Linux test)")
  ap.add_argument("-k", metavar="EXPR", help="only the Metal tests matching this pytest -k expression")
  ap.add_argument("--test-timeout", type=float, default=3600, help="seconds for each pytest pass (default 3600)")
  ap.add_argument("--worker-timeout", type=float, default=1800, help="seconds for each computation process (default 1800)")
  ap.add_argument("--worker", nargs=2, metavar=("ROLE", "PART"), help=argparse.SUPPRESS)   # local|runner cases|figures
  ap.add_argument("--dir", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    sys.path.insert(0, str(ROOT))
    worker(*args.worker, pathlib.Path(args.dir), args.quick)
    return 0
  sys.path.insert(0, str(ROOT))
  os.environ.pop("MTL_DEBUG_LAYER", None)   # set where wanted: the first runner and the tests
  run = Run(args)
  try: return run.go()
  finally: shutil.rmtree(run.dir, ignore_errors=True)

if __name__ == "__main__": sys.exit(main())
