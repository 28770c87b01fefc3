# tinygrad's profiler shows runner kernels: with PROFILE=1 every kernel a runner ran (each kernel inside a TinyJit graph too) and every
# copy is in tinygrad's profile, timed by the runner and mapped onto the host's clock (client/profile.py, protocol.md Tprofile/Tclock).
import json, os, pickle, getpass, time
import pytest
from conftest import run_python
from client.profile import ClockMap

# Runs in a fresh python with PROFILE=1: spies on the Runner to note every kernel the client launched (a graph run launches each of
# its kernels), in order, with the host time of the call; then tinygrad's atexit writes the profile to $TMPDIR/profile.pkl.<user>.
SCRIPT = """
import json, time, numpy as np
import client.remote_metal as rm
from client.connection import Runner
from tinygrad import Tensor, TinyJit, Device
launched, graphs = [], {}
orig = Runner.launch, Runner.graph, Runner.graph_run
def launch(self, prog, *a, **k):
  launched.append(("launch", self._names[prog], time.perf_counter_ns()))
  return orig[0](self, prog, *a, **k)
def graph(self, gid, records):
  graphs[gid] = [self._names[r[0]] for r in records]
  return orig[1](self, gid, records)
def graph_run(self, gid, *a, **k):
  t = time.perf_counter_ns()
  launched.extend(("graph", n, t) for n in graphs[gid])
  return orig[2](self, gid, *a, **k)
Runner.launch, Runner.graph, Runner.graph_run = launch, graph, graph_run
dev = rm.runner_device()
t0 = time.perf_counter_ns()
x = Tensor(np.arange(4096, dtype=np.float32), device=dev).realize()
y = (x * 2 + 1).realize()
@TinyJit
def step(a):
  b = (a * 3).relu().contiguous()
  return (b + 1).sum().realize(), (b * b).max().realize()
for i in range(4):
  s, m = step(Tensor(np.arange(4096, dtype=np.float32) + i, device=dev))
  s.item(), m.item()
y.sum().item()
Device[dev].synchronize()
print(json.dumps({"dev": dev, "launched": launched, "t0": t0, "t1": time.perf_counter_ns()}))
"""

TOL_NS = 2_000_000  # the offset estimate is good to half a loopback round trip; this only has to catch a wrong mapping

def profiled_run(tmp_path, addr:str) -> tuple[dict, list]:
  r = run_python(SCRIPT, env={"PROFILE": "1", "METAL_RUNNER": addr, "TMPDIR": str(tmp_path)}, unset=("VIZ",))
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  with open(tmp_path / f"profile.pkl.{getpass.getuser()}", "rb") as f: return out, pickle.load(f)

def device_kernels(events:list, dev:str) -> list[tuple[str, str, int, int]]:
  """(kind, name, start ns, end ns) of every kernel range on dev, in profile order: ProfileRangeEvents and the entries of graphs."""
  from tinygrad.helpers import ProfileRangeEvent
  from tinygrad.device import ProfileGraphEvent
  out = []
  for e in events:
    if isinstance(e, ProfileRangeEvent) and e.device == dev: out.append(("launch", e.name, int(e.st * 1000), int(e.en * 1000)))
    if isinstance(e, ProfileGraphEvent) and e.ents[0].device == dev:
      out += [("graph", ent.name, int(e.sigs[ent.st_id] * 1000), int(e.sigs[ent.en_id] * 1000)) for ent in e.ents]
  return out

def check_profile(out:dict, events:list):
  from tinygrad.helpers import ProfileRangeEvent
  from tinygrad.device import ProfileDeviceEvent
  dev, launched = out["dev"], out["launched"]
  kernels = device_kernels(events, dev)
  # one event per kernel launched, in launch order, each kernel of a graph run its own, with the runner's measured duration
  assert [(k, n) for k, n, _ in launched] == [(k, n) for k, n, _, _ in kernels], (launched, kernels)
  assert sum(k == "graph" for k, *_ in kernels) >= 6, "the TinyJit step ran no runner graph"
  assert all(en > st for _, _, st, en in kernels), kernels
  assert all(b[2] >= a[3] for a, b in zip(kernels, kernels[1:])), "kernels of one session overlap or are out of order"
  # runner times mapped onto the host's: a kernel starts after the host issued it and ends before the host saw the work done
  for (_, name, issued), (_, _, st, en) in zip(launched, kernels):
    assert st >= issued - TOL_NS, f"{name} starts {(issued - st) / 1e6:.3f} ms before the host launched it"
    assert en <= out["t1"] + TOL_NS, f"{name} ends {(en - out['t1']) / 1e6:.3f} ms after the host synchronized"
  # the copies: the runner's side on <dev>:COPY (Twrite into, Rread out of its buffers), within the run
  copies = [e for e in events if isinstance(e, ProfileRangeEvent) and e.device == f"{dev}:COPY"]
  names = {e.name.display_name for e in copies}
  assert {f"TINY -> {dev}", f"{dev} -> TINY"} <= names, names
  assert all(out["t0"] - TOL_NS <= e.st * 1000 <= e.en * 1000 <= out["t1"] + TOL_NS for e in copies)
  assert {d.device for d in events if isinstance(d, ProfileDeviceEvent)} >= {dev, f"{dev}:COPY"}

@pytest.mark.cpu_only
def test_profile_holds_every_runner_kernel_and_copy(cpu_runner, tmp_path):
  check_profile(*profiled_run(tmp_path, cpu_runner))

@pytest.mark.metal
def test_profile_holds_every_metal_runner_kernel(metal_addr, tmp_path):
  # on Linux the Metal emulator (a test harness): its GPUStartTime/GPUEndTime are its own CPU times, not a GPU's
  check_profile(*profiled_run(tmp_path, metal_addr))

@pytest.mark.cpu_only
def test_profiling_off_sends_no_profile_request(cpu_runner):
  code = """
from client.connection import Runner
def refuse(*a, **k): raise AssertionError("a profile request without PROFILE")
Runner.clock = Runner.profile = refuse
import numpy as np, client.remote_metal as rm
from tinygrad import Tensor
print((Tensor(np.ones(64, dtype=np.float32), device=rm.runner_device()) * 3).sum().item())
"""
  r = run_python(code, env={"METAL_RUNNER": cpu_runner}, unset=("PROFILE", "VIZ"))
  assert r.returncode == 0 and r.stdout.strip().endswith("192.0"), r.stderr[-2000:]

class DriftingRunner:
  """A runner whose clock starts 5 s ahead of the host's and runs 100 ppm fast; its Tclock takes a round trip of 40 us or more."""
  def __init__(self): self.base = time.perf_counter_ns()
  def at(self, host:int) -> int: return 5_000_000_000 + host + (host - self.base) // 10_000
  def clock(self):
    t0 = time.perf_counter_ns()
    time.sleep(40e-6)
    t1 = time.perf_counter_ns()
    return t0, self.at((t0 + t1) // 2), t1

def test_clock_map_follows_drift():
  r = DriftingRunner()
  cm = ClockMap(r)
  cm.sample(8)
  time.sleep(0.3)
  cm.sample(8)
  (c0, o0, _), (c1, o1, _) = cm.points
  assert cm.rtt >= 40_000 and abs(o0 + 5_000_000_000) < 100_000
  host = (c0 + o0 + c1 + o1) // 2   # half way between the two estimates, where the drift since the first is about 15 us
  assert abs(cm.to_host(r.at(host)) - host) < 1_000
  assert abs(r.at(host) + o0 - host) > 10_000, "no drift to correct: the test proves nothing"
  # before the first estimate and after the last, the nearest offset holds
  assert cm.to_host(c0 - 10) == c0 - 10 + o0 and cm.to_host(c1 + 10) == c1 + 10 + o1
