"""One tinygrad.llm model over several runners, tensor parallel: each block's attention split by heads and its feed-forward by width, one
part per runner, and the embedding, the norms and the output head on every runner; a step is one graph per runner, with two all-reduces
per block, runner to runner (docs/multi-runner.md, A model across runners). METAL_RUNNER_PLACEMENT=tp picks it for `python -m client
run --runner a,b -m tinygrad.llm` (client/run.py); the default is the split by layers of client/placement.py.

  from client.placement_tp import from_gguf_tp
  model, kv, placement = from_gguf_tp("./model.gguf", ("REMOTE", "REMOTE:1"), max_context=4096)
  print(placement)   # the runners, and the bytes each holds

The sharding is examples/shard_llm.py's: attn_q, attn_k, attn_v, ffn_gate and ffn_up split on their output features, attn_output and
ffn_down on their input features, the KV cache on its head axis, the rest replicated. So the attention heads, the KV heads and the FFN
width must divide by the number of runners (and a quantized tensor split on its input features into whole blocks): where they do not,
or a runner cannot hold its part, the model is refused (DoesNotDivide, DoesNotFit) before anything is uploaded. Each runner receives
only its part of each tensor's bytes, as they are in the file (quantized ones quantized), and dequantizes them itself.

tinygrad 0.14 gives wrong logits for a sharded prefill of symbolic length (bench/upstream/symbolic_prefill.md), which its generate()
runs for every prompt: the model's generate() here feeds the prompt one token at a time through the decode step instead, one step per
prompt token (no read between them), where tinygrad runs up to 32 tokens a step.
"""
from __future__ import annotations
import dataclasses, pathlib, sys
from tinygrad import Device, Tensor, TinyJit, UOp, dtypes, nn
from client.discovery import RunnerUnavailable
from client.placement import (HEADROOM, DoesNotFit, TensorInfo, announce, block_of, context, kv_cache_bytes, mb, patched, prod, read_gguf,
                              runner_of, tinygrads_from_gguf)

class DoesNotDivide(RunnerUnavailable): pass   # one line and exit code 1 when uncaught, as DoesNotFit

# tinygrad's (out, in) order: split on the output features (0) or the input features (1); all else is replicated
SHARD_AXIS = {"attn_q": 0, "attn_k": 0, "attn_v": 0, "ffn_gate": 0, "ffn_up": 0, "attn_output": 1, "ffn_down": 1}

def shard_axis(t:TensorInfo) -> int|None:
  """The axis a block's tensor is split on, None: replicated. A bias of a tensor split on its input features is added after the
  all-reduce, once: replicated."""
  if block_of(t.name) is None or len(parts:=t.name.split(".")) != 4 or (axis:=SHARD_AXIS.get(parts[2])) is None: return None
  return axis if axis < len(t.dims) else None

@dataclasses.dataclass(frozen=True)
class TPPlacement:
  devices: tuple[str, ...]
  addrs: tuple[str, ...]
  shard: int        # bytes of the file each runner receives of the tensors split over the runners
  replicated: int   # bytes of the file every runner receives whole: the embedding, the norms, the output head
  kv: int           # bytes of KV cache on each runner (its heads, every block)
  why: tuple[str, ...]
  def __str__(self):
    return (f"tensor parallel over {len(self.devices)} runners: " + ", ".join(f"{d} {a or '(local)'}" for d, a in zip(self.devices, self.addrs)) +
            f"; each runner {mb(self.shard + self.replicated)}: its part of the attention and feed-forward weights, {mb(self.shard)}, and the "
            f"embedding, norms and head, {mb(self.replicated)}")

def unsupported(kv:dict, infos:list[TensorInfo]) -> str|None:
  """What of the model tensor parallel here does not split (the blocks of examples/shard_llm.py's kind only), None: nothing."""
  arch = kv["general.architecture"]
  if kv.get(f"{arch}.expert_count", 0): return "experts (a mixture of experts)"
  if kv.get(f"{arch}.attention.kv_lora_rank", 0): return "latent attention (MLA)"
  if arch in ("qwen35", "qwen35moe", "kimi-linear"): return f"recurrent blocks ({arch})"
  head_dim = kv.get(f"{arch}.attention.key_length", kv[f"{arch}.embedding_length"] // kv[f"{arch}.attention.head_count"])
  if any(t.name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")) and t.dims[0] != head_dim for t in infos):
    return "a norm over all the heads' queries and keys together"
  return None

def divisions(kv:dict, infos:list[TensorInfo], n:int) -> list[str]:
  """Each shape that does not divide by n runners, in words; [] when the model splits."""
  from tinygrad.llm.gguf import _GGML_QUANT
  arch = kv["general.architecture"]
  heads, kv_heads, ffn = kv[f"{arch}.attention.head_count"], kv[f"{arch}.attention.head_count_kv"], kv.get(f"{arch}.feed_forward_length", 0)
  if (bad:=[what for v, what in ((heads, f"{heads} attention heads"), (kv_heads, f"{kv_heads} KV heads"), (ffn, f"FFN width {ffn}")) if v % n]):
    return bad
  return [f"{t.name}'s rows of {t.dims[0]} values in quantized blocks of {q[0]}" for t in infos
          if shard_axis(t) == 1 and (q:=_GGML_QUANT.get(t.typ)) is not None and (t.dims[0] // n) % q[0]][:1]

def words(xs:list[str]) -> str: return " and ".join([", ".join(xs[:-1]), xs[-1]] if len(xs) > 1 else xs)

def plan_tp(kv:dict, infos:list[TensorInfo], devices:tuple[str, ...], max_context:int, headroom:int=HEADROOM) -> TPPlacement:
  """Tensor parallel over devices: DoesNotDivide when a shape does not split, DoesNotFit when a runner cannot hold its part, the
  replicated tensors, its share of the KV cache and headroom; both before anything is uploaded."""
  n, arch = len(devices), kv["general.architecture"]
  if (what:=unsupported(kv, infos)) is not None:
    raise DoesNotDivide(f"metal_runner: tensor parallel placement splits attention and feed-forward blocks, and this model has {what}; "
                        f"nothing was uploaded (unset METAL_RUNNER_PLACEMENT for a range of blocks on each runner)")
  if (bad:=divisions(kv, infos, n)):
    raise DoesNotDivide(f"metal_runner: tensor parallel over {n} runners splits the attention heads, the KV heads and the FFN width "
                        f"{n} ways: the model's {words(bad)} do not divide by {n}; nothing was uploaded (name a number of runners "
                        f"that divides them, or unset METAL_RUNNER_PLACEMENT for a range of blocks on each runner)")
  shard = sum(t.nbytes for t in infos if shard_axis(t) is not None) // n
  replicated = sum(t.nbytes for t in infos if shard_axis(t) is None)
  nblocks = kv[f"{arch}.block_count"]
  kvb = kv_cache_bytes(kv, max_context) * nblocks // n
  runners = [runner_of(d) for d in devices]
  memory, addrs = [r.info.memory if r is not None else None for r in runners], tuple(r.addr if r is not None else "" for r in runners)
  need = shard + replicated + kvb + headroom
  why = (f"{nblocks} blocks; split {n} ways: {mb(shard * n)}, {mb(shard)} per runner; replicated: {mb(replicated)}; KV cache at max_context "
         f"{max_context}: {mb(kvb)} per runner; headroom {mb(headroom)}: {mb(need)} per runner",
         *(f"{d} {a or '(local)'} offers {mb(m) if m is not None else 'no limit'}" for d, a, m in zip(devices, addrs, memory)))
  if any(m is not None and need > m for m in memory):
    offers = ", ".join(f"{a or d} offers {mb(m) if m is not None else 'no limit'}" for d, a, m in zip(devices, addrs, memory))
    raise DoesNotFit(f"metal_runner: the model does not fit on these runners tensor parallel ({offers}, per session: the runner's "
                     f"--session-mem): each runner needs its part of the attention and feed-forward weights, {mb(shard)}, the embedding, "
                     f"norms and head, {mb(replicated)}, its share of the KV cache, {mb(kvb)}, and {mb(headroom)} of headroom: {mb(need)} ("
                     + ", ".join(f"{a or d} {mb(need - m)} short" for d, a, m in zip(devices, addrs, memory) if m is not None and need > m)
                     + "); nothing was uploaded")
  return TPPlacement(tuple(devices), addrs, shard, replicated, kvb, why)

# *** loading: each runner gets its part of each tensor's bytes, and the tensor is one tinygrad multi-device tensor of those parts

def multi(parts:list[Tensor], axis:int|None) -> Tensor:
  """One tensor over the parts' devices: the parts side by side on axis (a sharded tensor), or the same values on each (None), as
  tinygrad's own multi-device tensors are made (mixin/creation.py _multi_like)."""
  u = parts[0].uop.mstack(*[p.uop for p in parts[1:]])
  return Tensor(u if axis is None else u.unshard(axis))

def load_state_tp(path:str|pathlib.Path, infos:list[TensorInfo], devices:tuple[str, ...]) -> dict[str, Tensor]:
  """The state dict gguf_load would give, each tensor over the devices: a part split on the output features is a run of whole rows in
  the file, sent from it (tinygrad's DISK device) as the split by layers sends; one split on the input features is gathered row by row
  on this host first. The parts' bytes become one multi-device tensor and are dequantized as that, lazily: each device's kernels read
  its bytes as they are, as on one device. (Parts dequantized each on its own device and then joined are a join of computed values,
  which tinygrad computes into buffers of their own every step: every weight written out again, the Q8_0 ones as float32, and read
  back, each token: 252 MB counted a token for bench/llm_runners.py's model, against 25 MB now and 45 MB on one device.)"""
  import numpy as np
  from tinygrad.llm.gguf import ggml_data_to_tensor
  disk, n, sd = Tensor(pathlib.Path(path)), len(devices), {}
  file = np.memmap(path, dtype=np.uint8, mode="r")
  for t in infos:
    shape, axis = tuple(reversed(t.dims)), shard_axis(t)
    if axis is None: raws = [disk[t.offset:t.offset + t.nbytes].to(d).realize() for d in devices]
    elif axis == 0:
      part = t.nbytes // n   # whole rows: the rows divide by n (plan_tp)
      raws = [disk[t.offset + i * part:t.offset + (i + 1) * part].to(d).realize() for i, d in enumerate(devices)]
    else:
      rows = file[t.offset:t.offset + t.nbytes].reshape(shape[0], -1)
      w = rows.shape[1] // n   # whole quantized blocks (plan_tp)
      raws = [Tensor(np.ascontiguousarray(rows[:, i * w:(i + 1) * w]).reshape(-1), device=d).realize() for i, d in enumerate(devices)]
    # the bytes side by side (split) or the same on each (replicated); split on the input features, device i's values are its
    # (rows, columns / n) in a row of n such, put side by side on the columns
    x = ggml_data_to_tensor(multi(raws, None if axis is None else 0), prod(shape), t.typ)
    sd[t.name] = x.reshape(n, shape[0], shape[1] // n).permute(1, 0, 2).reshape(*shape) if axis == 1 else x.reshape(*shape)
  return sd

def keep_multi(load):
  """tinygrad's load_state_dict takes a multi-device state whole where the model's tensor is multi-device too: make the model's tensor
  (still an unrealized placeholder) one over the state's devices first, so nothing is copied to the default device."""
  def f(model, state_dict, *args, **kwargs):
    for k, v in nn.state.get_state_dict(model).items():
      if k in state_dict and isinstance(d:=state_dict[k].device, tuple) and d != v.device: v.replace(Tensor.empty(*v.shape, dtype=v.dtype, device=d))
    return load(model, state_dict, *args, **kwargs)
  return f

def from_gguf_tp(path:str|pathlib.Path, devices:tuple[str, ...], max_context:int|None=None, realize:bool|None=None, say=print):
  """Transformer.from_gguf, tensor parallel over devices: (model, kv, placement). The plan first (DoesNotDivide, DoesNotFit before any
  upload), then each device's parts, then tinygrad's own from_gguf on that state dict (its casts, tied head, RoPE permutation, config),
  then place_tp(). say(line) gets the placement line (None: not said); DEBUG=1 also says why."""
  from tinygrad.llm import model as llm
  kv, infos = read_gguf(path)
  devices = tuple(Device.canonicalize(d) for d in devices)
  p = plan_tp(kv, infos, devices, context(kv, max_context))
  announce(p, say)
  sd = load_state_tp(path, infos, devices)
  with patched(llm, "gguf_load", lambda fn: (kv, sd)), patched(nn.state, "load_state_dict", keep_multi(nn.state.load_state_dict)):
    model, kv = tinygrads_from_gguf()(path, max_context, **({} if realize is None else {"realize": realize}))
  place_tp(model, devices)
  return model, kv, p

# *** the step: one token at a time, every runner

def place_tp(model, devices:tuple[str, ...]):
  """The KV caches (split by head) and RoPE tables made on the devices, a decode step that samples on the first device and hands the
  token to every device, and generate() feeding the prompt one token at a time through it (tinygrad 0.14's sharded prefill of symbolic
  length is wrong)."""
  from tinygrad.llm.model import Transformer, precompute_freqs_cis
  n = len(devices)
  for b in model.blk:
    c = b.config
    b.cache_kv = multi([Tensor.zeros(2, 1, c.n_kv_heads // n, c.max_context, c.head_dim, dtype=dtypes.half, device=d).contiguous()
                        for d in devices], 2).realize()
    b.freqs_cis = multi([precompute_freqs_cis(c.rope_dim, c.max_context, c.rope_theta, device=d) for d in devices], None).realize()
  first = devices[0]
  def forward(tokens:Tensor, start_pos, temperature:Tensor) -> Tensor:
    x = model.token_embd(tokens).float()
    for b in model.blk: x = b(x, start_pos)
    logits = model.output(model.output_norm(x[:, -1:]))[:, -1, :].to(first)   # every device has them: sample once, on the first
    tok = (logits / temperature.maximum(1e-12) - (Tensor.rand_like(logits).maximum(1e-12).log().neg()).log()).argmax(-1, keepdim=True)
    return tok.cast(dtypes.int32).shard(devices)   # the next step's input, on every device
  def prefill(*args): raise RuntimeError("tensor parallel: a prompt goes one token at a time through generate() (tinygrad 0.14's sharded "
                                         "prefill of symbolic length gives wrong logits)")
  def generate(tokens:list[int], chunk_size:int=32, temperature:float=0.0):
    """Transformer.generate (the KV cache reused for a shared prefix, the same tokens out), with each prompt token a decode step."""
    v_start_pos = UOp.variable("start_pos", 0, model.max_context - 1)
    temp = Tensor([temperature], device=first)
    t = Tensor(tokens + [0] * (model.max_context - len(tokens)), dtype="int32", device=first).reshape(1, model.max_context).shard(devices)
    start_pos, prompt_len, out = model.get_start_pos(tokens), len(tokens), None
    while len(tokens) < model.max_context:
      sp = v_start_pos.bind(start_pos)
      out = model.rollout_jit((t[:, sp:sp + 1] if start_pos < prompt_len or out is None else out).contiguous(), sp, temp).realize()
      start_pos += 1
      if start_pos < len(tokens): continue
      tokens.append(int(out.item()))
      model._cached_tokens = tokens[:-1]
      yield tokens[-1]
  assert isinstance(model, Transformer)
  model.forward, model.rollout_jit, model.prefill_jit, model.generate = forward, TinyJit(forward), prefill, generate
  return model

# *** tinygrad's app: Transformer.from_gguf of a file goes tensor parallel over the runners

def place_again_tp(drop, path, rs, max_context, realize, say):
  """After a runner was lost, or once one lost answers again (client/llm_serve.py): the model again from the file over the runners named
  at start that answer now (placement.py survivors()), tensor parallel where 2 or more answer and the model splits and fits over them;
  else split by layers (over one runner: the whole model on it), with a line that says why; DoesNotFit naming the runners lost when
  that cannot hold it either. Both checked before drop() lets go of the old model."""
  from client.placement import from_gguf, layers_fit, let_go, survivors
  alive, lost, taken = survivors(rs)
  kv, infos = read_gguf(path)
  ctx = context(kv, max_context)
  why = f"tensor parallel needs 2 runners or more, and {len(alive)} answers" if len(alive) < 2 else None
  if why is None:
    try: plan_tp(kv, infos, alive, ctx)
    except (DoesNotDivide, DoesNotFit) as e: why = str(e).removeprefix("metal_runner: ").split("; nothing was uploaded")[0]
  if why is not None: layers_fit(kv, infos, alive, ctx, lost)
  let_go(drop, alive, lost, taken, say)
  if why is None: return from_gguf_tp(path, alive, max_context, realize, say=say)[0]
  say(f"metal_runner: {why}: the model is split by layers instead")
  return from_gguf(path, alive, max_context, realize, True, say=say)[0]

def across_runners_tp():
  """Transformer.from_gguf(path) places the model tensor parallel over every runner named (METAL_RUNNER), for tinygrad's app and any
  program that loads its model that way; a Tensor (a file already on a device) is left to tinygrad. The placement line goes to stderr.
  A runner lost while serving ends the answer with an error naming it, and the next request places the model again over the runners
  that remain, a runner back over all again (client/llm_serve.py, place_again_tp())."""
  from tinygrad.llm.model import Transformer
  from client.placement import runner_devices
  from client.rejoin import Runners
  def placed(gguf, max_context=None, realize=None):
    if isinstance(gguf, Tensor): return tinygrads(gguf, max_context, **({} if realize is None else {"realize": realize}))
    say = lambda s: print(s, file=sys.stderr)   # noqa: E731
    model, kv, p = from_gguf_tp(gguf, runner_devices(), max_context, realize, say=say)
    model.runners = rs = Runners(p.devices, p.addrs, say)   # for the server: llm_serve.py
    rs.place_again = lambda drop: place_again_tp(drop, gguf, rs, max_context, realize, say)
    return model, kv
  placed.tinygrads = tinygrads = tinygrads_from_gguf()   # type: ignore[attr-defined]
  Transformer.from_gguf = staticmethod(placed)   # type: ignore[method-assign]
  from client.llm_serve import report_runner_faults
  report_runner_faults()
