# graph.py: RemoteGraph, a TinyJit batch run as runner graphs. A batch may span several runners of one backend (a step sharded with
# Tensor.shard, or split by layers with .to()) and the COPY calls between them. Each runner gets one graph, and each copy between two
# runners becomes a link entry on both (protocol.md, Links between runners): a send on the source's graph, a receive on the destination's.
# So a JIT call is one Tgraphrun per runner, none waiting, and the data goes runner to runner; the host waits only where the program reads.
# Two runners that cannot reach each other copy through this host instead: the graphs are cut there, and the call sends the parts before
# the copy, reads from the source, writes to the destination, then goes on.
from __future__ import annotations
import sys, time
from typing import cast
from tinygrad.device import Buffer, Device, MultiBuffer
from tinygrad.engine.jit import GraphRunner, MultiGraphRunner
from tinygrad.helpers import DEBUG, dedup, suppress_finalizing
from tinygrad.uop.ops import Ops, UOp
from client.errors import RunnerError
from client.address import parse_addr
from client.settings import from_env
from client.protocol import CAP_LINK, EPEER, PATCH_BUF, PATCH_VAL, PATCH_GLOBAL, PATCH_LOCAL, PROG_LINK_SEND, PROG_LINK_RECV
from client.protocol import launch_dims, patch as pack_patch

LINK_TTL = 60   # seconds between a Tlisten and its Tdial (both are sent at once)

# (source, destination) runner addresses that cannot reach each other: their copies go through this host, and are not tried again
unreachable: set[tuple[str, str]] = set()

def peer_via() -> dict[str, str]:
  """METAL_RUNNER_PEER_VIA=ADDR=VIA[,...]: the runner this host reaches at ADDR is reached by other runners at VIA (a tunnel, a relay, or
  another interface). Unset, runners reach each other where this host reaches them."""
  return dict(from_env().peer_via)

def peer_addr(addr:str) -> tuple[str, int]: return parse_addr(peer_via().get(addr, addr))

class Part:
  """One runner graph: the entries of one runner between two copies through this host (all of them, when there is none)."""
  def __init__(self, dev):
    self.dev, self.records, self.gid = dev, [], None
    self.where: dict[tuple[int, int], tuple[int, int]] = {}   # (call, argument position) -> (entry, buffer index) for input patches

class RemoteGraph(MultiGraphRunner):
  """A TinyJit batch on one or more runners of one backend. The runner graphs are defined on the first call, when every symbolic value is
  known; each call then sends one Tgraphrun per graph, carrying only patches: JIT input buffers, symbolic values and launch dims."""
  def __init__(self, linear:UOp, input_uops:tuple[UOp, ...]=()):
    super().__init__(linear, input_uops)   # self.runtimes keeps the graph's RemotePrograms, so their handles stay loaded while it lives
    self.devs = dedup([Device[b.device] for _, _, bufs, _ in self.calls for b in bufs])
    self.parts: list[Part] = []
    self.links: list[tuple] = []     # (device, "unlink" or "unload", handle): each side's link and link program, freed with the graph
    self.plan: list = []             # Part to run, or (call index) of a copy through this host, in order
    self.bodies: dict[tuple, list] = {}
    self.faults = -1

  @staticmethod
  def supports_uop(batch_devs:list, new_call:UOp) -> bool:
    devs = GraphRunner._all_devs(batch_devs, new_call)
    # one backend: every device a runner of the same kind (tinygrad's METAL and REMOTE are both RemoteDevice: never batched together)
    if len({(type(d), getattr(d, "is_metal", None)) for d in devs}) != 1 or not hasattr(devs[0], "runner"): return False
    if new_call.src[0].op is Ops.PROGRAM: return True
    # a copy between two runners that have links; anything else (a copy within one runner, or a runner without links) ends the batch
    cdevs = GraphRunner._all_devs([], new_call)
    return new_call.src[0].op is Ops.COPY and len(cdevs) == 2 and all(d.runner.info.caps & CAP_LINK for d in cdevs)

  # *** definition: the plan, its parts and links

  def _define(self, var_vals:dict[str, int]):
    open_parts: dict = {}
    def part(dev) -> Part:
      if (p:=open_parts.get(dev)) is None:
        open_parts[dev] = p = Part(dev)
        self.plan.append(p)
      return p
    links: dict[tuple, tuple[int, int]|None] = {}   # (source, destination device) -> (send program, receive program), None: via host
    self.at: dict[int, list[tuple[Part, int]]] = {}   # call -> its (part, entry) for var and launch dims patches
    for j, ((_, ast, bufs, dvars), rt) in enumerate(zip(self.calls, self.runtimes)):
      if ast.op is Ops.PROGRAM:
        p = part(Device[bufs[0].device])
        gvars = {**var_vals, **dvars}
        vals = [0 if v.expr in ast.arg.runtimevars else gvars[v.expr] for v in ast.arg.vars]
        gs, ls = ast.arg.launch_dims(gvars)
        for k, a in enumerate(ast.arg.globals): p.where[(j, a)] = (len(p.records), k)
        self.at[j] = [(p, len(p.records))]
        p.records.append((rt.prog, [bufs[a]._buf[:2] for a in ast.arg.globals], vals, launch_dims(gs), launch_dims(ls or (1,1,1))))
        continue
      dest, src = bufs[0], bufs[1]   # a COPY between two runners
      sdev, ddev = Device[src.device], Device[dest.device]
      if (sdev, ddev) not in links: links[(sdev, ddev)] = self._link(sdev, ddev)
      if (progs:=links[(sdev, ddev)]) is None:   # through this host: every runner's part so far runs first (a part may wait on another)
        open_parts.clear()
        self.plan.append(j)
        continue
      sp, dp = part(sdev), part(ddev)
      sp.where[(j, 1)], dp.where[(j, 0)] = (len(sp.records), 0), (len(dp.records), 0)
      sp.records.append((progs[0], [src._buf[:2]], [dest.nbytes, j], (1,1,1), (1,1,1)))   # channel j: this copy's, in every run
      dp.records.append((progs[1], [dest._buf[:2]], [dest.nbytes, j], (1,1,1), (1,1,1)))
    self.plan = [p for p in self.plan if not isinstance(p, Part) or p.records]
    self.parts = [p for p in self.plan if isinstance(p, Part)]
    for p in self.parts:
      p.dev.runner.graph(gid:=p.dev.new_handle(), p.records)
      p.gid = gid
    # the patches of a call follow from its input buffers and symbolic values alone, so the Tgraphrun bodies are packed once per such set
    self.inputs = sorted({iidx for rep in self.uop_replace for _, iidx in rep})
    self.inpatch = [(p, *p.where[(j, pos)], iidx, self.calls[j][0]) for p in self.parts for j, rep in enumerate(self.uop_replace)
                    for pos, iidx in rep if (j, pos) in p.where]   # (part, entry, buffer index, input, device index of a sharded input)
    self.faults = sum(d.runner.link_faults for d in self.devs)

  def _link(self, sdev, ddev) -> tuple[int, int]|None:
    """A link from sdev's session to ddev's, with a program on each end: (send program, receive program); None when the two runners
    cannot reach each other (said once at DEBUG>=1), so their copies go through this host."""
    s, d = sdev.runner, ddev.runner
    if (s.addr, d.addr) in unreachable: return None
    grant, secret = d.listen(dl:=ddev.new_handle(), LINK_TTL)
    self.links.append((ddev, "unlink", dl))
    host, port = peer_addr(d.addr)   # the destination as this host reaches it, unless METAL_RUNNER_PEER_VIA says otherwise
    try: s.dial(sl:=sdev.new_handle(), host, port, grant, secret)
    except RunnerError as e:
      if e.code != EPEER: raise
      unreachable.add((s.addr, d.addr))
      if DEBUG >= 1: print(f"{sdev.device} -> {ddev.device}: {e}; copying through this host", file=sys.stderr)
      return None
    s.link_peers[sl], d.link_peers[dl] = d, s   # an EPEER of either end names the other runner when it stopped
    s.load(ps:=sdev.new_handle(), PROG_LINK_SEND, f"link {sl} to {ddev.device}", b"", 1, 2, entry=sl)
    d.load(pd:=ddev.new_handle(), PROG_LINK_RECV, f"link {dl} from {sdev.device}", b"", 1, 2, entry=dl)
    self.links += [(sdev, "unlink", sl), (sdev, "unload", ps), (ddev, "unload", pd)]
    return ps, pd

  def _free(self):
    for p in self.parts:
      if p.gid is not None: p.dev.later("graph_free", p.gid)
    for dev, request, h in self.links:
      if request == "unlink": dev.runner.link_peers.pop(h, None)
      dev.later(request, h)
    self.parts, self.links, self.plan, self.bodies = [], [], [], {}

  # *** a call

  def _bodies(self, input_uops:tuple[UOp, ...], var_vals:dict[str, int]) -> list[tuple[bytes, int]]:
    # each input's (handle, offset), per device for a sharded one: the key of the packed bodies
    bufs = {iidx: tuple(x._buf[:2] for x in b.bufs) if isinstance(b:=input_uops[iidx].buffer, MultiBuffer) else cast(Buffer, b)._buf[:2]
            for iidx in self.inputs}
    key = (*bufs.values(), *var_vals.items())
    if (packed:=self.bodies.get(key)) is not None: return packed
    patches: dict[Part, list[bytes]] = {p: [] for p in self.parts}
    for p, e, k, iidx, di in self.inpatch:
      b = bufs[iidx]
      patches[p].append(pack_patch(e, PATCH_BUF, k, *(b if type(b[0]) is int else b[di])))
    for j, i, v in self.updated_vars(var_vals):
      for p, e in self.at[j]: patches[p].append(pack_patch(e, PATCH_VAL, i, 0, v))
    for j, gs, ls in self.updated_launch_dims(var_vals):
      for p, e in self.at[j]:
        patches[p] += [pack_patch(e, kind, d, 0, x) for kind, size in ((PATCH_GLOBAL, launch_dims(gs)), (PATCH_LOCAL, launch_dims(ls)))
                       for d, x in enumerate(size)]
    if len(self.bodies) >= 64: self.bodies.clear()   # e.g. a symbolic value that keeps changing: bounded, packed anew
    packed = self.bodies[key] = [(b"".join(patches[p]), len(patches[p])) for p in self.parts]
    return packed

  def __call__(self, input_uops:tuple[UOp, ...], var_vals:dict[str, int], wait=False) -> float|None:
    if self.faults != sum(d.runner.link_faults for d in self.devs):   # a link broke (or was never made): new links, new graphs
      if self.plan: self._recover()
      self._free()
      self._define(var_vals)
    bodies = dict(zip(self.parts, self._bodies(input_uops, var_vals)))
    t0 = time.perf_counter()
    queued = []
    for step in self.plan:
      if isinstance(step, Part):
        if step.dev.profiler is not None: step.dev.profiler.issued(len(step.records))
        if len(self.plan) == 1: return step.dev.runner.graph_run(cast(int, step.gid), body=bodies[step], wait=wait)
        # queued, then sent to every runner at once: each starts as soon as it can, and none waits on a link for one not started yet
        step.dev.runner.graph_run(cast(int, step.gid), body=bodies[step], flush=False)
        queued.append(step.dev.runner)
      else:
        for r in queued: r.flush()
        queued = []
        self._host_copy(step, input_uops)
    for r in queued: r.flush()
    if not wait: return None
    for d in self.devs: d.runner.sync()
    return time.perf_counter() - t0

  def _recover(self):
    """A link broke in an earlier run: EPEER, raised to the program by the call that saw it. The other runners' errors of that run
    (their end of the link broke too) are its echo, not news: take them now, so the next run starts clean."""
    for d in self.devs:
      try: d.runner.sync()
      except RunnerError as e:
        if any(x.code != EPEER for x in [e, *getattr(e, "others", [])]): raise

  def _host_copy(self, j:int, input_uops:tuple[UOp, ...]):
    """Copy j as tinygrad would outside a graph: the allocator's _transfer, which goes through this host for an unreachable pair."""
    bufs = list(self.calls[j][2])
    for pos, iidx in self.uop_replace[j]:   # a JIT input copied: this call's buffer
      b = input_uops[iidx].buffer
      bufs[pos] = b.bufs[self.calls[j][0]] if isinstance(b, MultiBuffer) else b
    dest, src = bufs[0], bufs[1]
    dest.allocator._transfer(dest._buf, src._buf, dest.nbytes, src_dev=Device[src.device], dest_dev=Device[dest.device])

  @suppress_finalizing
  def __del__(self): self._free()
