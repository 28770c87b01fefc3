"""One tinygrad device in its own process for bench/run.py --only network: like tg_worker.py (whose MLP and copy it uses), the
workloads that a network link changes. Prints {"ready": ...}, then answers one JSON line per stdin line:

  mlp_item N / mlp_sync N   tg_worker.py's TinyJit MLP step, loss read every step / a sync every 50 steps, at least N steps
  mlp_fused N               mlp_sync with tg_worker.py's STEP_FUSED: the loss realized with the update (the same kernels in 0.11 and 0.14)
  load BYTES                Allocator._copyin of BYTES (random) into a device buffer, then a sync: seconds and GB/s
  llm N                     decode N tokens (greedy) with a small llama-style model with random weights (LLM below); the first call
                            builds it, uploads the weights from host memory (timed: load_s) and captures the decode JIT
  llm2 N                    the same model split by layers over two devices, DEV and DEV:1 (place_split): a pipeline, the hidden
                            state moved between them with Tensor.to each token; 0.14's REMOTE also answers each connection's counters
  beam                      BEAM=2 search and run of one 256x256x256 float matmul of a shape not searched before in this process

Runs under tinygrad 0.14 (REMOTE: this runner through METAL_RUNNER, or CPU) and 0.11 (REMOTE=1 HOST=...: 0.11's REMOTE). With 0.14's
REMOTE every answer carries the client's Runner.stats() difference over the measured part (round trips, requests, bytes).
"""
from __future__ import annotations
import json, os, sys, time
import tg_worker as W   # sets up stdout redirection, DEV, tinygrad and the REMOTE device
from tg_worker import Tensor, Device, V014
import numpy as np

DEV = W.DEV
# ~20 M parameters: 6 blocks of dim 512 (hidden 1024, 8 heads of 64), vocabulary 4096. Small enough that one token on this 2-vCPU VM
# costs milliseconds, so a round trip of 0.3-30 ms is visible next to it; 80 MB of float32 weights to upload.
LLM = dict(num_blocks=6, dim=512, hidden_dim=1024, n_heads=8, n_kv_heads=8, norm_eps=1e-5, vocab_size=4096, max_context=512)

def runners() -> list:
  if DEV != "REMOTE" or not V014: return []
  from tinygrad.device import Device as D
  return [D[d].runner for d in D._opened_devices if d.startswith("REMOTE")]

def stats() -> dict:
  tot: dict = {}
  for r in runners():
    for k, v in r.stats().items(): tot[k] = tot.get(k, 0) + v
  return tot

def diff(a:dict, b:dict) -> dict: return {k: b[k] - a.get(k, 0) for k in b}

def stats_by_dev() -> dict:
  """Runner.stats() of each open REMOTE device's connection (0.14's REMOTE only)."""
  if DEV != "REMOTE" or not V014: return {}
  from tinygrad.device import Device as D
  return {d: D[d].runner.stats() for d in D._opened_devices if d.startswith("REMOTE")}

def m_load(nbytes:int) -> dict:
  from tinygrad.device import Buffer
  from tinygrad.dtype import dtypes
  buf = Buffer(DEV, nbytes, dtypes.uint8).ensure_allocated()
  host = memoryview(bytearray(os.urandom(1 << 20) * (nbytes >> 20)))
  buf.allocator._copyin(buf._buf, host)   # the first write touches the runner's pages: not part of a link's figure
  W.sync()
  s0, t = stats(), time.perf_counter()
  buf.allocator._copyin(buf._buf, host)
  W.sync()
  s = time.perf_counter() - t
  del buf
  return {"seconds": s, "gbps": nbytes / s / 1e9, "bytes": nbytes, "stats": diff(s0, stats())}

MODELS: dict = {}

def build_llm(device:str, split:tuple[str, str]|None=None) -> dict:
  """The model with weights uploaded from host memory (numpy, seed 0) onto device; with split=(dev0, dev1), split by layers (a pipeline):
  the embedding and the first half of the blocks on dev0, the other blocks, the final norm and the head on dev1 (place_split)."""
  Tensor.manual_seed(0)
  if V014:
    from client.llm_kernels import install
    install()   # tinygrad 0.14.0's wheel lacks tinygrad/llm/kernels/ (model.py imports it): what it means off AMD GPUs, where it is missing
    from tinygrad.llm.model import Transformer, TransformerConfig
    hd = LLM["dim"] // LLM["n_heads"]
    cfg = {k: v for k, v in LLM.items()}
    model = Transformer(TransformerConfig(**cfg, head_dim=hd, rope_theta=10000.0, rope_dim=hd, v_head_dim=hd))
  else:
    from tinygrad.apps.llm import Transformer
    model = Transformer(**LLM)
  from tinygrad import nn
  rng, params = np.random.default_rng(0), nn.state.get_state_dict(model)
  host = {k: (rng.standard_normal(p.shape, dtype=np.float32) * (0.02 if len(p.shape) > 1 else 1)).astype(np.float32) for k, p in params.items()}
  nbytes = sum(a.nbytes for a in host.values())
  W.sync()
  s0, t = stats(), time.perf_counter()
  for k, p in params.items(): p.replace(Tensor(host[k], device=device if split is None else split[on_second(k)]))
  Tensor.realize(*params.values())
  W.sync()
  load_s = time.perf_counter() - t
  if split is not None: place_split(model, split)
  return {"model": model, "load_s": load_s, "bytes": nbytes, "params": sum(a.size for a in host.values()), "load_stats": diff(s0, stats())}

SPLIT_AT = LLM["num_blocks"] // 2
def on_second(key:str) -> int:
  """1 if the weight of this state-dict key lives on the second device of the split."""
  return int(key.startswith(("output", "output_norm")) or (key.startswith("blk.") and int(key.split(".")[1]) >= SPLIT_AT))

def place_split(model, devs:tuple[str, str]):
  """Replace the model's forward (and its JITs) by one that moves the hidden state to devs[1] before block SPLIT_AT (Tensor.to, through
  the host: a runner-to-runner copy does not exist yet) and the sampled token back to devs[0]; otherwise the model's own forward."""
  from tinygrad import TinyJit
  def forward(tokens:Tensor, start_pos, *temperature:Tensor) -> Tensor:
    x = model.token_embd(tokens.to(devs[0]))
    if V014: x = x.float()
    for i, block in enumerate(model.blk[:SPLIT_AT]): x = block(x, start_pos)
    x = x.to(devs[1])
    if not V014:
      # 0.11's apply_rope makes its Tensor.arange on the default device: the second half runs with devs[1] as default
      from tinygrad import Device
      old, Device.DEFAULT = Device.DEFAULT, devs[1]
      try:
        for block in model.blk[SPLIT_AT:]: x = block(x, start_pos)
        return model.output(model.output_norm(x))[:, -1, :].softmax(-1).argmax(-1, keepdim=True)
      finally: Device.DEFAULT = old
    for block in model.blk[SPLIT_AT:]: x = block(x, start_pos)
    logits, temp = model.output(model.output_norm(x[:, -1:]))[:, -1, :], temperature[0].to(devs[1])
    return (logits / temp.maximum(1e-12) - (Tensor.rand_like(logits).maximum(1e-12).log().neg()).log()).argmax(-1, keepdim=True)
  model.forward = forward
  if V014: model.prefill_jit, model.rollout_jit = TinyJit(forward), TinyJit(forward)
  else: model.forward_jit = TinyJit(forward)

def m_llm(n:int, split:bool=False) -> dict:
  name = "llm2" if split else "llm"
  if name not in MODELS: MODELS[name] = build_llm(DEV, (f"{DEV}", f"{DEV}:1") if split else None)
  m = MODELS[name]
  gen = m["model"].generate([1, 2, 3, 4])
  for _ in range(4): next(gen)   # prefill, capture, warm up
  s0, d0, t = stats(), stats_by_dev(), time.perf_counter()
  toks = [next(gen) for _ in range(n)]
  s = time.perf_counter() - t
  out = {"tok_per_s": n / s, "ms_per_tok": s / n * 1e3, "tokens": n, "stats": diff(s0, stats()), "load_s": m["load_s"], "bytes": m["bytes"],
         "params": m["params"], "load_stats": m["load_stats"], "last": int(toks[-1])}
  if split: out["stats_by_dev"] = {d: diff(d0.get(d, {}), v) for d, v in stats_by_dev().items()}
  m["model"]._cached_tokens = [] if V014 else None
  return out

BEAM_N = [0]
def m_beam() -> dict:
  from tinygrad.helpers import Context
  BEAM_N[0] += 1
  n = 256 + BEAM_N[0]   # a new shape each time: nothing cached in this process (IGNORE_BEAM_CACHE=1 keeps the disk cache out)
  a, b = Tensor.rand(n, 256, device=DEV).realize(), Tensor.rand(256, 256, device=DEV).realize()
  W.sync()
  s0, t = stats(), time.perf_counter()
  with Context(BEAM=2): (a @ b).realize()
  W.sync()
  return {"seconds": time.perf_counter() - t, "stats": diff(s0, stats())}

def m_mlp(every:int, n:int, fused:bool=False) -> dict:
  """tg_worker.py's MLP steps (at least n, and 0.3 s), with the loss read every step (every=1) or a sync every 50; the counters cover
  exactly the steps and their reads or syncs."""
  W.sync()
  s0, steps, t = stats(), 0, time.perf_counter()
  while steps < n or time.perf_counter() - t < 0.3:
    for _ in range(50):
      loss = (W.STEP_FUSED if fused else W.STEP)(W.XS[steps % 4], W.YS[steps % 4])
      steps += 1
      if every == 1: loss.item()
    if every != 1: W.sync()
  return {"steps_per_s": steps / (time.perf_counter() - t), "steps": steps, "stats": diff(s0, stats())}

CMDS = {"mlp_item": lambda n: m_mlp(1, int(n)), "mlp_sync": lambda n: m_mlp(50, int(n)), "mlp_fused": lambda n: m_mlp(50, int(n), fused=True),
        "load": lambda n: m_load(int(n)),
        "llm": lambda n: m_llm(int(n)), "llm2": lambda n: m_llm(int(n), split=True), "beam": lambda *_: m_beam()}

if __name__ == "__main__":
  from importlib.metadata import version
  t0 = time.perf_counter()
  W.KERNEL = W.Kernel()
  W.setup_mlp()
  W.OUT.write(json.dumps({"ready": True, "device": DEV, "tinygrad": version("tinygrad"), "setup_s": time.perf_counter() - t0}) + "\n")
  for line in sys.stdin:
    if not (parts := line.split()): continue
    try: res = CMDS[parts[0]](*parts[1:])
    except Exception as e:
      import traceback
      traceback.print_exc()
      res = {"error": f"{type(e).__name__}: {e}"}
    W.OUT.write(json.dumps(res) + "\n")
