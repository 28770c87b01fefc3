"""One tinygrad.llm model over several runners, split by layers: contiguous ranges of blocks, one range per device, the embedding on the
first, the output norm and head on the last; a step's hidden state goes device to device (docs/multi-runner.md, A model across runners).

  from client.placement import from_gguf
  model, kv, placement = from_gguf("./model.gguf", ("REMOTE", "REMOTE:1"), max_context=4096)   # instead of Transformer.from_gguf
  print(placement)   # the runner, blocks and bytes of each device

The ranges are sized by what each runner can hold (Rhello's memory, less the KV cache of its blocks for max_context and HEADROOM) and by
how fast each runs (speeds(): a short timing pass at load; speed=False: by memory alone). A model that fits on no such split is refused
(DoesNotFit) before anything is uploaded. Each device receives only its own tensors' bytes, straight from the file, still quantized, and
dequantizes them itself, as tinygrad.llm does on one device (it copies the whole file to the default device first: not here).
place() puts a Transformer built otherwise (its own weights) over devices the same way. `python -m client run --runner a,b -m tinygrad.llm`
uses this for tinygrad's app (across_runners()); with one runner nothing here is imported.
"""
from __future__ import annotations
import contextlib, dataclasses, io, mmap, os, pathlib, re, sys, time
from tinygrad import Device, Tensor, TinyJit, dtypes, nn
from tinygrad.helpers import DEBUG, round_up
from client.discovery import RunnerUnavailable

HEADROOM = 4 << 20   # bytes each runner keeps free beyond weights and KV cache: the step's activations and scratch buffers (measured below)

class DoesNotFit(RunnerUnavailable): pass   # one line and exit code 1 when uncaught, as for a runner that cannot be used

def shortfall(total:int, memory:list) -> str:
  """How much memory the runners lack for a model of total bytes in all, for DoesNotFit's line ("" where a runner sets no limit)."""
  if any(m is None for m in memory): return ""
  if total > sum(memory): return f": {mb(total - sum(memory))} short"
  return ": together they offer enough, but no split into contiguous ranges fits each runner's part"

@dataclasses.dataclass(frozen=True)
class Part:
  device: str
  addr: str            # the runner's address ("" for a device that is not a runner)
  blocks: range
  weights: int         # bytes of the file this device receives
  kv: int              # bytes of KV cache for its blocks
  memory: int|None     # what the runner offers (Rhello's memory), None: no limit known
  speed: float         # relative speed from the timing pass (1.0 when not measured)
  first: bool
  last: bool
  def what(self) -> str:
    b = f"blocks {self.blocks.start}-{self.blocks.stop - 1}" if len(self.blocks) else "no blocks"
    extra = [s for s, on in (("the embedding", self.first), ("the output norm and head", self.last)) if on]
    return f"{self.device} {self.addr or '(local)'} {' and '.join([b, *extra]) if extra else b}, {mb(self.weights)}"

@dataclasses.dataclass(frozen=True)
class Placement:
  parts: tuple[Part, ...]
  why: tuple[str, ...]   # DEBUG=1: what was measured and how the ranges were chosen
  def device_of(self, block:int) -> str: return next(p.device for p in self.parts if block in p.blocks)
  def __str__(self):
    return f"placement over {len(self.parts)} runner{'s' if len(self.parts) > 1 else ''}: " + "; ".join(p.what() for p in self.parts)

def mb(n:int) -> str: return f"{n / (1 << 20):.1f} MiB"

# *** the file: header and tensor table read on the host, nothing copied to a device

@dataclasses.dataclass(frozen=True)
class TensorInfo:
  name: str
  dims: tuple[int, ...]
  typ: int
  offset: int   # in the file
  nbytes: int

def read_gguf(path:str|pathlib.Path) -> tuple[dict, list[TensorInfo]]:
  """The metadata and the tensor table of a GGUF file, as tinygrad/llm/gguf.py's _gguf_parse reads them, from the file on the host."""
  from tinygrad.llm.gguf import readers, read_str, read_int32, read_int64, read_uint32, read_uint64, _GGML_NATIVE, _GGML_QUANT
  with open(path, "rb") as f:
    r = io.BufferedReader(f, 1 << 20)   # type: ignore[arg-type]
    magic, version, n_tensors, n_kv = r.read(4), read_int32(r), read_int64(r), read_int64(r)
    if magic != b"GGUF" or version not in (2, 3): raise ValueError(f"{path}: not a GGUF file (version 2 or 3)")
    kv = {}
    for _ in range(n_kv):
      k, typ = read_str(r), read_int32(r)
      kv[k] = readers[typ](r)
    infos = [(read_str(r), tuple(read_uint64(r) for _ in range(read_uint32(r))), read_int32(r), read_uint64(r)) for _ in range(n_tensors)]
    start = round_up(r.tell(), kv.get("general.alignment", 32))
  if kv.get("split.count", 1) > 1: raise ValueError(f"{path}: a multi-part GGUF cannot be placed over runners yet")
  def nbytes(dims, typ) -> int:
    n = 1
    for d in dims: n *= d
    if (dt:=_GGML_NATIVE.get(typ)) is not None: return dt.itemsize * n
    if (q:=_GGML_QUANT.get(typ)) is not None: return n // q[0] * q[1]
    raise ValueError(f"GGML type {typ} is not supported")
  return kv, [TensorInfo(nm, dims, typ, start + off, nbytes(dims, typ)) for nm, dims, typ, off in infos]

def block_of(name:str) -> int|None: return int(m.group(1)) if (m:=re.match(r"blk\.(\d+)\.", name)) else None
def is_head(name:str) -> bool: return name.split(".")[0] in ("output", "output_norm")

def kv_cache_bytes(kv:dict, max_context:int) -> int:
  """Bytes of one block's KV cache at max_context (tinygrad/llm/model.py: half (2, 1, kv heads, context, head dim); MLA: float (1, 1,
  context, kv_lora_rank + rope dim)); its rope table (float (context, rope dim)) is counted per device in HEADROOM's place."""
  arch = kv["general.architecture"]
  n_heads, n_kv = kv[f"{arch}.attention.head_count"], kv[f"{arch}.attention.head_count_kv"]
  n_kv = max(n_kv) if isinstance(n_kv, list) else n_kv
  if (lora:=kv.get(f"{arch}.attention.kv_lora_rank", 0)):
    return 4 * max_context * (lora + kv.get(f"{arch}.rope.dimension_count", 0))
  head_dim = kv.get(f"{arch}.attention.key_length", kv[f"{arch}.embedding_length"] // n_heads)
  return 2 * 2 * n_kv * max_context * head_dim

# *** what each runner offers, and how fast it is

def runner_of(device:str):
  """The device's runner connection (client/remote_metal.py's RemoteDevice), None for another device."""
  return getattr(Device[device], "runner", None)

SAME_SPEED = 0.8   # a runner timed at least this fraction of the fastest's speed counts as as fast: the pass is short, and noisy

def speeds(devices:tuple[str, ...], nbytes:int=8 << 20, reps:int=5) -> tuple[list[float], list[str]]:
  """A short timing pass: a matrix-vector product over nbytes of float16 weights (a decode step's kind of work) on each device, the
  median of reps after one that compiles it; speeds relative to the fastest (1.0; SAME_SPEED and above: 1.0), and the times for DEBUG."""
  times = []
  for d in devices:
    if (r:=runner_of(d)) is not None: nbytes = min(nbytes, r.info.memory // 8)
    k = 1024
    w = Tensor.ones(max(1, nbytes // (2 * k)), k, dtype=dtypes.half, device=d).contiguous().realize()
    x = Tensor.ones(1, k, dtype=dtypes.half, device=d).realize()
    ts = []
    for _ in range(reps + 1):
      Device[d].synchronize()
      t = time.perf_counter()
      (x @ w.T).sum().realize()
      Device[d].synchronize()
      ts.append(time.perf_counter() - t)
    times.append(sorted(ts[1:])[reps // 2])
    del w, x
    if hasattr(alloc:=Device[d].allocator, "free_cache"): alloc.free_cache()   # not kept for later: the runner's memory is the model's
  fastest = min(times)
  rel = [1.0 if fastest / t >= SAME_SPEED else fastest / t for t in times]
  return rel, [f"{d}: {t * 1e3:.2f} ms for a {mb(nbytes)} matrix-vector product" for d, t in zip(devices, times)]

# *** the split: contiguous ranges, within memory, the least time a token

def plan(devices:tuple[str, ...], block_bytes:list[int], kv_bytes:list[int], first_bytes:int, last_bytes:int, memory:list[int|None],
         speed:list[float], addrs:list[str]|None=None, headroom:int=HEADROOM, why:tuple[str, ...]=()) -> Placement:
  """Contiguous ranges of blocks, one per device in order, that fit in memory (weights + KV cache + headroom; the first device also holds
  first_bytes, the embedding, and the last last_bytes, the output norm and head) and make a token's time least: a decode step runs the
  ranges one after another, so that time is the sum of each device's work (bytes read per token / speed), and a faster device takes all
  it can hold (a split in proportion to speed, each device as busy as the others, would only pay where the devices worked at once).
  Among splits of equal time (equal speeds) the one whose busiest device has least work: an even split. Every device gets at least one
  block where there are enough. DoesNotFit if no split fits, naming what each runner offers and what is needed."""
  n, nb = len(devices), len(block_bytes)
  addrs = addrs or [""] * n
  pre = [0]
  for b in block_bytes: pre.append(pre[-1] + b)
  prekv = [0]
  for b in kv_bytes: prekv.append(prekv[-1] + b)
  def need(i:int, a:int, b:int) -> int:
    return pre[b] - pre[a] + prekv[b] - prekv[a] + headroom + (first_bytes if i == 0 else 0) + (last_bytes if i == n - 1 else 0)
  def cost(i:int, a:int, b:int) -> float:
    return (pre[b] - pre[a] + (first_bytes if i == 0 else 0) + (last_bytes if i == n - 1 else 0)) / speed[i]
  least = 1 if nb >= n else 0
  INF = (float("inf"), float("inf"))
  def better(x:tuple[float, float], y:tuple[float, float]) -> bool:   # (the sum, the largest) of the costs: the sum first, within rounding
    return x[0] < y[0] * (1 - 1e-9) or (x[0] <= y[0] * (1 + 1e-9) and x[1] < y[1])
  # best[i][j]: the least (sum, max) of the costs of blocks [0, j) on devices [0, i]; cut[i][j]: where device i's range starts
  best = [[INF] * (nb + 1) for _ in range(n)]
  cut = [[0] * (nb + 1) for _ in range(n)]
  for i in range(n):
    for j in range(nb + 1):
      for a in range(j + 1) if i else (0,):
        if j - a < least or (memory[i] is not None and need(i, a, j) > memory[i]): continue
        s, m = best[i - 1][a] if i else (0.0, 0.0)
        if better(c:=(s + (w:=cost(i, a, j)), max(m, w)), best[i][j]): best[i][j], cut[i][j] = c, a   # from an INF prefix: never better
  if best[n - 1][nb] == INF:
    offers = ", ".join(f"{addrs[i] or devices[i]} offers {mb(m) if m is not None else 'no limit'}" for i, m in enumerate(memory))
    raise DoesNotFit(f"metal_runner: the model does not fit on these runners ({offers}, per session: the runner's --session-mem): it "
                     f"needs {mb(pre[nb] + first_bytes + last_bytes)} of weights ({nb} blocks of up to {mb(max(block_bytes, default=0))}, the "
                     f"embedding {mb(first_bytes)} on the first runner, the output norm and head {mb(last_bytes)} on the last) and "
                     f"{mb(prekv[nb])} of KV cache, plus {mb(headroom)} of headroom on each runner: "
                     f"{mb(total := pre[nb] + first_bytes + last_bytes + prekv[nb] + n * headroom)} "
                     f"in all, in contiguous ranges of blocks{shortfall(total, memory)}; nothing was uploaded")
  parts, j = [], nb
  for i in reversed(range(n)):
    a = cut[i][j]
    parts.append(Part(devices[i], addrs[i], range(a, j), pre[j] - pre[a] + (first_bytes if i == 0 else 0) + (last_bytes if i == n - 1 else 0),
                      prekv[j] - prekv[a], memory[i], speed[i], i == 0, i == n - 1))
    j = a
  parts.reverse()
  rows = [f"{p.device}: {p.what()}, KV cache {mb(p.kv)}, offers {mb(p.memory) if p.memory is not None else 'no limit'}, speed {p.speed:.2f}, "
          f"work {cost(i, p.blocks.start, p.blocks.stop) / 1e6:.1f} MB/speed" for i, p in enumerate(parts)]
  return Placement(tuple(parts), (*why, f"headroom {mb(headroom)} per runner; ranges that fit and make a token's time (the sum of the "
                                         "runners' work) least:", *rows))

def plan_gguf(kv:dict, infos:list[TensorInfo], devices:tuple[str, ...], max_context:int, speed:bool=True) -> Placement:
  """plan() for a GGUF file over devices (runners): their memory from Rhello, their speed from speeds() (speed=False: all 1.0, so the
  memory alone bounds the ranges and the work is split evenly by bytes)."""
  nblocks = kv[f"{kv['general.architecture']}.block_count"]
  block_bytes = [0] * nblocks
  first = last = 0
  for t in infos:
    if (b:=block_of(t.name)) is not None and b < nblocks: block_bytes[b] += t.nbytes
    elif is_head(t.name): last += t.nbytes
    else: first += t.nbytes
  if not any(t.name == "output.weight" for t in infos):   # tied to the embedding: the last device gets the embedding's bytes too
    last += sum(t.nbytes for t in infos if t.name == "token_embd.weight")
  runners = [runner_of(d) for d in devices]
  memory = [r.info.memory if r is not None else None for r in runners]
  why = [f"{nblocks} blocks, {mb(sum(block_bytes))}; embedding and other tensors {mb(first)}; output norm and head {mb(last)}; KV cache "
         f"{mb(kv_cache_bytes(kv, max_context))} per block at max_context {max_context}"]
  args = (devices, block_bytes, [kv_cache_bytes(kv, max_context)] * nblocks, first, last, memory)
  addrs = [r.addr if r is not None else "" for r in runners]
  p = plan(*args, [1.0] * len(devices), addrs, why=tuple(why))   # DoesNotFit before the timing pass, and before any upload
  if not speed or len(devices) < 2: return p
  rel, times = speeds(devices)
  return plan(*args, rel, addrs, why=(*why, "timing pass: " + "; ".join(times)))

# *** loading: each device gets its own tensors' bytes, one upload per run of them in the file

def device_of(name:str, p:Placement) -> str:
  if (b:=block_of(name)) is not None and any(b in q.blocks for q in p.parts): return p.device_of(b)
  return p.parts[-1].device if is_head(name) else p.parts[0].device

def load_state(path:str|pathlib.Path, infos:list[TensorInfo], p:Placement) -> dict[str, Tensor]:
  """The state dict gguf_load would give, each tensor on its device: the raw bytes of each run of consecutive tensors of one device go
  from the file to that device (upload()), and the dequantization is lazy there, as on one device."""
  from tinygrad.llm.gguf import ggml_data_to_tensor
  from client.file_digests import FileDigests
  sd, disk, digests = {}, Tensor(pathlib.Path(path)), FileDigests(path)
  with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
    for d, ts in runs(infos, p):
      a = ts[0].offset
      raw = upload(disk, m, d, a, max(t.offset + t.nbytes for t in ts), digests)
      for t in ts: sd[t.name] = ggml_data_to_tensor(raw[t.offset - a:], prod(t.dims), t.typ).reshape(*reversed(t.dims))
  digests.save()
  return sd

def runs(infos:list[TensorInfo], p:Placement) -> list[tuple[str, list[TensorInfo]]]:
  """Each device's runs of consecutive tensors in the file, in the file's order: one upload each."""
  want = [(t, device_of(t.name, p)) for t in sorted(infos, key=lambda t: t.offset)]
  if not any(t.name == "output.weight" for t in infos):   # tied: the head reads the embedding's bytes on the last device
    want += [(dataclasses.replace(t, name="output.weight"), p.parts[-1].device) for t in infos if t.name == "token_embd.weight"]
  out: list[tuple[str, list[TensorInfo]]] = []
  for t, d in want:
    if out and out[-1][0] == d and out[-1][1][-1].offset + out[-1][1][-1].nbytes <= t.offset: out[-1][1].append(t)
    else: out.append((d, [t]))
  return out

def upload(disk:Tensor, m:mmap.mmap, device:str, a:int, b:int, digests) -> Tensor:
  """Bytes a to b of the file (disk, and m, its map) on device, as uint8. To a runner they go by content where its cache is on
  (docs/cache.md): the pieces' digests that the host's record holds (client/file_digests.py) are not computed again, and those computed
  now go into it. To another device, through tinygrad's DISK device."""
  if (r:=runner_of(device)) is None: return disk[a:b].to(device).realize()
  t = Tensor.empty(b - a, dtype=dtypes.uint8, device=device)
  h, off, _ = t.uop.buffer.ensure_allocated()._buf
  with memoryview(m) as mv:
    for o, n, d in r.write(h, off, mv[a:b], at=a, known=digests.get) or (): digests.add(o, n, d)
  return t

def prod(xs) -> int:
  n = 1
  for x in xs: n *= x
  return n

def from_gguf(path:str|pathlib.Path, devices:tuple[str, ...], max_context:int|None=None, realize:bool|None=None, speed:bool=True,
              say=print):
  """Transformer.from_gguf over devices: (model, kv, placement). The plan first (DoesNotFit before any upload), then each device's
  tensors, then tinygrad's own from_gguf on that state dict (its casts, tied head, RoPE permutation, config), then place().
  say(line) gets the placement line (None: not said); DEBUG=1 also says why."""
  from tinygrad.llm import model as llm
  kv, infos = read_gguf(path)
  p = plan_gguf(kv, infos, tuple(Device.canonicalize(d) for d in devices), context(kv, max_context), speed)
  announce(p, say)
  sd = load_state(path, infos, p)
  with patched(llm, "gguf_load", lambda fn: (kv, sd)), patched(nn.state, "load_state_dict", keep_devices(nn.state.load_state_dict)):
    model, kv = tinygrads_from_gguf()(path, max_context, **({} if realize is None else {"realize": realize}))
  place(model, p)
  return model, kv, p

def context(kv:dict, max_context:int|None) -> int:
  """The context the KV cache is made for: max_context, at most the model's own."""
  own = kv[f"{kv['general.architecture']}.context_length"]
  return own if max_context is None else min(max_context, own)

def announce(p, say):
  """The placement line to say (None: not said), and with DEBUG=1 why."""
  if say is None: return
  say(str(p))
  if DEBUG >= 1:
    for w in p.why: say(f"  {w}")

def keep_devices(load):
  """tinygrad's load_state_dict copies each tensor to the model's tensor's device (the default one): first move the model's tensor
  (still an unrealized placeholder) to where its state is, so that copy is none."""
  def f(model, state_dict, *args, **kwargs):
    for k, v in nn.state.get_state_dict(model).items():
      if k in state_dict and isinstance(d:=state_dict[k].device, str) and d != v.device: v.replace(Tensor.empty(*v.shape, dtype=v.dtype, device=d))
    return load(model, state_dict, *args, **kwargs)
  return f

@contextlib.contextmanager
def patched(obj, name:str, value):
  old = getattr(obj, name)
  setattr(obj, name, value)
  try: yield
  finally: setattr(obj, name, old)

def place(model, p:Placement):
  """The model's forward over p's devices: each block runs where its weights are (a tensor not there yet is moved), the hidden state goes
  to the next device at each range's start, the head on the last; the token comes back to the first device, which the next step reads.
  Each block's KV cache is made on its own device at first use (tinygrad/llm/model.py makes it on its input's device)."""
  first, last = p.parts[0].device, p.parts[-1].device
  devs = [p.device_of(i) for i in range(len(model.blk))]
  def move(obj, d:str):
    for t in nn.state.get_parameters(obj):
      if t.device != d: t.replace(t.to(d).realize())
  move(model.token_embd, first)
  for b, d in zip(model.blk, devs): move(b, d)
  move(model.output_norm, last)
  move(model.output, last)
  def forward(tokens:Tensor, start_pos, temperature:Tensor) -> Tensor:
    x = model.token_embd(tokens.to(first)).float()
    for b, d in zip(model.blk, devs): x = b(x.to(d), start_pos)
    logits = model.output(model.output_norm(x[:, -1:]))[:, -1, :]
    t = temperature.to(last)   # as tinygrad/llm/model.py's forward: Gumbel-max sampling, argmax at temperature 0
    return (logits / t.maximum(1e-12) - (Tensor.rand_like(logits).maximum(1e-12).log().neg()).log()).argmax(-1, keepdim=True).to(first)
  model.forward = forward
  model.prefill_jit, model.rollout_jit = TinyJit(forward), TinyJit(forward)
  return model

# *** tinygrad's app: Transformer.from_gguf of a file goes over the runners

def tinygrads_from_gguf():
  """tinygrad's own Transformer.from_gguf, also once across_runners() has replaced it."""
  from tinygrad.llm.model import Transformer
  return getattr(Transformer.from_gguf, "tinygrads", Transformer.from_gguf)

def answering(devices:tuple[str, ...]) -> tuple[str, ...]:
  """The devices whose runner still answers a ping (an error of an earlier request, reported with it, is not a lost runner)."""
  from client.connection import RunnerConnectionError, RunnerError
  alive = []
  for d in devices:
    for _ in range(3):
      try:
        runner_of(d).ping()
        alive.append(d)
        break
      except (RunnerConnectionError, OSError): break
      except RunnerError: continue
  return tuple(alive)

def survivors(rs) -> tuple[tuple[str, ...], str, list[tuple[str, str]]]:
  """The devices of the runners named at start that answer now (rs: client/rejoin.py's Runners; one that came back taken back as a new
  device, where it was; one lost watched for), the runners lost in words, and those taken back, [(address, device)]. DoesNotFit when
  none answers."""
  taken = rs.take_back(answering(rs.devices()))   # the runners back, as new devices, where they were
  alive = answering(rs.devices())
  rs.watch(gone:=[a for a in rs.addrs if rs.device[a] not in alive])
  lost = ", ".join(f"{rs.device[a]} {a}" for a in gone)
  if not alive: raise DoesNotFit(f"metal_runner: every runner is lost ({lost})")
  return alive, lost, taken

def layers_fit(kv:dict, infos:list[TensorInfo], alive:tuple[str, ...], max_context:int, lost:str):
  """DoesNotFit, naming the runners lost, when those that answer cannot hold the model split by layers: checked before the old model is
  let go, so a refusal leaves the server as it was."""
  try: plan_gguf(kv, infos, alive, max_context, False)
  except DoesNotFit as e: raise DoesNotFit(f"metal_runner: lost {lost}, and {str(e).removeprefix('metal_runner: ')}") from None

def let_go(drop, alive:tuple[str, ...], lost:str, taken:list[tuple[str, str]], say):
  """drop() lets go of the old model; its buffers, freed, go back to the runners that remain (their allocators' caches emptied), the
  default device becomes the first of them (default_device()), and the line says why the model is placed again."""
  import gc
  drop()
  gc.collect()
  for d in alive:
    if hasattr(alloc:=Device[d].allocator, "free_cache"): alloc.free_cache()
  default_device(alive[0])
  what = ([f"lost {lost}"] if lost else []) + [f"taking back runner {a} as {d}" for a, d in taken]
  say(f"metal_runner: {'; '.join(what) or 'the last request failed'}: placing the model again over "
      + (f"the {len(alive)} runner(s) that remain" if lost else f"all {len(alive)} runners named" if len(alive) > 1 else "the runner named"))

def default_device(d:str):
  """Tensors made without a device (tinygrad.llm's generate makes the prompt's tokens so) go to d from now on. tinygrad 0.14's default
  device has no index: DEV=REMOTE:1 reads as REMOTE with renderer '1', after which nothing compiles (the next request's connection was
  dropped when the first runner named was lost), and REMOTE itself is the lost runner's. So Device.DEFAULT answers d where d has one."""
  from tinygrad.device import _Device
  if not hasattr(_Device, "tinygrads_default"):
    _Device.tinygrads_default = own = _Device.DEFAULT   # type: ignore[attr-defined]
    _Device.DEFAULT = property(lambda self: getattr(self, "placed_default", None) or own.fget(self), own.fset)   # type: ignore[method-assign]
  Device.placed_default = d if ":" in d else None   # type: ignore[attr-defined]

def place_again(drop, path, rs, max_context, realize, speed:bool, say):
  """After a runner was lost, or once one lost answers again: the model again from the file, split by layers, over the runners named at
  start that answer now (survivors()), once drop() has let go of the old model and its buffers. DoesNotFit, naming the runners lost,
  when those that answer cannot hold it."""
  alive, lost, taken = survivors(rs)
  kv, infos = read_gguf(path)
  layers_fit(kv, infos, alive, context(kv, max_context), lost)
  let_go(drop, alive, lost, taken, say)
  return from_gguf(path, alive, max_context, realize, speed, say=say)[0]

def runner_devices() -> tuple[str, ...]:
  from client.discovery import runner_addrs
  dev = Device.DEFAULT.split(":")[0]
  return tuple(f"{dev}:{i}" for i in range(len(runner_addrs())))

def across_runners(speed:bool|None=None):
  """Transformer.from_gguf(path) places the model over every runner named (METAL_RUNNER), for tinygrad's app and any program that loads
  its model that way; a Tensor (a file already on a device) is left to tinygrad. The placement line goes to stderr.
  speed: the timing pass (default: unless METAL_RUNNER_PLACEMENT=memory)."""
  from tinygrad.llm.model import Transformer
  if speed is None: speed = os.environ.get("METAL_RUNNER_PLACEMENT", "") != "memory"
  def placed(gguf, max_context=None, realize=None):
    if isinstance(gguf, Tensor): return tinygrads(gguf, max_context, **({} if realize is None else {"realize": realize}))
    say = lambda s: print(s, file=sys.stderr)   # noqa: E731
    model, kv, p = from_gguf(gguf, runner_devices(), max_context, realize, speed, say=say)
    from client.rejoin import Runners
    model.runners = rs = Runners(tuple(q.device for q in p.parts), tuple(q.addr for q in p.parts), say)   # for the server: llm_serve.py
    rs.place_again = lambda drop: place_again(drop, gguf, rs, max_context, realize, speed, say)
    return model, kv
  placed.tinygrads = tinygrads = tinygrads_from_gguf()   # type: ignore[attr-defined]
  Transformer.from_gguf = staticmethod(placed)   # type: ignore[method-assign]
  from client.llm_serve import report_runner_faults
  report_runner_faults()   # its server: a runner lost while serving is an error that names it, not a stream cut short
