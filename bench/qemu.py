"""Runners of other CPUs under qemu-user EMULATION against the native x86-64 runner, in one run: python3 bench/qemu.py [--steps N]

Every arm64 and riscv64 figure is measured under qemu-user on this x86-64 host (a test harness, not ARM or RISC-V hardware): it says
how the emulated runner compares with the native one here, nothing about a board. Per CPU:
  size       the stripped daemon (make -C daemon, make -C daemon cross; stripped with that CPU's strip), and its text+data (size(1)):
             the file of an arm64 build is padded to 64 KiB page alignment
  idle RSS   VmRSS of the runner process with no session; under qemu that process is qemu itself, so the figure includes qemu
             (its translator and code cache) as well as the guest daemon
  launches   pipelined launches of an empty kernel (2,000, then one sync), compiled for the CPU the runner reports
  MLP step   examples/train_mlp.py (TinyJit, batch 64, hidden 32) median step time after the JIT capture
The three runners run side by side and are measured in turn, repetition by repetition (--reps, default 5 for launches, 3 for the MLP),
so a busy machine slows all alike; figures are medians, ratios emulated / native are medians of the per-repetition ratios.
All runners use --no-confine (qemu-user refuses seccomp filters), the native one too, so the comparison is like for like.
Writes bench/results/qemu.json.
"""
from __future__ import annotations
import argparse, json, os, pathlib, re, shutil, signal, statistics, subprocess, sys, tempfile, time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from client import protocol as P  # noqa: E402
from client.connection import Runner  # noqa: E402
from client.cpu_image import clang_arch, cpu_image  # noqa: E402

CPUS = {"x86_64": (None, None, "strip", ROOT / "daemon" / "metal_runner"),
        "arm64": ("qemu-aarch64", "/usr/aarch64-linux-gnu", "aarch64-linux-gnu-strip", ROOT / "daemon" / "build" / "arm64" / "metal_runner"),
        "riscv64": ("qemu-riscv64", "/usr/riscv64-linux-gnu", "riscv64-linux-gnu-strip", ROOT / "daemon" / "build" / "riscv64" / "metal_runner")}

def start(cpu:str) -> tuple[subprocess.Popen, str]:
  qemu, sysroot, _, binary = CPUS[cpu]
  argv = ([qemu, "-L", sysroot] if qemu else []) + [str(binary), "--host", "127.0.0.1", "--port", "0", "--no-confine"]
  p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
  m = re.match(r"listening on (\S+)", p.stdout.readline())
  if m is None: stop(p); raise RuntimeError(f"{cpu} runner did not start")
  return p, m.group(1)

def stop(p:subprocess.Popen):
  if p.poll() is None:
    os.kill(p.pid, signal.SIGTERM)
    try: p.wait(10)
    except subprocess.TimeoutExpired: os.kill(p.pid, signal.SIGKILL); p.wait()

def stripped_size(cpu:str) -> int:
  with tempfile.TemporaryDirectory() as d:
    out = pathlib.Path(d) / "metal_runner"
    subprocess.check_call([CPUS[cpu][2], "-o", str(out), str(CPUS[cpu][3])])
    return out.stat().st_size

def text_data(cpu:str) -> int:
  tool = CPUS[cpu][2].replace("strip", "size")
  text, data = subprocess.check_output([tool, str(CPUS[cpu][3])], text=True).splitlines()[1].split()[:2]
  return int(text) + int(data)

def rss_kib(pid:int) -> int:
  return next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:"))

def launches(addr:str, n:int=2000) -> float:
  from tinygrad.runtime.support.compiler_cpu import ClangCompiler
  with Runner(addr, timeout=300) as r:
    obj = ClangCompiler(clang_arch(r.info.arch, r.info.cpu, r.info.features).split(",")).compile("void empty(float* restrict out) { }")
    arch, image, entry = cpu_image(obj, "empty")
    r.alloc(b:=r.new_handle(), 4096)
    r.load(prog:=r.new_handle(), P.PROG_CPU_IMAGE, "empty", image, 1, 0, entry=entry, arch=arch)
    r.sync()
    for _ in range(200): r.launch(prog, [(b, 0)], [])   # warm: qemu translates the daemon's code once
    r.sync()
    t = time.perf_counter()
    for _ in range(n): r.launch(prog, [(b, 0)], [])
    r.sync()
    return n / (time.perf_counter() - t)

def mlp_step_ms(addr:str, steps:int) -> float:
  out = subprocess.run([sys.executable, str(ROOT / "examples" / "train_mlp.py"), "--steps", str(steps), "--batch", "64", "--hidden", "32"],
                       env={**os.environ, "PYTHONPATH": str(ROOT), "METAL_RUNNER": addr}, capture_output=True, text=True, timeout=1200, check=True)
  return float(re.search(r"median step ([\d.]+) ms", out.stdout).group(1))

def main():
  os.environ["METAL_RUNNER_TOKEN_FILE"] = ""   # the runners measured here have no token: a client holding one (~/.metal_runner_token too) refuses
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--steps", type=int, default=20, help="MLP training steps per run")
  ap.add_argument("--reps", type=int, default=5)
  args = ap.parse_args()
  subprocess.check_call(["make", "-s", "-C", str(ROOT / "daemon")])
  subprocess.check_call(["make", "-s", "-C", str(ROOT / "daemon"), "cross"])
  cpus = [c for c in CPUS if not CPUS[c][0] or shutil.which(CPUS[c][0])]
  if missing:=set(CPUS) - set(cpus): print(f"{', '.join(sorted(missing))}: qemu is not installed, left out", file=sys.stderr)
  procs = {c: start(c) for c in cpus}
  res: dict[str, dict] = {}
  try:
    time.sleep(1.0)
    for c, (p, addr) in procs.items():
      res[c] = {"emulated": CPUS[c][0] is not None, "stripped_bytes": stripped_size(c), "text_data_bytes": text_data(c),
                "idle_rss_kib": rss_kib(p.pid)}
      with Runner(addr) as r: res[c]["reports"] = f"{r.info.arch} {r.info.cpu} {r.info.features}".strip()
    runs: dict[str, dict[str, list[float]]] = {c: {"launch": [], "mlp": []} for c in cpus}
    for rep in range(args.reps):
      for c in cpus: runs[c]["launch"].append(launches(procs[c][1]))
      if rep < 3:
        for c in cpus: runs[c]["mlp"].append(mlp_step_ms(procs[c][1], args.steps))
      print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr)
  finally:
    for p, _ in procs.values(): stop(p)
  base = runs["x86_64"]
  print(f"{'CPU':8} {'stripped':>9} {'text+data':>9} {'idle RSS':>9} {'launches/s':>11} {'ratio':>6} {'MLP ms/step':>11} {'ratio':>6}  reports")
  for c, r in res.items():
    r["launches_per_s"], r["mlp_step_ms"] = statistics.median(runs[c]["launch"]), statistics.median(runs[c]["mlp"])
    r["launch_ratio"] = statistics.median(a / b for a, b in zip(runs[c]["launch"], base["launch"]))
    r["mlp_ratio"] = statistics.median(a / b for a, b in zip(runs[c]["mlp"], base["mlp"]))
    r["runs"] = runs[c]
    tag = " (qemu-user, emulated)" if r["emulated"] else " (native)"
    print(f"{c:8} {r['stripped_bytes'] / 1024:7.1f}Ki {r['text_data_bytes'] / 1024:7.1f}Ki {r['idle_rss_kib'] / 1024:7.1f}Mi "
          f"{r['launches_per_s']:11,.0f} {r['launch_ratio']:6.2f} {r['mlp_step_ms']:11.2f} {r['mlp_ratio']:6.2f}  {r['reports']}{tag}")
  (ROOT / "bench" / "results").mkdir(exist_ok=True)
  (ROOT / "bench" / "results" / "qemu.json").write_text(json.dumps(res, indent=1))

if __name__ == "__main__": main()
