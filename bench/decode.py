"""Greedy decoding of tinygrad.llm's Transformer (random float32 weights) through TinyJit, in one of four modes, one process per run:

  python3 bench/decode.py MODE [--runner A,B] [--blocks 6 --dim 512 --ffn 1024 --heads 8 --vocab 4096] [--tokens 60] [--warmup 8]

  cpu     tinygrad's own CPU device (no runner)
  one     one runner (REMOTE:0)
  split   two runners split by layers: the embedding and the first half of the blocks on REMOTE:0, the rest and the head on REMOTE:1
          (the hidden state goes from one to the other with Tensor.to, the sampled token back)
  tp      two runners, tensor parallel (Tensor.shard): q/k/v and ffn_gate/ffn_up on axis 0, attn_output and ffn_down on axis 1, the KV
          cache on its head axis, norms, embedding and head replicated; each step's input token replicated on both

Prints one JSON line: tokens/s, ms per token, the tokens, and (runner modes) requests and round trips per token over all runners. The
prompt is fed one token at a time through the T=1 decode JIT (a sharded prefill of symbolic length gives wrong logits in tinygrad 0.14:
bench/upstream/symbolic_prefill.md). --runner: the runners' addresses (METAL_RUNNER); without it the client starts local runners.
"""
from __future__ import annotations
import argparse, json, os, sys, time, types
import numpy as np

def shim_llm_kernels():
  """tinygrad 0.14.0's wheel lacks tinygrad/llm/kernels/ (model.py imports it: bench/upstream/llm_kernels.md): what it means off AMD GPUs."""
  if "tinygrad.llm.kernels.amd" in sys.modules: return
  from tinygrad import nn
  try:
    import tinygrad.llm.kernels.amd  # noqa: F401
    return
  except ImportError: pass
  shim = types.ModuleType("tinygrad.llm.kernels.amd")
  shim.Linear, shim.amd_custom_kernels_supported, shim.gated_delta_prefill, shim.flash_attention = nn.Linear, lambda dev: False, None, None
  sys.modules["tinygrad.llm.kernels"], sys.modules["tinygrad.llm.kernels.amd"] = types.ModuleType("tinygrad.llm.kernels"), shim

AXIS0, AXIS1 = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"), ("attn_output", "ffn_down")

def build(a, mode:str):
  shim_llm_kernels()
  from tinygrad import Tensor, TinyJit, nn, dtypes
  from tinygrad.llm.model import Transformer, TransformerConfig, precompute_freqs_cis
  hd = a.dim // a.heads
  cfg = TransformerConfig(num_blocks=a.blocks, dim=a.dim, hidden_dim=a.ffn, n_heads=a.heads, n_kv_heads=a.heads, norm_eps=1e-5,
                          vocab_size=a.vocab, max_context=a.context, head_dim=hd, rope_theta=10000.0, rope_dim=hd, v_head_dim=hd)
  model = Transformer(cfg)
  devs = ("CPU",) if mode == "cpu" else ("REMOTE:0",) if mode == "one" else ("REMOTE:0", "REMOTE:1")
  half = a.blocks // 2
  rng = np.random.default_rng(0)
  for k, p in nn.state.get_state_dict(model).items():
    scale = 1 / np.sqrt(p.shape[-1]) if len(p.shape) > 1 and not k.startswith("token_embd") else 1   # activations that vary: varied tokens
    w = Tensor((rng.standard_normal(p.shape, dtype=np.float32) * scale).astype(np.float32), device=devs[0])
    if mode == "tp": w = w.shard(devs, axis=0 if k.split(".")[-2] in AXIS0 else 1 if k.split(".")[-2] in AXIS1 else None)
    elif mode == "split" and (k.startswith(("output", "output_norm")) or (k.startswith("blk.") and int(k.split(".")[1]) >= half)):
      w = w.to(devs[1])
    p.replace(w.realize())
  # the per-block state the model makes on first use: on the block's own device(s), the KV cache sharded by head for tp
  for i, b in enumerate(model.blk):
    dev = devs[1] if mode == "split" and i >= half else devs if mode == "tp" else devs[0]
    cache = Tensor.zeros(2, 1, a.heads, a.context, hd, dtype=dtypes.half, device=devs[0] if mode == "tp" else dev).contiguous()
    b.cache_kv = (cache.shard(devs, axis=2) if mode == "tp" else cache).realize()
    b.freqs_cis = precompute_freqs_cis(hd, a.context, 10000.0, device=devs[0] if mode == "tp" else dev)
    if mode == "tp": b.freqs_cis = b.freqs_cis.shard(devs)
    b.freqs_cis = b.freqs_cis.realize()
  first, last = devs if mode == "tp" else devs[0], devs if mode == "tp" else devs[-1]
  def forward(tokens:Tensor, start_pos) -> Tensor:
    x = model.token_embd(tokens).float()
    for i, b in enumerate(model.blk): x = b(x.to(devs[1]) if mode == "split" and i == half else x, start_pos)
    out = model.output(model.output_norm(x[:, -1:]))[:, -1, :].argmax(-1, keepdim=True).cast(dtypes.int32)
    return (out.to(devs[0]) if mode == "split" else out).realize()
  return model, TinyJit(forward), first, last, devs

def runners(devs) -> list:
  from tinygrad import Device
  return [Device[d].runner for d in devs if d.startswith("REMOTE")]

def total(rs) -> dict:
  out: dict = {}
  for r in rs:
    for k, v in r.stats().items(): out[k] = out.get(k, 0) + v
  return out

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("mode", choices=("cpu", "one", "split", "tp"))
  ap.add_argument("--runner", default=None, help="runner addresses, comma-separated (METAL_RUNNER)")
  for n, d in (("blocks", 6), ("dim", 512), ("ffn", 1024), ("heads", 8), ("vocab", 4096), ("context", 128), ("tokens", 60), ("warmup", 8)):
    ap.add_argument(f"--{n}", type=int, default=d)
  a = ap.parse_args()
  if a.mode != "cpu":
    if a.runner: os.environ["METAL_RUNNER"] = a.runner
    os.environ.setdefault("DEV", "REMOTE")
    import client.remote_metal  # noqa: F401
  from tinygrad import Tensor, UOp
  model, step, first, last, devs = build(a, a.mode)
  v_pos = UOp.variable("start_pos", 0, a.context - 1)
  tok, toks, rs = Tensor([[1]], dtype="int32", device=devs[0]).realize(), [], runners(devs)
  if a.mode == "tp": tok = tok.shard(devs).realize()
  t0 = s0 = None
  for pos in range(a.warmup + a.tokens):
    if pos == a.warmup: t0, s0 = time.perf_counter(), total(rs)
    out = step(tok, v_pos.bind(pos))
    toks.append(int(out.item()))   # the one read per token: the program decides what comes next
    tok = out if a.mode != "tp" or isinstance(out.device, tuple) else out.shard(devs).realize()
  s = time.perf_counter() - t0
  st = {k: v - s0[k] for k, v in total(rs).items()} if rs else {}
  print(json.dumps({"mode": a.mode, "tok_per_s": a.tokens / s, "ms_per_tok": s / a.tokens * 1e3, "tokens": toks,
                    "requests_per_tok": st.get("requests", 0) / a.tokens, "round_trips_per_tok": st.get("round_trips", 0) / a.tokens,
                    "round_trips_by_runner": [r.stats()["round_trips"] for r in rs]}))

if __name__ == "__main__":
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
  main()
