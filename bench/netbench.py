"""bench/run.py --only network: the runner over emulated network links, next to local tinygrad and tinygrad 0.11.0's REMOTE.

Every link is bench/linkemu.c, a relay on 127.0.0.1 (a test harness: an EMULATED link, not a network): a one-way delay each way, a
rate, a delay queue. One relay sits in front of each server (this runner, 0.11's REMOTE server, a C echo server and a C stream sink);
all switch profile together, so each worker keeps its connection, its compiled kernels and its model across profiles. For each profile:
  1. the relay itself: its delay is calibrated so a C echo round trip through it hits the profile's RTT (one correction for the
     relay's own latency), then the RTT (C echo, 64 B) and rate (C stream) through it are measured: the "emulated" columns
  2. for this runner (0.14 REMOTE) and 0.11 REMOTE, each in its own process (bench/link_worker.py): the TinyJit MLP step reading the
     loss every step and syncing every 50 steps; a weight upload (one Allocator._copyin, about 1 s of link time, 4 to 64 MiB); LLM
     decoding (link_worker.LLM, ~20 M parameters, random weights); BEAM=2 of one matmul (not on the WAN profile, where its timing
     round trips take minutes); the same LLM split by layers over two runners (llm2: a pipeline, link_worker.place_split; the hidden
     state goes through this host), and the MLP step with the loss realized with the update (mlp_fused: the same kernels in 0.11 and
     0.14). Sharding the LLM's weights (Tensor.shard) fails or decodes wrong tokens in tinygrad 0.14 itself unless every weight is
     replicated: bench/shard_repro.py
Local tinygrad CPU (0.14) runs the same MLP, LLM and BEAM once, without a link: the "local" term of the ideal line
  ideal = local time + round trips x RTT + bytes / rate
with this runner's measured round trips and bytes per step (Runner.stats()) and the emulator's measured RTT and rate; and a stricter
"floor" line with this runner's own loopback time (less its loopback round trips) as the local term, since tinygrad 0.14's CPU device
has no graph and is often slower than the runner. Each figure is the median of 3 runs, the two remote sides alternating.
"""
from __future__ import annotations
import json, os, pathlib, statistics, subprocess, sys, time

HERE = pathlib.Path(__file__).resolve().parent
MIB = 1 << 20
# name, RTT ms, rate Mbit/s (0: none)
PROFILES = [("loopback", 0.0, 0), ("10GbE", 0.05, 10000), ("1GbE", 0.3, 1000), ("Wi-Fi", 3.0, 300), ("WAN/ssh", 30.0, 50)]
LLM_TOKENS, MLP_STEPS = 20, 50

class Relay:
  """bench/linkemu in front of target; profile() switches it (and its open connections)."""
  def __init__(self, exe, target:str, name:str, logs:pathlib.Path):
    self.p = subprocess.Popen([str(exe), target, "0", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(logs / f"{name}.log", "w"),
                              text=True)
    line = self.p.stdout.readline()
    if not line.startswith("listening on "): raise RuntimeError(f"linkemu for {name} did not start: {line!r}")
    self.addr = line.split()[2]
    self.port = int(self.addr.rsplit(":", 1)[1])
  def profile(self, delay_us:float, mbit:float, jitter_us:float=0):
    self.p.stdin.write(f"{delay_us} {mbit} {jitter_us}\n")
    self.p.stdin.flush()
    if (r := self.p.stdout.readline().strip()) != "ok": raise RuntimeError(f"linkemu: {r!r}")
  def stop(self):
    if self.p.poll() is None:
      self.p.terminate()
      self.p.wait(5)

def bench_network(R, runner, log, quick:bool=False, only:str|None=None):
  """R: bench/run.py (its Proc, Worker, add, FIG, RESULTS, LOGS, INFO, tg_env)."""
  import remote011 as r011
  subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-pthread", "-o", R.RESULTS / "linkemu", HERE / "linkemu.c"], check=True)
  emu = R.RESULTS / "linkemu"
  procs, relays, sides = [], {}, {}
  env0 = {**R.tg_env(os.environ), "IGNORE_BEAM_CACHE": "1", "PYTHONPATH": str(HERE.parent)}
  try:
    procs.append(echo := R.Proc([R.RESULTS / "echo", "server"], name="net-echo"))
    procs.append(sink := R.Proc([R.RESULTS / "echo", "sink", "0"], name="net-sink"))
    py011 = r011.setup(sys.stderr)
    procs.append(s011 := R.Proc([py011, HERE / "remote011.py", "server"], env=R.tg_env(os.environ, REMOTEDEV="CPU"), name="net-remote011-server"))
    # the second runner and 0.11 server, for the LLM split by layers over two devices (REMOTE:1), each behind its own relay
    procs.append(runner2 := R.Proc([R.DAEMON, "--host", "127.0.0.1", "--port", "0", "--backend", "cpu"], name="net-runner2"))
    procs.append(s011b := R.Proc([py011, HERE / "remote011.py", "server"], env=R.tg_env(os.environ, REMOTEDEV="CPU"), name="net-remote011-server2"))
    for name, target in (("runner", runner.addr), ("runner2", runner2.addr), ("r011", s011.addr), ("r011b", s011b.addr),
                         ("echo", f"127.0.0.1:{echo.port}"), ("sink", f"127.0.0.1:{sink.port}")):
      relays[name] = Relay(emu, target, name, R.LOGS)
    sides["remote"] = R.Worker([sys.executable, HERE / "link_worker.py", "REMOTE"],
                               {**env0, "DEV": "REMOTE", "METAL_RUNNER": f"{relays['runner'].addr},{relays['runner2'].addr}"}, "net-remote")
    sides["r011"] = R.Worker([py011, HERE / "link_worker.py", "REMOTE"],
                             {**env0, "REMOTE": "1", "HOST": f"{relays['r011'].addr}*1,{relays['r011b'].addr}*1"}, "net-r011")
    sides["cpu"] = R.Worker([sys.executable, HERE / "link_worker.py", "CPU"], {**env0, "DEV": "CPU"}, "net-cpu")
    for w in sides.values(): w.ready(600)
    for w in sides.values(): w.ask("beam", 1800)   # untimed: BEAM's first search starts its compile workers
    out: dict = {"profiles": [], "local": {}}
    # local CPU, no link
    cpu = sides["cpu"]
    out["local"] = {"mlp_item": median_run([cpu.ask(f"mlp_item {MLP_STEPS}", 600) for _ in range(REPS)]),
                    "mlp_sync": median_run([cpu.ask(f"mlp_sync {MLP_STEPS * 2}", 600) for _ in range(REPS)]),
                    "mlp_fused": median_run([cpu.ask(f"mlp_fused {MLP_STEPS * 2}", 600) for _ in range(REPS)]),
                    "llm": median_run([cpu.ask(f"llm {LLM_TOKENS}", 900) for _ in range(REPS)]), "beam": cpu.ask("beam", 1800)}
    log(f"  local CPU: mlp {out['local']['mlp_item'].get('steps_per_s', 0):.0f}/{out['local']['mlp_sync'].get('steps_per_s', 0):.0f} steps/s, "
        f"llm {out['local']['llm'].get('tok_per_s', 0):.1f} tok/s, beam {out['local']['beam'].get('seconds', 0):.1f} s")
    for r in relays.values(): r.profile(0, 0)
    out["relay_rtt_us"] = R.echo_rtt(relays["echo"].port, 500)["median_us"]   # the relay's own round trip (the floor line), on any profiles
    for pname, rtt_ms, mbit in [p for p in (PROFILES[:1] + PROFILES[2:4] if quick else PROFILES) if only is None or p[0] in only.split(",")]:
      t0 = time.time()
      delay = rtt_ms * 500.0   # µs one way
      for r in relays.values(): r.profile(delay, mbit)
      n = 500 if rtt_ms < 1 else 60 if rtt_ms < 10 else 20
      meas, excess, target = R.echo_rtt(relays["echo"].port, n)["median_us"], 0.0, rtt_ms * 1000
      for _ in range(3 if rtt_ms > 0 else 0):
        # correct for the relay's own latency and late wakeups, until within 5%; the correction is bounded, so that one RTT measured
        # during a burst of load on this shared machine cannot throw the profile far off
        if abs(meas - target) <= 0.05 * target: break
        excess = min(max(excess + meas - target, 0.0), 0.5 * target + 60)
        delay = max(0.0, rtt_ms * 500.0 - excess / 2)
        for r in relays.values(): r.profile(delay, mbit)
        meas = R.echo_rtt(relays["echo"].port, n)["median_us"]
      nbytes = int(min(256 * MIB, max(4 * MIB, (mbit or 8000) * 1e6 / 8 * 0.5)))
      rate = R.echo_stream(relays["sink"].port, nbytes, 0)["gbps"]
      if rtt_ms == 0: out["relay_rtt_us"] = meas   # measured again with the loopback profile's runs
      prof = {"name": pname, "rtt_ms": rtt_ms, "mbit": mbit, "delay_us": delay, "emu_rtt_us": meas, "emu_gbps": rate, "sides": {}}
      load_bytes = int(min(64 * MIB, max(4 * MIB, (mbit or 8000) * 1e6 / 8 * 1.0))) // MIB * MIB
      runs: dict = {"remote": {}, "r011": {}, "cpu": {}, "base": {}}
      for rep in range(REPS):
        # in turn, so that all see the same load on this shared machine: this runner with the relays switched to no delay and no rate
        # limit ("base": the floor line's local term, taken now rather than at another time), then, on the profile, this runner,
        # 0.11 REMOTE and local tinygrad CPU (the ideal line's local term), the two remote sides swapping places run by run
        for r in relays.values(): r.profile(0, 0)
        for wl, cmd in (("mlp_item", f"mlp_item {MLP_STEPS}"), ("mlp_sync", f"mlp_sync {MLP_STEPS * 2}"), ("mlp_fused", f"mlp_fused {MLP_STEPS * 2}"),
                        ("llm", f"llm {LLM_TOKENS}"), ("llm2", f"llm2 {LLM_TOKENS}")):
          runs["base"].setdefault(wl, []).append(sides["remote"].ask(cmd, 900))
        for r in relays.values(): r.profile(delay, mbit)
        for side in (("remote", "r011", "cpu") if rep % 2 == 0 else ("r011", "remote", "cpu")):
          w, res = sides[side], runs[side]
          res.setdefault("mlp_item", []).append(w.ask(f"mlp_item {MLP_STEPS}", 900))
          res.setdefault("mlp_sync", []).append(w.ask(f"mlp_sync {MLP_STEPS * 2}", 900))
          res.setdefault("mlp_fused", []).append(w.ask(f"mlp_fused {MLP_STEPS * 2}", 900))
          if side != "cpu": res.setdefault("load", []).append(w.ask(f"load {load_bytes}", 900))
          res.setdefault("llm", []).append(w.ask(f"llm {LLM_TOKENS}", 1800))
          if side != "cpu": res.setdefault("llm2", []).append(w.ask(f"llm2 {LLM_TOKENS}", 1800))
          if rtt_ms < 10 and rep == 0: res.setdefault("beam", []).append(w.ask("beam", 1800))
      prof["sides"] = {side: {k: median_run(v) for k, v in res.items()} for side, res in runs.items()}
      prof["seconds"] = time.time() - t0
      out["profiles"].append(prof)
      rm, ro = prof["sides"]["remote"], prof["sides"]["r011"]
      log(f"  {pname}: emulated RTT {meas / 1000:.3f} ms, {rate * 8:.2f} Gbit/s; mlp item {rm['mlp_item'].get('steps_per_s', 0):.0f} vs 0.11 "
          f"{ro['mlp_item'].get('steps_per_s', 0):.0f} steps/s; llm {rm['llm'].get('tok_per_s', 0):.1f} vs "
          f"{ro['llm'].get('tok_per_s', 0):.1f} tok/s; "
          f"load {rm['load'].get('gbps', 0) * 8:.2f} vs {ro['load'].get('gbps', 0) * 8:.2f} Gbit/s ({prof['seconds']:.0f} s)")
    return out
  finally:
    for w in sides.values():
      try: w.stop()
      except Exception: pass
    for r in relays.values(): r.stop()
    for p in procs: p.stop()

REPS = 3
MAIN = {"steps_per_s", "gbps", "tok_per_s", "seconds"}

def median_run(runs:list[dict]) -> dict:
  """The run whose main figure is the median of the runs (all runs' figures kept under "runs")."""
  ok = [r for r in runs if "error" not in r]
  if not ok: return runs[0]
  key = next(k for k in ok[0] if k in MAIN)
  ok.sort(key=lambda r: r[key])
  return {**ok[len(ok) // 2], "runs": [r[key] for r in ok]}

# *** derived figures: the ideal line, ratios, round trips per step

def derive(out:dict) -> list[dict]:
  """One row per profile and workload: this runner, 0.11 REMOTE, ideal, ratios, round trips and bytes per step."""
  rows = []
  for p in out["profiles"]:
    rtt_s, bps = p["emu_rtt_us"] * 1e-6, p["emu_gbps"] * 1e9
    for wl, unit_key, per in (("mlp_item", "steps", "step"), ("mlp_sync", "steps", "step"), ("mlp_fused", "steps", "step"),
                              ("llm", "tokens", "token"), ("llm2", "tokens", "token")):
      rm, ro = p["sides"]["remote"].get(wl, {}), p["sides"]["r011"].get(wl, {})
      loc = p["sides"].get("cpu", out["local"])   # local tinygrad measured with this profile's runs
      lwl = "llm" if wl == "llm2" else wl   # the split model's local term: the same model on one local CPU device
      if not rm or "error" in rm or lwl not in loc or "error" in loc[lwl]: continue
      n, tok = rm[unit_key], wl.startswith("llm")
      t_loc = 1 / (loc[lwl]["steps_per_s"] if not tok else loc[lwl]["tok_per_s"])
      t_rm = 1 / (rm["steps_per_s"] if not tok else rm["tok_per_s"])
      t_ro = (1 / (ro["steps_per_s"] if not tok else ro["tok_per_s"])) if ro and "error" not in ro else None
      st = rm["stats"]
      rt, byts = st["round_trips"] / n, (st["bytes_sent"] + st["bytes_received"]) / n
      ideal = t_loc + rt * rtt_s + (byts / bps if p["mbit"] else 0)
      # the stricter line: this runner's own time on the loopback profile (less its round trips there) in place of local tinygrad
      lr, floor = p["sides"].get("base", {}).get(wl, {}), None
      if lr and "error" not in lr:
        t_lo = 1 / (lr["steps_per_s"] if not tok else lr["tok_per_s"]) - lr["stats"]["round_trips"] / lr[unit_key] * out["relay_rtt_us"] * 1e-6
        floor = t_lo + rt * rtt_s + (byts / bps if p["mbit"] else 0)
      rows.append({"profile": p["name"], "rtt_ms": p["emu_rtt_us"] / 1000, "workload": wl, "per": per, "local_ms": t_loc * 1e3,
                   "runner_ms": t_rm * 1e3,
                   "r011_ms": t_ro * 1e3 if t_ro else None, "ideal_ms": ideal * 1e3, "round_trips": rt, "bytes": byts,
                   "vs_ideal": t_rm / ideal, "r011_vs_runner": (t_ro / t_rm) if t_ro else None,
                   "floor_ms": floor * 1e3 if floor else None, "vs_floor": t_rm / floor if floor else None,
                   "rt_by_dev": {d: v["round_trips"] / n for d, v in rm.get("stats_by_dev", {}).items()}})
  return rows

def table(out:dict) -> str:
  L = ["", "7. Over emulated links (bench/linkemu.c, a relay on loopback: emulated, not a real network)"]
  L.append(f"{'profile':<9} {'target RTT':>10} {'emulated RTT':>12} {'target rate':>11} {'emulated rate':>13}")
  for p in out["profiles"]:
    L.append(f"{p['name']:<9} {p['rtt_ms']:>8.2f}ms {p['emu_rtt_us'] / 1000:>10.3f}ms {(str(p['mbit']) + ' Mb/s') if p['mbit'] else '-':>11} "
             f"{p['emu_gbps'] * 8:>9.2f} Gb/s")
  L.append("")
  L.append(f"{'profile':<9} {'workload':<9} {'local':>8} {'runner':>8} {'ideal':>8} {'run/ideal':>9} {'floor':>8} {'run/floor':>9} {'0.11':>9} "
           f"{'0.11/run':>8} {'RT/step':>7} {'B/step':>8}  (ms per step or token)")
  for r in derive(out):
    L.append(f"{r['profile']:<9} {r['workload']:<9} {r['local_ms']:>8.2f} {r['runner_ms']:>8.2f} {r['ideal_ms']:>8.2f} {r['vs_ideal']:>9.2f} "
             f"{(r['floor_ms'] or 0):>8.2f} {(r['vs_floor'] or 0):>9.2f} {(r['r011_ms'] or 0):>9.2f} {(r['r011_vs_runner'] or 0):>8.2f} "
             f"{r['round_trips']:>7.3f} {r['bytes']:>8.0f}" + (f"  RT per connection: {r['rt_by_dev']}" if r["rt_by_dev"] else ""))
  L.append("")
  L.append(f"{'profile':<9} {'load GB/s':>9} {'of link':>7} {'0.11 GB/s':>9} {'BEAM=2 s':>8} {'0.11 s':>7} {'local s':>7}")
  loc = out["local"]
  for p in out["profiles"]:
    rm, ro = p["sides"]["remote"], p["sides"]["r011"]
    g = rm["load"].get("gbps", 0)
    L.append(f"{p['name']:<9} {g:>9.3f} {g / p['emu_gbps']:>7.2f} {ro['load'].get('gbps', 0):>9.3f} "
             f"{rm.get('beam', {}).get('seconds', float('nan')):>8.2f} "
             f"{ro.get('beam', {}).get('seconds', float('nan')):>7.2f} {loc['beam'].get('seconds', float('nan')):>7.2f}")
  if out["profiles"]:
    rm, ro = out["profiles"][0]["sides"]["remote"]["llm"], out["profiles"][0]["sides"]["r011"]["llm"]
    L.append(f"LLM: {rm.get('params', 0) / 1e6:.1f} M parameters, {rm.get('bytes', 0) / MIB:.0f} MiB of float32 weights uploaded in "
             f"{rm.get('load_s', 0):.2f} s (0.11: {ro.get('load_s', 0):.2f} s) on the first profile ({out['profiles'][0]['name']})")
  return "\n".join(L)
