"""Minimal reproduction for tinygrad 0.14.0 (no runner, no client: local CPU devices only), to file upstream.

A prefill of symbolic length (T = a bound UOp variable, as tinygrad.llm.model.Transformer.generate does) through a model whose weights
are sharded over two devices gives different logits from the same model on one device; with T a plain int, or one device, they agree.

  python3 bench/upstream/symbolic_prefill.py       # prints the largest difference of each variant; exit 1 if the symbolic one differs
"""
import pathlib, sys
import numpy as np
from tinygrad import Tensor, UOp, nn

def transformer():
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from client.llm_kernels import install   # the 0.14.0 wheel lacks tinygrad/llm/kernels/ (see llm_kernels.md): what it means off AMD GPUs
  install()
  from tinygrad.llm.model import Transformer, TransformerConfig
  return Transformer(TransformerConfig(num_blocks=1, dim=64, hidden_dim=128, n_heads=4, n_kv_heads=4, norm_eps=1e-5, vocab_size=64,
                                       max_context=16, head_dim=16, rope_theta=10000.0, rope_dim=16, v_head_dim=16))

def logits(devs, symbolic:bool) -> np.ndarray:
  m, rng = transformer(), np.random.default_rng(0)
  for k, p in nn.state.get_state_dict(m).items():
    w = Tensor(rng.standard_normal(p.shape, dtype=np.float32) / (8 if len(p.shape) > 1 else 1), device=devs[0])
    if len(devs) > 1: w = w.shard(devs, axis=0 if k.split(".")[-2] in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up") else None)
    p.replace(w.realize())
  toks = Tensor([[1, 5, 9, 13]], dtype="int32", device=devs[0])
  if len(devs) > 1: toks = toks.shard(devs)
  T = UOp.variable("toks", 1, 8).bind(4) if symbolic else 4
  x = m.token_embd(toks[:, 0:T]).float()
  for b in m.blk: x = b(x, 0)
  return m.output(m.output_norm(x[:, -1:]))[:, -1, :].numpy()

ref = logits(("CPU",), False)
bad = False
for devs, sym in ((("CPU",), True), (("CPU:0", "CPU:1"), False), (("CPU:0", "CPU:1"), True)):
  d = float(np.abs(logits(devs, sym) - ref).max())
  print(f"{len(devs)} device(s), {'symbolic' if sym else 'int'} T: largest difference from one device with an int T: {d:.3g}")
  bad |= d > 1e-3
sys.exit(1 if bad else 0)
