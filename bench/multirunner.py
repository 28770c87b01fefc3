"""Several runners as one: greedy decoding of tinygrad.llm's Transformer (bench/decode.py) on one runner against two, tensor parallel and
split by layers, in the same run, alternating, as ratios. Also a section of bench/run.py (--only multi).

  python3 bench/multirunner.py [--reps 3] [--widths small,wide] [--profiles loopback,10GbE,1GbE] [--tokens 60]

The analog of one Mac against two: the one runner is pinned to one CPU (taskset), and each of the two runners to a CPU of its own; the
client (this python, which renders, patches and reads) is not pinned. Widths: small (6 blocks, dim 512, FFN 1024, 8 heads, vocabulary
4096: 19.9 M parameters, where a token is milliseconds and the links' latency shows) and wide (4 blocks, dim 2048, FFN 8192, 16 heads:
compute dominates). Profiles: loopback, or bench/linkemu.c relays (a test harness: an EMULATED link on loopback, not a network) with
the profile's delay and rate, one in front of each runner for the client and one in front of each runner for the other runner's link
(METAL_RUNNER_PEER_VIA), so the runner-to-runner traffic crosses an emulated link too. Each run is a process of its own; a mode's figure
is the median over the reps, a ratio the median of the per-rep ratios against one runner. Prints a table and writes
bench/results/multirunner.json.
"""
from __future__ import annotations
import argparse, json, os, pathlib, statistics, subprocess, sys, time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
from netbench import PROFILES, Relay  # noqa: E402

WIDTHS = {"small": dict(blocks=6, dim=512, ffn=1024, heads=8, vocab=4096),
          "wide": dict(blocks=4, dim=2048, ffn=8192, heads=16, vocab=4096)}
TARGETS = {("small", "loopback", "tp"): 1.2, ("wide", "loopback", "tp"): 1.6, ("small", "10GbE", "tp"): 1.0}   # x one runner
SPLIT_TARGET = 0.97

def log(*a): print(*a, file=sys.stderr, flush=True)

class Runner:
  """A CPU runner on 127.0.0.1 pinned to one CPU."""
  def __init__(self, cpu:int, logs:pathlib.Path, name:str):
    self.p = subprocess.Popen(["taskset", "-c", str(cpu), str(ROOT / "daemon" / "metal_runner"), "--host", "127.0.0.1", "--port", "0",
                               "--backend", "cpu"], stdout=subprocess.PIPE, stderr=open(logs / f"{name}.log", "w"), text=True)
    line = self.p.stdout.readline()
    if not line.startswith("listening on "): raise RuntimeError(f"runner {name} did not start: {line!r}")
    self.addr = line.split()[2]
  def stop(self):
    if self.p.poll() is None:
      self.p.terminate()
      self.p.wait(10)

def decode(mode:str, width:dict, tokens:int, runners:list[str], env:dict) -> dict:
  argv = [sys.executable, str(HERE / "decode.py"), mode, "--tokens", str(tokens), "--warmup", "6"]
  argv += [x for k, v in width.items() for x in (f"--{k}", str(v))]
  if runners: argv += ["--runner", ",".join(runners)]
  r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
  if r.returncode != 0: raise RuntimeError(f"decode.py {mode} failed:\n{r.stderr[-3000:]}")
  return json.loads(r.stdout.splitlines()[-1])

def bench(reps:int, widths:list[str], profiles:list[str], tokens:int) -> dict:
  logs = RESULTS / "logs"
  logs.mkdir(parents=True, exist_ok=True)
  subprocess.run(["make", "-s", "-C", str(ROOT / "daemon"), "metal_runner"], check=True, stdout=subprocess.DEVNULL)
  subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-pthread", "-o", RESULTS / "linkemu", HERE / "linkemu.c"], check=True)
  env0 = {k: v for k, v in os.environ.items() if k not in ("METAL_RUNNER", "METAL_RUNNER_TOKEN_FILE", "DEV", "DEBUG", "BEAM")}
  env0["PYTHONPATH"] = str(ROOT)
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) < 2: raise RuntimeError("needs two CPUs: one per runner")
  out: dict = {"runs": []}
  for wname in widths:
    width, ntok = WIDTHS[wname], tokens if wname == "small" else max(8, tokens // 4)
    ref = decode("cpu", width, ntok, [], env0)   # tinygrad's own CPU device: the tokens every mode must give
    out["runs"].append({"width": wname, "profile": "-", "rep": 0, **ref})
    log(f"{wname}: tinygrad CPU device {ref['tok_per_s']:.1f} tokens/s")
    for pname in profiles:
      delay_ms, mbit = next((d, m) for n, d, m in PROFILES if n == pname)
      a, b = Runner(cpus[0], logs, f"multi-{wname}-{pname}-a"), Runner(cpus[1], logs, f"multi-{wname}-{pname}-b")
      relays: list[Relay] = []
      try:
        env, addrs = dict(env0), [a.addr, b.addr]
        if pname != "loopback":
          relays = [Relay(RESULTS / "linkemu", x, f"multi-{pname}-{i}", logs) for i, x in enumerate([a.addr, b.addr] * 2)]
          for r in relays: r.profile(delay_ms * 500, mbit)   # one-way delay: half the round trip
          addrs = [relays[0].addr, relays[1].addr]
          env["METAL_RUNNER_PEER_VIA"] = f"{relays[0].addr}={relays[2].addr},{relays[1].addr}={relays[3].addr}"
        for rep in range(reps):
          modes = ["one", "split", "tp"]
          modes = modes[rep % 3:] + modes[:rep % 3]   # alternate the order: the VM's drift does not favour one mode
          for mode in modes:
            res = decode(mode, width, ntok, addrs[:1] if mode == "one" else addrs, env)
            res["same_tokens"] = res["tokens"] == ref["tokens"]
            out["runs"].append({"width": wname, "profile": pname, "rep": rep, **res})
            log(f"{wname} {pname} rep {rep} {mode}: {res['tok_per_s']:.1f} tokens/s, {res['requests_per_tok']:.1f} requests and "
                f"{res['round_trips_per_tok']:.2f} round trips per token{'' if res['same_tokens'] else ', TOKENS DIFFER from the CPU device'}")
      finally:
        for r in relays: r.stop()
        a.stop(), b.stop()
  return out

def rows(out:dict) -> list[dict]:
  R = []
  runs = out["runs"]
  for w in dict.fromkeys(r["width"] for r in runs):
    cpu = next(r for r in runs if r["width"] == w and r["mode"] == "cpu")
    for p in dict.fromkeys(r["profile"] for r in runs if r["width"] == w and r["profile"] != "-"):
      sel = [r for r in runs if r["width"] == w and r["profile"] == p]
      one = {r["rep"]: r["tok_per_s"] for r in sel if r["mode"] == "one"}
      for m in ("one", "split", "tp"):
        ms = [r for r in sel if r["mode"] == m]
        ratio = statistics.median(r["tok_per_s"] / one[r["rep"]] for r in ms)
        target = TARGETS.get((w, p, m), SPLIT_TARGET if m == "split" else None)
        R.append({"width": w, "profile": p, "mode": m, "tok_per_s": statistics.median(r["tok_per_s"] for r in ms),
                  "min": min(r["tok_per_s"] for r in ms), "max": max(r["tok_per_s"] for r in ms), "vs_one": ratio,
                  "vs_cpu_device": statistics.median(r["tok_per_s"] for r in ms) / cpu["tok_per_s"],
                  "requests_per_tok": statistics.median(r["requests_per_tok"] for r in ms),
                  "round_trips_per_tok": statistics.median(r["round_trips_per_tok"] for r in ms),
                  "same_tokens": all(r["same_tokens"] for r in ms), "target": target,
                  "met": None if target is None else ratio >= target})
  return R

def table(R:list[dict], out:dict) -> str:
  L = ["Several runners as one: greedy decoding, tokens/s (median [min, max]); ratios against one runner in the same run",
       "(one runner on one CPU; two runners on a CPU each; emulated links are bench/linkemu.c relays, not a network)", "",
       "| width | link | mode | tokens/s | vs one runner | target | requests/token | round trips/token | tokens = CPU device's |",
       "|---|---|---|---|---|---|---|---|---|"]
  for r in R:
    t = "" if r["target"] is None else f">= {r['target']:.2f} {'met' if r['met'] else 'NOT met'}"
    L.append(f"| {r['width']} | {r['profile']} | {r['mode']} | {r['tok_per_s']:.1f} [{r['min']:.1f}, {r['max']:.1f}] | {r['vs_one']:.2f}x | {t} | "
             f"{r['requests_per_tok']:.1f} | {r['round_trips_per_tok']:.2f} | {'yes' if r['same_tokens'] else 'NO'} |")
  for w in dict.fromkeys(r["width"] for r in out["runs"]):
    cpu = next(r for r in out["runs"] if r["width"] == w and r["mode"] == "cpu")
    L.append(f"\n{w}: tinygrad's own CPU device (both CPUs) {cpu['tok_per_s']:.1f} tokens/s")
  return "\n".join(L)

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--widths", default="small,wide")
  ap.add_argument("--profiles", default="loopback,10GbE,1GbE")
  ap.add_argument("--tokens", type=int, default=60)
  a = ap.parse_args()
  t0 = time.time()
  out = bench(a.reps, a.widths.split(","), a.profiles.split(","), a.tokens)
  R = rows(out)
  out.update(rows=R, date=time.strftime("%Y-%m-%d %H:%M:%S %z"), seconds=round(time.time() - t0), reps=a.reps,
             git=subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip())
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "multirunner.json").write_text(json.dumps(out, indent=1))
  print(table(R, out))
  print(f"\n{out['date']}, {out['git']}, {a.reps} reps, {out['seconds']} s; figures: {RESULTS / 'multirunner.json'}")

if __name__ == "__main__":
  main()
