"""One model across runners (client/placement.py): tinygrad.llm's --benchmark through `python -m client run` on one CPU runner against
two and three holding a range of blocks each, and two tensor parallel (METAL_RUNNER_PLACEMENT=tp, client/placement_tp.py), in the same
run, alternating, as ratios; what each runner received against its share of the file; and runners of unequal speed (one shares its CPU
with a busy loop), the speed-aware placement against the memory-only one (METAL_RUNNER_PLACEMENT=memory); and the upload with
--cache-dir on the runners (upload_bench()). Also a section of bench/run.py (--only llmrunners).

  python3 bench/llm_runners.py [--reps 2] [--tokens 25] [--pin] [--upload-only [--upload-reps 5]] [--unequal-only]

The model is a GGUF from tests/ggufgen.py (8 blocks, dim 512, FFN 2048, 8 heads, vocabulary 4096: 47.7 MB, Q8_0 feed-forward, random
weights). A figure is the median of the decode steps after the first ten of one run (tokens/s), then the median over the reps; a ratio is
the median of the per-rep ratios against one runner. --pin: each runner pinned to a CPU (taskset, CPU i mod the CPUs), as
bench/multirunner.py pins them, and the client to the last CPU (unpinned, the scheduler's placement of the client decides more than the
runners do on two CPUs: docs/multi-runner.md); unpinned by default. Writes bench/results/llm_runners.json.

The upload (docs/cache.md, A model's upload): a larger GGUF (UPLOAD_MODEL, 178 MB) over two CPU runners started with --cache-dir, each
start a fresh `python -m client run` process (upload_worker.py's timing: client/placement.py's uploads of every run of the file, back to
back, then a sync of each runner); per rep, fresh runners and cache directories and a fresh host record, in this order: without the
cache (METAL_RUNNER_CACHE=0), the first upload with the cache (no host record, and the runners hold nothing: the client hashes only
each run's sample, connection.PROBE chunks), a restart (the same runners: their caches, and the host hashes the rest of the file once, as
it now saves sending), then new runners with empty caches and the host's record (a first upload to those runners that hashes nothing).
Before each start the page cache's dirty data is written out (upload()). Ratios are per rep against the same rep's upload without the cache, then the median; bytes are what
the client sent, against the weights.
"""
from __future__ import annotations
import argparse, json, os, pathlib, re, statistics, subprocess, sys, tempfile, time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
MODEL = dict(blocks=8, dim=512, ffn=2048, heads=8, kv_heads=8, vocab=4096)
UPLOAD_MODEL = dict(blocks=8, dim=1024, ffn=4096, heads=8, kv_heads=8, vocab=4096)

def log(*a): print(*a, file=sys.stderr, flush=True)

class Runner:
  """A CPU runner on 127.0.0.1 logging its sessions (-v) to a file, pinned to cpu if given."""
  def __init__(self, logs:pathlib.Path, name:str, cpu:int|None=None, *args:str):
    self.log = logs / f"{name}.log"
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    self.p = subprocess.Popen([*pin, os.environ.get("METAL_RUNNER_BIN") or str(ROOT / "daemon" / "metal_runner"), "--host", "127.0.0.1",
                               "--port", "0", "--backend", "cpu", "-v", *args], stdout=subprocess.PIPE, stderr=open(self.log, "w"), text=True)
    line = self.p.stdout.readline()
    if not line.startswith("listening on "): raise RuntimeError(f"runner {name} did not start: {line!r}")
    self.addr = line.split()[2]
  def bytes_in(self) -> list[int]: return [int(b) for b in re.findall(r"ended: .*?, (\d+) bytes in", self.log.read_text())]
  def stop(self):
    if self.p.poll() is None:
      self.p.terminate()
      try: self.p.wait(10)
      except subprocess.TimeoutExpired: self.p.kill()

def run(model:str, runners:list[Runner], tokens:int, env:dict|None=None, client_cpu:int|None=None) -> dict:
  before = [len(r.bytes_in()) for r in runners]
  e = {k: v for k, v in os.environ.items() if k not in ("DEV", "DEBUG", "METAL_RUNNER")}
  pin = ["taskset", "-c", str(client_cpu)] if client_cpu is not None else []
  p = subprocess.run([*pin, sys.executable, "-m", "client", "run", "--runner", ",".join(r.addr for r in runners), "-m", "tinygrad.llm", "--model",
                      model, "--max_context", "128", "--benchmark", str(tokens)], capture_output=True, text=True, cwd=str(ROOT),
                     env={**e, "PYTHONPATH": str(ROOT), "METAL_RUNNER_TOKEN_FILE": "", **(env or {})}, timeout=900)
  if p.returncode != 0: raise RuntimeError(f"the run failed: {p.stderr[-2000:]}")
  rates = [float(x) for x in re.findall(r"([\d.]+) tok/s", p.stdout)][10:]
  line = next((s for s in p.stderr.splitlines() if s.startswith("placement over")), "")
  time.sleep(0.6)   # the runner logs a session's end up to half a second after it
  got = [max(r.bytes_in()[b:], default=0) for r, b in zip(runners, before)]
  return {"tok_s": statistics.median(rates), "text": re.findall(r"--  (.*)", p.stdout)[-1], "placement": line, "bytes_in": got,
          "share_mib": [float(x) for x in re.findall(r", ([\d.]+) MiB(?:;|$)", line)]}

def bench(reps:int=2, tokens:int=25, pin:bool=False, upload_reps:int|None=None, unequal_only:bool=False) -> dict:
  sys.path.insert(0, str(ROOT / "tests"))
  from ggufgen import write
  ncpu = os.cpu_count() or 1
  with tempfile.TemporaryDirectory(prefix="llm-runners-") as d:
    dd = pathlib.Path(d)
    model = write(str(dd / "model.gguf"), **MODEL)
    out: dict = {"model": {**MODEL, "bytes": os.path.getsize(model)}, "pin": pin, "runs": []}
    rs = [] if unequal_only else [Runner(dd, f"r{i}", i % ncpu if pin else None) for i in range(4)]
    try:
      for rep in range(0 if unequal_only else reps):
        modes = [("one", rs[:1], None), ("two", rs[1:3], None), ("three", rs[1:4], None), ("tp", rs[1:3], {"METAL_RUNNER_PLACEMENT": "tp"})]
        for name, group, env in (modes if rep % 2 == 0 else modes[::-1]):
          log(f"rep {rep + 1}: {name} ...")
          out["runs"].append({"rep": rep, "mode": name, **run(model, group, tokens, env, client_cpu=ncpu - 1 if pin else None)})
    finally:
      for r in rs: r.stop()
    out["runs"] += unequal(dd, model, reps, tokens)
  if not unequal_only: out["upload"] = upload_bench(upload_reps or (3 if reps == 1 else 5))
  return out

def unequal(dd:pathlib.Path, model:str, reps:int, tokens:int) -> list[dict]:
  """Runners of unequal speed: the second shares its CPU with a busy loop (about half a CPU); the speed-aware placement against the
  memory-only one, alternating."""
  ncpu, runs = os.cpu_count() or 1, []
  hog = subprocess.Popen(["taskset", "-c", str(1 % ncpu), sys.executable, "-c", "while True: pass"])
  slow = [Runner(dd, "fast", 0 % ncpu), Runner(dd, "slow", 1 % ncpu)]
  try:
    for rep in range(reps):
      for name, env in (("speed", {}), ("memory", {"METAL_RUNNER_PLACEMENT": "memory"}))[::1 if rep % 2 == 0 else -1]:
        log(f"rep {rep + 1}: unequal runners, {name} placement ...")
        runs.append({"rep": rep, "mode": f"unequal_{name}", **run(model, slow, tokens, env)})
  finally:
    hog.kill()
    for r in slow: r.stop()
  return runs

def upload(model:str, runners:list[Runner], records:pathlib.Path, env:dict|None=None) -> dict:
  """One start: upload_worker.py under `python -m client run` over runners, the host's records in the folder records. The page cache's
  dirty data is written out first (os.sync): each start meets a disk with nothing of the earlier starts' stores still to write, which
  the kernel does 30 s after they were made, in the middle of a later rep's upload."""
  os.sync()
  e = {k: v for k, v in os.environ.items() if k not in ("DEV", "DEBUG", "METAL_RUNNER")}
  p = subprocess.run([sys.executable, "-m", "client", "run", "--runner", ",".join(r.addr for r in runners), str(HERE / "upload_worker.py"), model],
                     capture_output=True, text=True, cwd=str(ROOT), timeout=900,
                     env={**e, "PYTHONPATH": str(ROOT), "METAL_RUNNER_TOKEN_FILE": "", "METAL_RUNNER_DIGESTS": str(records), **(env or {})})
  if p.returncode != 0: raise RuntimeError(f"the upload failed: {p.stderr[-2000:]}")
  return json.loads(p.stdout.strip().splitlines()[-1])

def upload_bench(reps:int=5) -> dict:
  sys.path.insert(0, str(ROOT / "tests"))
  from ggufgen import write
  out: dict = {"runs": []}
  with tempfile.TemporaryDirectory(prefix="llm-upload-") as d:
    dd = pathlib.Path(d)
    model = write(str(dd / "model.gguf"), **UPLOAD_MODEL)
    os.utime(model, (time.time() - 60, time.time() - 60))   # the host records no file modified in the last 2 s (client/file_digests.py)
    out["model"] = {**UPLOAD_MODEL, "bytes": os.path.getsize(model)}
    for rep in range(reps):
      records, rs = dd / f"records{rep}", [Runner(dd, f"u{rep}.{i}", None, "--cache-dir", str(dd / f"cache{rep}.{i}")) for i in range(2)]
      try:
        log(f"upload rep {rep + 1}: without the cache, first with it, restart ...")
        for mode, env in (("no cache", {"METAL_RUNNER_CACHE": "0"}), ("first", {}), ("restart", {})):
          out["runs"].append({"rep": rep, "mode": mode, **upload(model, rs, records, env)})
      finally:
        for r in rs: r.stop()
      rs = [Runner(dd, f"v{rep}.{i}", None, "--cache-dir", str(dd / f"cachev{rep}.{i}")) for i in range(2)]
      try: out["runs"].append({"rep": rep, "mode": "first, host record", **upload(model, rs, records)})
      finally:
        for r in rs: r.stop()
  return out

def upload_summary(out:dict) -> list[str]:
  runs, w = out["runs"], out["runs"][0]["weights"]
  def of(mode): return [r for r in runs if r["mode"] == mode]
  lines = [f"upload of {w / 1e6:.1f} MB of weights ({out['model']['bytes'] / 1e6:.1f} MB GGUF) over 2 CPU runners with --cache-dir, "
           f"{len(of('first'))} reps, medians:"]
  for mode in ("no cache", "first", "restart", "first, host record"):
    rs = of(mode)
    ratio = statistics.median(r["s"] / b["s"] for r in rs for b in of("no cache") if b["rep"] == r["rep"])
    lines.append(f"{mode:<19} {statistics.median(r['s'] for r in rs):6.3f} s {statistics.median(w / r['s'] / 1e9 for r in rs):5.2f} GB/s"
                 f"  {1 / ratio:4.2f}x no cache  sent {statistics.median(sum(r['sent']) / w for r in rs) * 100:7.3f}% of the weights"
                 f"  client hashed {statistics.median(r['hashed'] for r in rs):g} pieces")
  return lines

def summary(out:dict) -> list[str]:
  if "runs" not in out: return upload_summary(out["upload"]) if "upload" in out else []
  runs = out["runs"]
  def med(mode): return statistics.median(r["tok_s"] for r in runs if r["mode"] == mode)
  def ratio(mode, base):
    return statistics.median(a["tok_s"] / b["tok_s"] for a in runs for b in runs if a["mode"] == mode and b["mode"] == base and a["rep"] == b["rep"])
  lines = [f"model: {out['model']['bytes'] / 1e6:.1f} MB GGUF; {'runners and client pinned' if out['pin'] else 'nothing pinned'}; tokens/s, median"]
  for mode, base in (("one", None), ("two", "one"), ("three", "one"), ("tp", "one"), ("unequal_memory", None), ("unequal_speed", "unequal_memory")):
    if not any(r["mode"] == mode for r in runs): continue
    pl = next(r["placement"] for r in runs if r["mode"] == mode)
    lines.append(f"{mode:<16} {med(mode):7.1f} tok/s" + (f"  {ratio(mode, base):.2f}x {base}" if base else "") + (f"  [{pl}]" if pl else ""))
  if texts:={r["text"] for r in runs if not r["mode"].startswith("unequal")}:
    lines.append("the same text in every mode" if len(texts) == 1 else "TEXTS DIFFER between modes")
  for r in runs:
    if r["share_mib"]:
      lines.append(f"{r['mode']} rep {r['rep'] + 1}: bytes received / share: " +
                   ", ".join(f"{g / (1 << 20):.1f}/{s:.1f} MiB ({g / (1 << 20) / s:.2f}x)" for g, s in zip(r["bytes_in"], r["share_mib"])))
  return lines + (upload_summary(out["upload"]) if "upload" in out else [])

if __name__ == "__main__":
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--tokens", type=int, default=25)
  ap.add_argument("--pin", action="store_true")
  ap.add_argument("--upload-only", action="store_true", help="only the upload with --cache-dir on the runners")
  ap.add_argument("--unequal-only", action="store_true", help="only the runners of unequal speed (speed-aware against memory-only)")
  ap.add_argument("--upload-reps", type=int, default=None, help="reps of the upload (default 5; 3 with --reps 1)")
  a = ap.parse_args()
  os.environ["METAL_RUNNER_TOKEN_FILE"] = ""
  res = {"upload": upload_bench(a.upload_reps or 5)} if a.upload_only else bench(a.reps, a.tokens, a.pin, a.upload_reps, a.unequal_only)
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "llm_runners.json").write_text(json.dumps(res, indent=1))
  print("\n".join(summary(res)))
