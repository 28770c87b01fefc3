"""Minimal reproduction: tinygrad 0.14.0's own tinygrad.llm Transformer with its weights sharded over two devices (Tensor.shard) fails
inside tinygrad, on local CPU devices (no runner involved), so it can be reported upstream. Each variant runs in a process of its own:

  python3 bench/shard_repro.py            all variants, one line each: ok, or the exception and the tinygrad frame it came from
  python3 bench/shard_repro.py VARIANT    one variant, with the full traceback

  replicate   every weight replicated on both devices (shard, axis=None)
  (the inputs, made by generate() on the default device, are replicated on both devices in every shard variant)
  ffn         only the FFN weights sharded on their output axis (ffn_gate, ffn_up: axis 0; ffn_down: axis 0), the rest replicated
  all2d       every 2-D weight sharded on axis 0 (output features), the norms replicated (the first attempt, bench/netbench.py)
  split       control: no shard, the first block on CPU:0 and the second on CPU:1 (Tensor.to between them): what bench/link_worker.py
              llm2 runs on two runners
"""
from __future__ import annotations
import pathlib, subprocess, sys, traceback

VARIANTS = ("replicate", "ffn", "all2d", "split")
CFG = dict(num_blocks=2, dim=128, hidden_dim=256, n_heads=4, n_kv_heads=4, norm_eps=1e-5, vocab_size=256, max_context=64)

def model():
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
  from client.llm_kernels import install
  install()   # the 0.14.0 wheel lacks tinygrad/llm/kernels/: what it means off AMD GPUs, where it is missing
  from tinygrad.llm.model import Transformer, TransformerConfig
  hd = CFG["dim"] // CFG["n_heads"]
  return Transformer(TransformerConfig(**CFG, head_dim=hd, rope_theta=10000.0, rope_dim=hd, v_head_dim=hd))

def run(variant:str) -> list[int]:
  from tinygrad import Tensor, nn
  Tensor.manual_seed(0)
  m, devs = model(), ("CPU:0", "CPU:1")
  for k, p in nn.state.get_state_dict(m).items():
    w = Tensor.randn(*p.shape) * 0.02
    if variant == "replicate": w = w.shard(devs, axis=None)
    elif variant == "ffn": w = w.shard(devs, axis=0 if k.split(".")[-2] in ("ffn_gate", "ffn_up", "ffn_down") else None)
    elif variant == "all2d": w = w.shard(devs, axis=0 if len(p.shape) == 2 else None)
    else: w = w.to(devs[1] if k.startswith(("blk.1.", "output")) else devs[0])
    p.replace(w.realize())
  if variant != "split":
    # the model's own forward, with its inputs (made by generate() on the default device) replicated on both devices like the weights
    from tinygrad import TinyJit
    own = m.forward
    def rep(t): return t if isinstance(t.device, tuple) else t.shard(devs, axis=None)   # a sampled token fed back is already on both
    def forward(tokens, start_pos, temperature): return own(rep(tokens), start_pos, rep(temperature))
    m.forward = forward
    m.prefill_jit, m.rollout_jit = TinyJit(forward), TinyJit(forward)
  else:
    def forward(tokens, start_pos, temperature):
      x = m.blk[0](m.token_embd(tokens.to(devs[0])).float(), start_pos).to(devs[1])
      logits = m.output(m.output_norm(m.blk[1](x, start_pos)[:, -1:]))[:, -1, :]
      return logits.argmax(-1, keepdim=True)
    m.forward = forward
    from tinygrad import TinyJit
    m.prefill_jit, m.rollout_jit = TinyJit(forward), TinyJit(forward)
  gen = m.generate([1, 2, 3])
  return [next(gen) for _ in range(4)]

if __name__ == "__main__":
  if len(sys.argv) == 2:
    print(run(sys.argv[1]))
    sys.exit(0)
  import tinygrad, importlib.metadata
  print(f"tinygrad {importlib.metadata.version('tinygrad')} ({tinygrad.__file__}), Python {sys.version.split()[0]}")
  ref = None
  for v in VARIANTS[::-1]:   # split first: its tokens are the reference (the same weights on one device at a time)
    r = subprocess.run([sys.executable, __file__, v], capture_output=True, text=True, timeout=600)
    if r.returncode == 0:
      toks = r.stdout.strip().splitlines()[-1]
      ref = ref or toks
      nv = CFG["vocab_size"]
      out = [t for t in eval(toks) if not 0 <= t < nv]
      bad = f", and {out} outside the vocabulary (0..{nv - 1})" if out else ""
      print(f"{v:<10} runs: tokens {toks}, " + ("the reference" if toks is ref else "as the reference" if toks == ref else
            f"WRONG: not the reference's{bad}"))
    else:
      tb = r.stderr.strip().splitlines()
      frames = [ln.strip() for ln in tb if ln.strip().startswith("File ") and "/tinygrad/" in ln]
      print(f"{v:<10} FAILS: {tb[-1]}\n{'':<11}raised at {frames[-1] if frames else '?'}")
