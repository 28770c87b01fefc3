#!/usr/bin/env python3
"""Decode with a language model pooled over several runners: tinygrad.llm's Transformer (random weights, made here) sharded over the
runners (tensor parallel), or split by layers between them, greedy, through TinyJit. Each step is one graph per runner, and the
activations go runner to runner (docs/multi-runner.md).

  python3 examples/shard_llm.py --runner mac1.local,mac2.local        # tensor parallel over two runners (Tensor.shard)
  python3 examples/shard_llm.py --runner mac1.local,mac2.local --split  # split by layers: the first half of the blocks on the first
  python3 examples/shard_llm.py --check   # also decode on tinygrad's own CPU device and check that the tokens are the same

It then decodes the same model on the first runner alone and prints the ratio of the two speeds (--no-baseline: not).

Without --runner the client starts two local runners. The runners' tokens come from --token-file (one file for all, or one per runner,
as for python -m client run), or ~/.metal_runner_token.
"""
from __future__ import annotations
import argparse, os, pathlib, sys, time
import numpy as np
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

SIZES = dict(blocks=6, dim=512, ffn=1024, heads=8, vocab=4096, context=128)   # 19.9 M parameters
SHARD_AXIS0, SHARD_AXIS1 = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"), ("attn_output", "ffn_down")

def build(devs:tuple[str, ...], mode:str, blocks:int, dim:int, ffn:int, heads:int, vocab:int, context:int):
  """The model on devs with random weights (seed 0, the same for every mode), and its decode step as a TinyJit.
  mode: "one" (devs[0]), "split" (the embedding and the first half of the blocks on devs[0], the rest and the head on devs[1]) or "tp"
  (q/k/v and ffn_gate/ffn_up sharded on their output axis, attn_output and ffn_down on their input axis, the KV cache on its head axis,
  the rest replicated: one all-reduce after the attention and one after the FFN of each block)."""
  from client.llm_kernels import install
  install()   # tinygrad 0.14.0's wheel lacks tinygrad/llm/kernels/ (bench/upstream/llm_kernels.md): what it means off AMD GPUs
  from tinygrad import Tensor, TinyJit, nn, dtypes
  from tinygrad.llm.model import Transformer, TransformerConfig, precompute_freqs_cis
  hd = dim // heads
  model = Transformer(TransformerConfig(num_blocks=blocks, dim=dim, hidden_dim=ffn, n_heads=heads, n_kv_heads=heads, norm_eps=1e-5,
                                        vocab_size=vocab, max_context=context, head_dim=hd, rope_theta=10000.0, rope_dim=hd, v_head_dim=hd))
  half, rng = blocks // 2, np.random.default_rng(0)
  for k, p in nn.state.get_state_dict(model).items():
    scale = 1 / np.sqrt(p.shape[-1]) if len(p.shape) > 1 and not k.startswith("token_embd") else 1   # activations that vary: varied tokens
    w = Tensor((rng.standard_normal(p.shape, dtype=np.float32) * scale).astype(np.float32), device=devs[0])
    if mode == "tp": w = w.shard(devs, axis=0 if k.split(".")[-2] in SHARD_AXIS0 else 1 if k.split(".")[-2] in SHARD_AXIS1 else None)
    elif mode == "split" and (k.startswith("output") or (k.startswith("blk.") and int(k.split(".")[1]) >= half)): w = w.to(devs[1])
    p.replace(w.realize())
  # the state each block makes on first use, made here on the block's own device(s): the KV cache sharded by head for tp
  for i, b in enumerate(model.blk):
    dev = devs[1] if mode == "split" and i >= half else devs[0]
    cache = Tensor.zeros(2, 1, heads, context, hd, dtype=dtypes.half, device=dev).contiguous()
    freqs = precompute_freqs_cis(hd, context, 10000.0, device=dev)
    b.cache_kv, b.freqs_cis = (cache.shard(devs, axis=2), freqs.shard(devs)) if mode == "tp" else (cache, freqs)
    b.cache_kv, b.freqs_cis = b.cache_kv.realize(), b.freqs_cis.realize()
  @TinyJit
  def step(token:Tensor, start_pos) -> Tensor:
    x = model.token_embd(token).float()
    for i, b in enumerate(model.blk): x = b(x.to(devs[1]) if mode == "split" and i == half else x, start_pos)
    out = model.output(model.output_norm(x[:, -1:]))[:, -1, :].argmax(-1, keepdim=True).cast(dtypes.int32)
    return (out.to(devs[0]) if mode == "split" else out).realize()
  return step

def decode(step, devs:tuple[str, ...], mode:str, n:int, context:int, on_token=None) -> list[int]:
  """n greedy tokens after token 1, one T=1 step each (the prompt would go the same way: tinygrad 0.14's sharded prefill of symbolic
  length gives wrong logits, bench/upstream/symbolic_prefill.md). on_token(i) is called before step i (timing)."""
  from tinygrad import Tensor, UOp
  v_pos = UOp.variable("start_pos", 0, context - 1)
  tok = Tensor([[1]], dtype="int32", device=devs[0])
  tok, toks = (tok.shard(devs) if mode == "tp" else tok).realize(), []
  for pos in range(n):
    if on_token is not None: on_token(pos)
    tok = step(tok, v_pos.bind(pos))
    toks.append(int(tok.item()))   # the one read per token: the program decides what comes next
  return toks

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--runner", default=None, help="runner addresses, comma-separated (HOST or HOST:PORT); default: two local runners")
  ap.add_argument("--token-file", default=None, help="the runners' token file (one, or one per runner, comma-separated)")
  ap.add_argument("--split", action="store_true", help="split by layers instead of tensor parallel")
  ap.add_argument("--tokens", type=int, default=32)
  ap.add_argument("--check", action="store_true", help="also decode on tinygrad's CPU device and compare the tokens")
  ap.add_argument("--no-baseline", action="store_true", help="do not decode on the first runner alone for the ratio")
  for k, v in SIZES.items(): ap.add_argument(f"--{k}", type=int, default=v)
  a = ap.parse_args()
  if a.runner: os.environ["METAL_RUNNER"] = a.runner
  if a.token_file: os.environ["METAL_RUNNER_TOKEN_FILE"] = a.token_file
  import client.remote_metal
  dev = client.remote_metal.runner_device()   # REMOTE for CPU runners, METAL for Metal ones
  n = max(2, len(a.runner.split(","))) if a.runner else 2
  devs, mode = tuple(f"{dev}:{i}" for i in range(n if not a.split else 2)), "split" if a.split else "tp"
  sizes = {k: getattr(a, k) for k in SIZES}
  def timed(devs, mode) -> tuple[list[int], float]:   # the tokens, and tokens/s after the first 4 (the JIT's capture)
    step, t = build(devs, mode, **sizes), [0.0]
    toks = decode(step, devs, mode, a.tokens, a.context, on_token=lambda i: t.__setitem__(0, time.perf_counter()) if i == 4 else None)
    return toks, (a.tokens - 4) / (time.perf_counter() - t[0])
  toks, speed = timed(devs, mode)
  print(f"{mode} over {', '.join(devs)}: {' '.join(map(str, toks))}")
  print(f"{speed:.1f} tokens/s after the first 4 (JIT capture)")
  if not a.no_baseline:
    one, base = timed(devs[:1], "one")
    print(f"one runner ({devs[0]}) alone: {base:.1f} tokens/s; {mode} over {len(devs)}: {speed / base:.2f}x that"
          f"{'' if one == toks else ' (its tokens differ)'}")
  if a.check:
    same = decode(build(("CPU",), "one", **sizes), ("CPU",), "one", a.tokens, a.context) == toks
    print("the same tokens as tinygrad's CPU device" if same else "TOKENS DIFFER from tinygrad's CPU device")
    if not same: sys.exit(1)

if __name__ == "__main__":
  main()
