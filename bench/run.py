"""metal_runner benchmark: python3 bench/run.py [--quick] [--only SECTIONS] [--compare REV] [--remote011]

Runs on loopback against CPU-backend runners it starts itself, prints one table, writes bench/results/latest.json and draws
bench/results/latest.png. Every figure is the median of repeated runs, shown with their min and max; every comparison is a ratio of
figures measured in the same run, interleaved run by run (round trips and streams in short alternating blocks), so that a busy machine
slows both sides alike. It never fails on a number; a part that cannot run is reported in the table and the rest goes on. Everything
that uses the client runs in a measuring process of its own whose PYTHONPATH is the tree under test (bench/proto.py serve and conc,
bench/tg_worker.py); this process starts the servers, pins processes and keeps the figures.

  1. the link      C echo round trip (64 bytes, TCP_NODELAY) and a C TCP stream (4 MiB and kernel-tuned socket buffers; the faster is
                   the link limit), two processes each: bench/echo.c
  2. protocol      the Python client (client/connection.py): ping, pipelined launches of an empty kernel, write/read of 4 KiB..256 MiB,
                   1/2/4 concurrent clients, each its own process: bench/proto.py
  3. tinygrad      device REMOTE (this runner) against tinygrad's CPU device with the same NUM_CPU_THREADS (the runner's ncores), each in
                   its own process, plus REMOTE with 1 thread; the protocol ping on REMOTE's own connection; 256 MiB of weights through
                   Tensor(numpy).to(device), next to a C stream: bench/tg_worker.py (its docstring says exactly what is timed)
  4. --remote011   the same through tinygrad 0.11.0's REMOTE device (its HTTP server), from bench/.venv011: bench/remote011.py
  5. footprint     stripped daemon size, idle RSS, RSS per idle session (process and thread isolation)
  6. features      what each runner feature costs: the same binary with the feature on and off, one runner per setting, measured
                   alternately: resumable sessions (the default, against --resume-grace 0), the profile (Runner.profile(PROFILE_ON) on
                   both connections, against off, the default), the cache (--cache-dir in a temporary directory with the client's
                   default cache=True, against no --cache-dir; writes of 1 MiB and more then go by content, SHA-256: a first write of 64
                   MiB of content the runner has not seen and a repeated write of the same), upload progress (client/progress.py on
                   both connections as when stderr is a terminal, at its default 2 s, against off, as with stderr a pipe), confinement
                   (the default, against --no-confine), process isolation (the CPU default, against --isolation thread). Each: ping
                   round trip (median of 2,000, the runner's session and the client on one CPU), a 64 MiB write to a sync and a 64 MiB
                   read (median of 5, --quick 3), 1,000 pipelined launches of an empty kernel then sync (median of 5); on/off, each
                   run's own ratio
  7. network       only with --only network (about 15 minutes): over EMULATED links (bench/linkemu.c), this runner vs local tinygrad and
                   0.11's REMOTE: bench/netbench.py
  8. multi         only with --only multi (about 6 minutes, --quick 1): several runners as one, bench/multirunner.py: greedy decoding
                   with one runner pinned to one CPU against two runners pinned to a CPU each, tensor parallel and split by layers;
                   small and wide models, loopback and emulated 10 GbE and 1 GbE (--profiles), ratios in the same run
  9. llmrunners    only with --only llmrunners (about 15 minutes, --quick 1 rep): one model across runners, bench/llm_runners.py:
                   tinygrad.llm's --benchmark on one CPU runner against two and three holding a range of blocks each, the bytes each
                   received against its share, and runners of unequal speed, speed-aware against memory-only placement
 10. llmfirsttoken only with --only llmfirsttoken (about 10 minutes, --quick 1 rep): time to first token of the same model through
                   tinygrad.llm's server on one CPU runner against two and three, bench/llm_first_token.py

Round trips (C echo, ping, tinygrad's launch + read) are taken twice, with the server side (echo server, the runner's session process,
0.11's server) pinned to the first CPU and the client pinned to the same CPU ("1 CPU") or to the second ("2 CPUs"): on a VM, waking a
process on another vCPU costs tens of µs, so an unpinned round trip is one or the other at random. tinygrad CPU's launch + read has no
server: its "1 CPU" figure is the client pinned to the first CPU. Bulk transfers of sections 1, 2 and 6 (the C stream, the client's
writes and reads) run with the receiving or serving side on the first CPU and the client on the second: unpinned, the scheduler at
times keeps both ends on one CPU for a whole 64 MiB transfer (3.3 against 6 GB/s here). Each timed 64 MiB transfer follows 256 MiB of
the same, untimed: on this VM (a Firecracker guest) the first 100-200 MiB moved after a pause or after another transfer go at about
half speed, which the 256 MiB C stream amortizes within itself and a timed 64 MiB does not.

--compare REV builds REV's daemon and client (its daemon/ and client/, by git archive into a temporary directory, as
../shared/tools/perf-guard does) and measures that tree ("old") and this one as it is on disk ("new") in the same run, for every figure
of the sections selected: each side has its own runners, from its own daemon, and its own measuring processes, driven by its own client;
the bench code is this tree's. Each figure's runs alternate between the sides run by run (A B, then B A in the next repetition), so that
a busy machine slows both alike. It prints per figure the new and old medians and new/old oriented so that above 1 the new tree is
better (new/old where higher is better, old/new where lower is better), flags those below 0.9, and writes bench/results/compare.json
(not latest.json). The C link figures and local tinygrad CPU are the same code on both sides: their ratios show this run's noise.
network is not compared.

Targets (each a figure or a ratio of figures from this run; a target whose figures were not measured says so):
  ping RTT <= 1.6x C echo RTT; ping RTT <= 1.3x a minimal Python send/recv loop (1 CPU); pipelined launches >= 100,000/s;
  write and read 64 MiB >= 0.9x the C stream and >= 2 GB/s; write and read 64 MiB with every default on within 1.05x of the same
  binary with resumable sessions off (features); tinygrad REMOTE: <= 10 µs per launch, launch + 4-byte read <= 80 µs and <= local
  CPU's launch + 4-byte read + 1.2x the protocol ping RTT (1 CPU), 256 MiB of weights >= 0.8x the C stream, MLP steps >= 0.85x
  (loss read every step) and 0.95x (sync every 50 steps) of local CPU; stripped daemon <= 200 KiB, idle RSS <= 4 MiB.
"""
from __future__ import annotations
import argparse, datetime, json, os, pathlib, platform, re, shutil, signal, statistics, subprocess, sys, tempfile, time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
LOGS = RESULTS / "logs"   # each server's and worker's stderr
DAEMON = ROOT / "daemon" / "metal_runner"
MIB = 1 << 20
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

def log(*a):
  print(*a, file=sys.stderr, flush=True)

# *** processes: started here, stopped by pid

class Proc:
  """A server that prints "listening on HOST:PORT" first on stdout; stopped by pid (SIGTERM, then SIGKILL)."""
  def __init__(self, argv, env=None, name=None, stderr=None):
    self.name = name or pathlib.Path(argv[0]).name
    self.errlog = open(LOGS / f"{self.name}.log", "w") if stderr is None else stderr
    self.p = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.errlog, text=True,
                              env=env)
    line = self.p.stdout.readline()
    if not (m := re.match(r"listening on (\S+):(\d+)", line)):
      self.stop()
      raise RuntimeError(f"{self.name} did not start: said {line!r}; {tail(LOGS / (self.name + '.log'))}")
    self.addr, self.port, self.pid = f"{m.group(1)}:{m.group(2)}", int(m.group(2)), self.p.pid

  def stop(self):
    if self.p.poll() is None:
      os.kill(self.p.pid, signal.SIGTERM)
      try: self.p.wait(5)
      except subprocess.TimeoutExpired:
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait()
    self.p.stdout.close()

class Worker:
  """A line-oriented measuring subprocess (tg_worker.py, proto.py serve and conc): prints a ready line, then answers one JSON line per
  command."""
  def __init__(self, argv, env, name):
    self.name, self.errlog = name, open(LOGS / f"{name}.log", "w")
    self.p = subprocess.Popen([str(a) for a in argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog, text=True, env=env,
                              cwd=ROOT)
    self.info = None

  def ready(self, timeout=300) -> dict:
    self.info = self.answer(timeout)
    return self.info

  def send(self, cmd:str):
    self.p.stdin.write(cmd + "\n")
    self.p.stdin.flush()

  def answer(self, timeout=300) -> dict:
    import select
    if not select.select([self.p.stdout], [], [], timeout)[0]: raise RuntimeError(f"{self.name}: no answer in {timeout} s")
    if not (line := self.p.stdout.readline()):
      raise RuntimeError(f"{self.name} exited ({self.p.wait()}); {LOGS / (self.name + '.log')}: {tail(LOGS / (self.name + '.log'))}")
    return json.loads(line)

  def ask(self, cmd:str, timeout=300) -> dict:
    self.send(cmd)
    return self.answer(timeout)

  def call(self, cmd:str, timeout=300) -> dict:
    """ask(), raising the worker's error (proto.py serve answers {"error": ...} when a command failed)."""
    if "error" in (res := self.ask(cmd, timeout)): raise RuntimeError(f"{self.name}: {cmd}: {res['error']}")
    return res

  def stop(self):
    if self.p.poll() is None:
      try:
        self.p.stdin.close()
        self.p.wait(10)
      except (subprocess.TimeoutExpired, BrokenPipeError):
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait()

def tail(path, n=400) -> str:
  try: return pathlib.Path(path).read_text()[-n:].strip()
  except OSError: return ""

# *** the trees under test: this one ("new") and, with --compare, REV's ("old")

class Side:
  """A tree under test: its daemon/ and client/, its default runner (started by main) and its figures."""
  def __init__(self, name:str, root:pathlib.Path, rev:str, fig:dict):
    self.name, self.root, self.rev, self.fig, self.runner = name, root, rev, fig, None
    self.daemon = root / "daemon" / "metal_runner"

  def tag(self, name:str) -> str:
    """A process's name (and its log's): this tree's as before, the old tree's prefixed."""
    return name if self is SIDES[0] else f"{self.name}-{name}"

  def env(self, base:dict|None=None, **kw) -> dict:
    """The environment of a measuring process: PYTHONPATH selects this tree's client."""
    env = dict(os.environ if base is None else base)
    env.update({k: str(v) for k, v in kw.items()}, PYTHONPATH=str(self.root))
    return env

  def worker(self, argv, name:str, env:dict|None=None, ready=True, timeout=300) -> Worker:
    w = Worker(argv, self.env() if env is None else env, self.tag(name))
    if ready: self.ready(w, timeout)
    return w

  def ready(self, w:Worker, timeout=300) -> dict:
    """w's ready line, checked: a worker that names its client must run this tree's."""
    info = w.ready(timeout)
    if (c := info.get("client")) and not pathlib.Path(c).resolve().is_relative_to(self.root.resolve() / "client"):
      raise RuntimeError(f"{w.name} runs the client at {c}, not {self.root}'s")
    return info

SIDES: list[Side] = []

def order(rep:int) -> list[Side]:
  """The sides in the order of repetition rep: A B, then B A."""
  return SIDES if rep % 2 == 0 else SIDES[::-1]

def prefix(side:Side) -> str:
  return f"[{side.name}] " if len(SIDES) > 1 else ""

# *** figures: a list of runs -> median, min, max

FIG: dict[str, dict] = {}   # this tree's (SIDES[0].fig)

def better_of(unit:str) -> str|None:
  return "lower" if unit in ("µs", "KiB", "MiB") else "higher" if unit.endswith("/s") else None

def add(key:str, value:float, unit:str, label:str|None=None, better:str|None=None, side:Side|None=None):
  """One run of figure key (of side's figures; default: this tree's). better: "higher" or "lower", needed where the unit does not say."""
  f = (FIG if side is None else side.fig).setdefault(key, {"unit": unit, "label": label or key, "better": better or better_of(unit), "runs": []})
  f["runs"].append(value)

def summarize(fig:dict):
  for f in fig.values():
    if r := f.get("runs"): f.update(median=statistics.median(r), min=min(r), max=max(r), n=len(r))

def med(key:str, side:Side|None=None) -> float|None:
  f = (FIG if side is None else side.fig).get(key)
  return statistics.median(f["runs"]) if f and f.get("runs") else None

def fmed(key:str, side:Side|None=None, fmt="{:.2f}") -> str:
  return "-" if (v := med(key, side)) is None else fmt.format(v)

# *** the runner's side of a connection, for pinning

def children(pid:int) -> list[int]:
  return [int(x) for x in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

def descendants(pid:int) -> list[int]:
  try: kids = children(pid)
  except FileNotFoundError: return []
  return kids + [d for k in kids for d in descendants(k)]

def tasks(pid:int) -> set[int]:
  try: return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
  except FileNotFoundError: return set()

class Peer:
  """What serves one connection in a runner: the process it forked and that one's descendants (process isolation; with --cache-dir the
  session is the child of a cache helper, daemon/cachelink.c), all their threads, looked up when pinned; or the thread it started
  (thread isolation). Peer.since(daemon, snapshot) after connecting: what is new since the snapshot."""
  def __init__(self, pids:set[int], tids:set[int]): self.pids, self.tids = pids, tids

  @staticmethod
  def snapshot(daemon:int) -> tuple[set[int], set[int]]: return set(children(daemon)), tasks(daemon)

  @staticmethod
  def since(daemon:int, snap) -> Peer|None:
    pids, tids = set(children(daemon)) - snap[0], tasks(daemon) - snap[1]
    return Peer(pids, tids) if pids or tids else None

  def pin(self, cpus:set[int]):
    for t in self.tids | {t for p in self.pids for q in (p, *descendants(p)) for t in tasks(q)}:
      try: os.sched_setaffinity(t, cpus)
      except OSError: pass   # a thread that has just exited

def connect(w:Worker, cmd:str, daemon:int) -> Peer|None:
  """w.call(cmd), a command that opens one connection to the runner daemon: the runner's side of that connection."""
  snap = Peer.snapshot(daemon)
  w.call(cmd)
  return Peer.since(daemon, snap)

def set_affinity(pid:int, cpus:set[int]):
  """Every thread of process pid onto cpus."""
  Peer({pid}, set()).pin(cpus)

# *** 1 + 2: the link and the protocol, interleaved run by run

def echo_rtt(port:int, n:int, cpu:int|None=None) -> dict:
  pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
  return json.loads(subprocess.check_output([RESULTS / "echo", "rtt", str(port), str(n), "64"], text=True, preexec_fn=pin))

def echo_stream(port:int, nbytes:int, sockbuf:int=4 * MIB, cpu:int|None=None) -> dict:
  pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
  return json.loads(subprocess.check_output([RESULTS / "echo", "stream", str(port), str(nbytes), str(sockbuf)], text=True, preexec_fn=pin))

# Bulk transfers, the C stream's and the client's alike, run with the receiving or serving side on the first CPU and the client on the
# second (BULK): left to itself the scheduler sometimes keeps both ends of a transfer on one CPU for all of a 64 MiB transfer
# (3.3 GB/s here, against 6 on two CPUs), which a 256 MiB stream outlasts and a 64 MiB write does not; across machines, as in real
# use, the two ends never share a CPU.
def bulk_cpus() -> tuple[int, int]|None:
  cpus = sorted(os.sched_getaffinity(0))
  return (cpus[0], cpus[1]) if len(cpus) >= 2 else None

def stream_sinks(name:str) -> dict[str, Proc]:
  return {"4m": Proc([RESULTS / "echo", "sink"], name=f"{name}-4m"), "auto": Proc([RESULTS / "echo", "sink", "0"], name=f"{name}-auto")}

SIZES = [(4096, "4 KiB"), (MIB, "1 MiB"), (64 * MIB, "64 MiB"), (256 * MIB, "256 MiB")]

def proto_worker(side:Side, name:str) -> Worker:
  return side.worker([sys.executable, HERE / "proto.py", "serve"], name)

def bench_link_and_protocol(reps:int, quick:bool):
  cpus = sorted(os.sched_getaffinity(0))
  regimes = [("same", cpus[0]), ("cross", cpus[1])] if len(cpus) >= 2 else [("any", None)]
  INFO["rtt_pinning"] = {"server_cpu": cpus[0] if len(cpus) >= 2 else None, "client_cpu": dict(regimes)}
  echo = Proc([RESULTS / "echo", "server"], name="echo-server")
  sinks, pw, bulk = stream_sinks("echo-sink"), {}, bulk_cpus()
  if len(cpus) >= 2: set_affinity(echo.pid, {cpus[0]})
  if bulk:
    for k in sinks.values(): set_affinity(k.pid, {bulk[0]})
  try:
    for side in SIDES:
      # separate connections, so that no figure inherits another's client state: pings (Session pg; RawPing raw); 1,000-launch batches
      # (ln); 100,000-launch batches (lb); data (s). The runner's side of the two ping connections stays on the first CPU
      w = pw[side] = proto_worker(side, "proto")
      for cmd in (f"session pg {side.runner.addr}", f"raw raw {side.runner.addr}"):
        if (peer := connect(w, cmd, side.runner.pid)) and len(cpus) >= 2: peer.pin({cpus[0]})
      if (peer := connect(w, f"session s {side.runner.addr} " + " ".join(str(s) for s, _ in SIZES), side.runner.pid)) and bulk:
        peer.pin({bulk[0]})
      for cmd in (f"session ln {side.runner.addr} 4096",
                  f"session lb {side.runner.addr} 4096"): w.call(cmd)
    n_rtt, blocks = (500, 3) if quick else (1000, 6)
    counts = {4096: 1000 if quick else 2000, MIB: 32 if quick else 64, 256 * MIB: 1}
    for rep in range(reps):
      # the figures that are compared alternate in short blocks, so that both sides of a ratio see the same load
      rtt = {}
      for _ in range(blocks):
        for side in order(rep):
          for regime, cpu in regimes:
            c = "-" if cpu is None else cpu
            rtt.setdefault((side, "e", regime), []).append(echo_rtt(echo.port, n_rtt, cpu)["median_us"])
            rtt.setdefault((side, "p", regime), []).append(pw[side].call(f"ping pg {n_rtt} {c}")["median_us"])
            rtt.setdefault((side, "q", regime), []).append(pw[side].call(f"ping raw {n_rtt} {c}")["median_us"])
      for side in SIDES:
        for regime, _ in regimes:
          e, p, q = (statistics.median(rtt[(side, k, regime)]) for k in "epq")
          where = {"same": ", 1 CPU", "cross": ", 2 CPUs", "any": ""}[regime]
          add(f"link.echo_rtt.{regime}", e, "µs", f"C echo round trip, 64 B{where}", side=side)
          add(f"proto.ping_rtt.{regime}", p, "µs", f"ping round trip (Python client){where}", side=side)
          add(f"proto.rawping_rtt.{regime}", q, "µs", f"ping, minimal Python loop (1 send, 1 recv){where}", side=side)
          add(f"ratio.ping_vs_echo.{regime}", p / e, "×", f"ping RTT / C echo RTT{where}", "lower", side)
          add(f"ratio.rawping_vs_echo.{regime}", q / e, "×", f"minimal Python ping RTT / C echo RTT{where}", "lower", side)
          add(f"ratio.ping_vs_rawping.{regime}", p / q, "×", f"ping RTT / minimal Python loop{where}", "lower", side)
      st, rw = {}, {}
      for _ in range(max(2, blocks // 2)):
        for side in order(rep):
          st.setdefault((side, "4m"), []).append(echo_stream(sinks["4m"].port, 256 * MIB, cpu=bulk and bulk[1])["gbps"])
          st.setdefault((side, "auto"), []).append(echo_stream(sinks["auto"].port, 256 * MIB, 0, cpu=bulk and bulk[1])["gbps"])
          if bulk: pw[side].call(f"pin {bulk[1]}")
          # each timed transfer follows 256 MiB of the same, untimed: on this VM the first 100-200 MiB moved after a pause, or after
          # another transfer (the C stream just before), go at about half speed (measured 3.0-3.8 GB/s right after a stream, 5.0-5.7
          # after 192 MiB more), which the 256 MiB C stream amortizes within itself and a timed 64 MiB does not
          for d in ("write", "read"):
            pw[side].call(f"{d} s {64 * MIB} 4")
            rw.setdefault((side, d), []).append(pw[side].call(f"{d} s {64 * MIB} 2"))
          if bulk: pw[side].call("pin -")
      for side in SIDES:
        st4, sta = statistics.median(st[(side, "4m")]), statistics.median(st[(side, "auto")])
        add("link.stream_4m", st4, "GB/s", "C TCP stream, 4 MiB socket buffers", side=side)
        add("link.stream_auto", sta, "GB/s", "C TCP stream, kernel-tuned socket buffers", side=side)
        add("link.stream", s := max(st4, sta), "GB/s", "C TCP stream, the faster of the two (link limit)", side=side)
        for d in ("write", "read"):
          res = rw[(side, d)]
          add(f"proto.{d}.{64 * MIB}", g := statistics.median(x["gbps"] for x in res), "GB/s", f"{d} 64 MiB", side=side)
          add(f"proto.{d}_us.{64 * MIB}", statistics.median(x["us_per_op"] for x in res), "µs", f"{d} 64 MiB, time per {d}", side=side)
          add(f"ratio.{d}64_vs_stream", g / s, "×", f"{d} 64 MiB / C stream", "higher", side)
      for _ in range(3):
        for side in order(rep):
          add("proto.launch_1k", pw[side].call("launches ln 1000")["per_s"], "launches/s", "pipelined launches, 1,000 then sync", side=side)
      if rep == 0 or not quick or len(SIDES) > 1:   # a comparison needs every figure's runs
        for side in order(rep):
          add("proto.launch_100k", pw[side].call("launches lb 100000")["per_s"], "launches/s", "pipelined launches, 100,000 then sync", side=side)
          # the same ping, on the connection that has just had 100,000 requests in flight (see Runner._wait's bookkeeping)
          add("proto.ping_after_burst", pw[side].call(f"ping lb {n_rtt}")["median_us"], "µs", "ping RTT on that connection right after the 100,000",
              side=side)
      for size, name in SIZES:
        if size == 64 * MIB: continue
        for side in order(rep):
          if bulk: pw[side].call(f"pin {bulk[1]}")
          w, r = pw[side].call(f"write s {size} {counts[size]}"), pw[side].call(f"read s {size} {counts[size]}")
          if bulk: pw[side].call("pin -")
          add(f"proto.write.{size}", w["gbps"], "GB/s", f"write {name}", side=side)
          add(f"proto.read.{size}", r["gbps"], "GB/s", f"read {name}", side=side)
          add(f"proto.write_us.{size}", w["us_per_op"], "µs", f"write {name}, time per write", side=side)
          add(f"proto.read_us.{size}", r["us_per_op"], "µs", f"read {name}, time per read", side=side)
      for side in SIDES:
        log(f"  {prefix(side)}protocol run {rep + 1}/{reps}: " +
            "; ".join(f"{r}: echo {statistics.median(rtt[(side, 'e', r)]):.1f} µs, ping {statistics.median(rtt[(side, 'p', r)]):.1f} µs "
                      f"(minimal Python {statistics.median(rtt[(side, 'q', r)]):.1f} µs)" for r, _ in regimes) +
            f", stream {fmed('link.stream', side)} GB/s, write/read 64 MiB {fmed(f'proto.write.{64 * MIB}', side)}/"
            f"{fmed(f'proto.read.{64 * MIB}', side)} GB/s, launches {fmed('proto.launch_100k', side, '{:,.0f}')}/s")
  finally:
    for w in pw.values(): w.stop()   # proto.py closes its connections
    echo.stop()
    for k in sinks.values(): k.stop()

def bench_concurrency(reps:int, quick:bool):
  seconds = 0.3 if quick else 1.0
  for n in (1, 2, 4):
    ws = {side: [side.worker([sys.executable, HERE / "proto.py", "conc", side.runner.addr, seconds], f"conc-{n}-{i}", ready=False)
                 for i in range(n)] for side in SIDES}
    try:
      for side in SIDES:
        for w in ws[side]: side.ready(w, 60)
      for rep in range(reps):
        for side in order(rep):
          for phase in ("ping", "bulk"):
            for w in ws[side]: w.send(phase)
            res = [w.answer(60) for w in ws[side]]
            if phase == "ping":
              add(f"conc.ping.{n}", statistics.median(r["mean_us"] for r in res), "µs", f"{n} client(s): ping RTT per client (median client)",
                  side=side)
              add(f"conc.pings.{n}", sum(r["pings"] / r["seconds"] for r in res), "pings/s", f"{n} client(s): pings per second, all clients",
                  side=side)
            else: add(f"conc.bulk.{n}", sum(r["gbps"] for r in res), "GB/s", f"{n} client(s): 64 MiB write+read, all clients", side=side)
      for side in SIDES: log(f"  {prefix(side)}{n} client(s): ping {fmed(f'conc.ping.{n}', side, '{:.1f}')} µs, {fmed(f'conc.bulk.{n}', side)} GB/s")
    finally:
      for w in (w for L in ws.values() for w in L):
        try: w.send("quit")
        except BrokenPipeError: pass
        w.stop()

# *** 3 + 4: tinygrad level, one process per device and tree, interleaved

TG_METRICS = [("launch", 3), ("roundtrip", 1), ("copy", 1), ("weights", 1), ("mlp_item", 1), ("mlp_sync", 1)]
TG_KINDS = ("remote", "cpu", "remote1", "r011", "cpu011")

def tg_env(base:dict, **kw) -> dict:
  env = {k: v for k, v in base.items() if k not in ("DEV", "CPU", "REMOTE", "HOST", "DEBUG", "BEAM", "JIT", "METAL_RUNNER")}
  env.update({k: str(v) for k, v in kw.items()})
  return env

def link_stream(sinks:dict[str, Proc]) -> float:
  """The C stream's link limit, now: the faster of 4 MiB and kernel-tuned socket buffers, 256 MiB each."""
  return max(echo_stream(sinks["4m"].port, 256 * MIB)["gbps"], echo_stream(sinks["auto"].port, 256 * MIB, 0)["gbps"])

def bench_tinygrad(reps:int, remote011:bool, threads:int, quick:bool):
  cpus = sorted(os.sched_getaffinity(0))
  regimes = [("same", cpus[0]), ("cross", cpus[1])] if len(cpus) >= 2 else []
  ws: dict[tuple[Side, str], Worker] = {}
  server011, peers, sinks, snaps = None, {}, {}, {}
  def remote(side:Side, kind:str, nthreads:int):
    ws[(side, kind)] = side.worker([sys.executable, HERE / "tg_worker.py", "REMOTE"], f"tg-{kind}", side.env(
      tg_env(os.environ, DEV="REMOTE", METAL_RUNNER=side.runner.addr, NUM_CPU_THREADS=nthreads)), ready=False)
  try:
    sinks = stream_sinks("tg-sink")
    for side in SIDES:
      snaps[side] = Peer.snapshot(side.runner.pid)
      remote(side, "remote", threads)
      # local tinygrad runs no client code: the same on both sides, its ratio shows the run's noise
      ws[(side, "cpu")] = side.worker([sys.executable, HERE / "tg_worker.py", "CPU"], "tg-cpu",
                                      side.env(tg_env(os.environ, DEV="CPU", NUM_CPU_THREADS=threads)), ready=False)
    if remote011:
      try:
        import remote011 as r011
        py = r011.setup(sys.stderr)
        server011 = Proc([py, HERE / "remote011.py", "server"], env=tg_env(os.environ, REMOTEDEV="CPU"), name="remote011-server")
        ws[(SIDES[0], "r011")] = Worker([py, HERE / "tg_worker.py", "REMOTE"], tg_env(os.environ, REMOTE=1, HOST=server011.addr), "tg-r011")
        ws[(SIDES[0], "cpu011")] = Worker([py, HERE / "tg_worker.py", "CPU"], tg_env(os.environ, CPU=1), "tg-cpu011")
        peers[(SIDES[0], "r011")] = Peer({server011.pid}, set())
      except Exception as e:
        FIG["error.remote011"] = {"error": f"{type(e).__name__}: {e}"}
        log(f"  --remote011: {e}")
    for side in SIDES:
      try:
        side.ready(ws[(side, "remote")])
        # the REMOTE worker's session (for the pinned round trips): what the runner has started since
        if peer := Peer.since(side.runner.pid, snaps[side]): peers[(side, "remote")] = peer
      except Exception: pass  # reported below
      if threads > 1: remote(side, "remote1", 1)   # tinygrad 0.14's CPU device runs a kernel's core_id slices one after another: the same
                                                   # work on one runner thread too
    for (side, kind), w in list(ws.items()):
      if w.info is not None: continue
      try: side.ready(w)
      except Exception as e:
        side.fig[f"error.tg.{kind}"] = {"error": str(e)}
        log(f"  {prefix(side)}tinygrad {kind}: {e}")
        del ws[(side, kind)]
    INFO.setdefault("tinygrad_sides", {}).update({side.tag(kind): w.info for (side, kind), w in ws.items()})

    def ask(side:Side, kind:str, metric:str, regime:str|None=None) -> dict|None:
      """One measurement; with a regime, the latency is taken with the server side (session process, 0.11's server) on the first CPU
      and the client on the same or the other CPU, as for the round trips of section 2 (local CPU: the client on the first CPU)."""
      w, name, peer = ws[(side, kind)], metric + (f"_{regime}" if regime else ""), peers.get((side, kind))
      try:
        if regime:
          if peer: peer.pin({cpus[0]})
          set_affinity(w.p.pid, {dict(regimes)[regime]})
        res = w.ask(f"{metric} quick" if quick else metric)
      finally:
        if regime:
          if peer: peer.pin(set(cpus))
          set_affinity(w.p.pid, set(cpus))
      if "error" in res:
        side.fig[f"error.tg.{kind}.{name}"] = res
        return None
      for k, v in res.items():
        if k != "steps":
          add(f"tg.{kind}.{name}.{k}", v, UNITS[k], f"{SIDE_NAMES[kind]}: {METRIC_NAMES[metric]}{KEY_NAMES[k]}{REGIME_NAMES[regime]}", side=side)
      return res

    for rep in range(reps):
      turn = [(side, kind) for kind in TG_KINDS for side in SIDES if (side, kind) in ws]   # each kind's sides next to each other
      if rep % 2: turn.reverse()
      for metric, times in TG_METRICS:
        for _ in range(times):
          got = {}
          for side, kind in turn:
            if kind == "remote1" and not metric.startswith("mlp"): continue
            if metric == "weights":
              if kind not in ("remote", "cpu"): continue
              if kind == "remote":   # the link's limit next to each REMOTE upload
                add("tg.stream", st := link_stream(sinks), "GB/s", "C TCP stream next to REMOTE's weights (the faster of the two)", side=side)
                if res := ask(side, kind, metric):
                  add("ratio.tg.weights_vs_stream", res["gbps"] / st, "×", "256 MiB weights: REMOTE / C stream", "higher", side)
              else: ask(side, kind, metric)
            elif metric == "roundtrip" and regimes and ((side, kind) in peers or kind == "cpu"):
              for regime, _ in (regimes if (side, kind) in peers else regimes[:1]):
                got[(side, kind, regime)] = ask(side, kind, metric, regime)
                if kind == "remote": got[(side, "ping", regime)] = ask(side, kind, "ping", regime)
              if kind == "cpu": ask(side, kind, metric)   # and unpinned, as before
            elif (res := ask(side, kind, metric)) is not None: got[(side, kind)] = res
          for side in SIDES:
            for a, b, label in (("remote", "cpu", "REMOTE / CPU"), ("remote1", "cpu", "REMOTE 1 thread / CPU"), ("r011", "cpu011", "0.11 REMOTE / 0.11 CPU"),
                                ("r011", "remote", "0.11 REMOTE / REMOTE")):
              if got.get((side, a)) and got.get((side, b)) and metric.startswith("mlp"):
                add(f"ratio.tg.{a}_vs_{b}.{metric}", got[(side, a)]["steps_per_s"] / got[(side, b)]["steps_per_s"], "×", f"{METRIC_NAMES[metric]}: {label}",
                    "higher", side)
            # what REMOTE's launch + 4-byte read costs over local CPU's, in protocol ping round trips (the same pinning)
            for regime, _ in regimes[:1]:
              r, c, p = got.get((side, "remote", regime)), got.get((side, "cpu", regime)), got.get((side, "ping", regime))
              if r and c and p:
                add(f"ratio.tg.roundtrip_over_cpu_vs_ping.{regime}", (r["median_us"] - c["median_us"]) / p["median_us"], "×",
                    f"launch + 4-byte read: (REMOTE - CPU) / ping RTT{REGIME_NAMES[regime]}", "lower", side)
      for side in SIDES:
        log(f"  {prefix(side)}tinygrad run {rep + 1}/{reps}: " + ", ".join(
          f"{k} mlp {fmed(f'tg.{k}.mlp_item.steps_per_s', side, '{:.0f}')}/{fmed(f'tg.{k}.mlp_sync.steps_per_s', side, '{:.0f}')} steps/s"
          for s, k in ws if s is side) + f", weights {fmed('tg.remote.weights.gbps', side)} GB/s (stream {fmed('tg.stream', side)})")
  finally:
    for w in ws.values(): w.stop()
    if server011: server011.stop()
    for k in sinks.values(): k.stop()

REGIME_NAMES = {None: "", "same": ", 1 CPU", "cross": ", 2 CPUs"}
KEY_NAMES = {"us_per_launch": " (1,000 then sync), per launch", "median_us": ", median", "p90_us": ", p90", "copyin_gbps": " copyin",
             "copyout_gbps": " copyout", "steps_per_s": "", "gbps": ""}
UNITS = {"us_per_launch": "µs", "median_us": "µs", "p90_us": "µs", "copyin_gbps": "GB/s", "copyout_gbps": "GB/s", "steps_per_s": "steps/s",
         "gbps": "GB/s"}
SIDE_NAMES = {"remote": "REMOTE", "remote1": "REMOTE, 1 thread", "cpu": "CPU", "r011": "0.11 REMOTE", "cpu011": "0.11 CPU"}
METRIC_NAMES = {"launch": "raw program launch", "roundtrip": "launch + 4-byte read", "ping": "protocol ping on its connection", "copy": "64 MiB",
                "weights": "256 MiB weights, Tensor(numpy).to(dev)", "mlp_item": "MLP, loss read every step", "mlp_sync": "MLP, sync every 50 steps"}

# *** 5: footprint

def rss_kib(pid:int) -> int:
  return int(re.search(r"VmRSS:\s+(\d+)", pathlib.Path(f"/proc/{pid}/status").read_text()).group(1))

def private_kib(pid:int) -> int:
  t = pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text()
  return sum(int(re.search(rf"{k}:\s+(\d+)", t).group(1)) for k in ("Private_Clean", "Private_Dirty"))

def bench_footprint(reps:int):
  nsess, pw = 8, {}
  try:
    for side in SIDES:
      with tempfile.TemporaryDirectory() as d:
        shutil.copy(side.daemon, stripped := pathlib.Path(d) / "metal_runner")
        subprocess.run(["strip", stripped], check=True)
        add("foot.stripped", stripped.stat().st_size / 1024, "KiB", "stripped daemon binary", side=side)
        add("foot.unstripped", side.daemon.stat().st_size / 1024, "KiB", "daemon binary as built (-O2 -g)", side=side)
      pw[side] = proto_worker(side, "footprint")   # opens the idle connections
    for rep in range(reps):
      for side in order(rep):
        d = Proc([side.daemon, "--host", "127.0.0.1", "--port", "0", "--backend", "cpu"], name=side.tag("footprint-process"))
        try:
          time.sleep(0.2)
          add("foot.idle_rss", rss_kib(d.pid) / 1024, "MiB", "idle daemon VmRSS (listening)", side=side)
          add("foot.idle_private", private_kib(d.pid), "KiB", "idle daemon private memory (smaps)", side=side)
          pw[side].call(f"idle {d.addr} {nsess}")
          kids = children(d.pid)
          add("foot.session_rss", statistics.median(rss_kib(k) for k in kids) / 1024, "MiB", "idle session process VmRSS (process isolation)",
              side=side)
          add("foot.session_private", statistics.median(private_kib(k) for k in kids), "KiB", "idle session process private memory (smaps)",
              side=side)
          pw[side].call("closeidle")
        finally: d.stop()
        d = Proc([side.daemon, "--host", "127.0.0.1", "--port", "0", "--backend", "cpu", "--isolation", "thread"], name=side.tag("footprint-thread"))
        try:
          time.sleep(0.2)
          before = rss_kib(d.pid)
          pw[side].call(f"idle {d.addr} {nsess}")
          time.sleep(0.1)
          add("foot.thread_session", (rss_kib(d.pid) - before) / nsess, "KiB", "daemon VmRSS growth per idle session (thread isolation)", side=side)
          pw[side].call("closeidle")
        finally: d.stop()
  finally:
    for w in pw.values(): w.stop()

# *** 6: what each runner feature costs, on against off

# runner settings, each its own runner of the same binary: options; None stands for a temporary directory
SETTINGS = {"default": [], "noresume": ["--resume-grace", "0"], "cache": ["--cache-dir", None], "noconfine": ["--no-confine"],
            "thread": ["--isolation", "thread"]}
# feature, what, (runner setting, client option: "" none, "profile" Runner.profile(PROFILE_ON), "progress" upload progress) when on, off
FEATURES = [
  ("resume", "resumable sessions (default; off: --resume-grace 0)", ("default", ""), ("noresume", "")),
  ("profile", "profile (Runner.profile(PROFILE_ON); off: the default)", ("default", "profile"), ("default", "")),
  ("cache", "cache (--cache-dir, client cache=True; off: no cache)", ("cache", ""), ("default", "")),
  ("progress", "upload progress (stderr a terminal; off: not one)", ("default", "progress"), ("default", "")),
  ("confine", "confinement (default; off: --no-confine)", ("default", ""), ("noconfine", "")),
  ("isolation", "process isolation (default; off: --isolation thread)", ("default", ""), ("thread", "")),
]
FEAT_METRICS = {"ping": ("µs", "ping RTT, 1 CPU (median of 2,000)"), "write": ("GB/s", "write 64 MiB to a sync"),
                "write_first": ("GB/s", "write 64 MiB to a sync, new content"), "write_repeat": ("GB/s", "write 64 MiB to a sync, the same again"), "read": ("GB/s", "read 64 MiB"),
                "launch": ("launches/s", "1,000 pipelined empty launches, then sync")}

def bench_features(reps:int, quick:bool):
  cpus, bulk = sorted(os.sched_getaffinity(0)), bulk_cpus()
  cpu, n = (cpus[0] if len(cpus) >= 2 else "-"), (3 if quick else 5)
  runners, pw, tmp = {}, {}, []
  try:
    for side in SIDES:
      for s, opts in SETTINGS.items():
        if None in opts: tmp.append(d := tempfile.mkdtemp(prefix="bench-cache-"))
        try: runners[(side, s)] = Proc([side.daemon, "--host", "127.0.0.1", "--port", "0", "--backend", "cpu", *[d if o is None else o for o in opts]],
                                       name=side.tag(f"feature-{s}"))
        except Exception as e:
          side.fig[f"error.feat.{s}"] = {"error": f"{type(e).__name__}: {e}"}
          log(f"  {prefix(side)}runner {' '.join(o or 'DIR' for o in opts) or '(defaults)'}: {e}")
      w = pw[side] = proto_worker(side, "features")
      # per setting, like section 2: a connection for pings, whose runner side stays on the first CPU, and one for data and launches
      for s, opt in dict.fromkeys(x for _, _, on, off in FEATURES for x in (on, off)):
        if (r := runners.get((side, s))) is None: continue
        name = f"{s}{'+' + opt if opt else ''}"
        if (peer := connect(w, f"session {name}.pg {r.addr}", r.pid)) and cpu != "-": peer.pin({cpu})
        if (peer := connect(w, f"session {name}.s {r.addr} 4096 {64 * MIB}", r.pid)) and bulk: peer.pin({bulk[0]})
        for c in ("pg", "s") if opt else ():
          try: w.call(f"{opt} {name}.{c} 1")
          except Exception as e: log(f"  {prefix(side)}{opt} on {name}.{c}: {e}")   # e.g. an older client without upload progress

    def run(side:Side, feature:str, s:str, opt:str) -> dict:
      w, name = pw[side], f"{s}{'+' + opt if opt else ''}"
      res = {"ping": w.call(f"ping {name}.pg 2000 {cpu}")["median_us"]}
      if bulk: w.call(f"pin {bulk[1]}")
      w.call(f"write {name}.s {64 * MIB} 4")   # untimed, as in section 2: the first 100-200 MiB after a pause go at half speed here
      if feature == "cache":
        first, again = [], []
        for _ in range(n):
          first.append(w.call(f"write {name}.s {64 * MIB} 1 fresh")["gbps"])
          again.append(w.call(f"write {name}.s {64 * MIB} 1")["gbps"])
        res.update(write_first=statistics.median(first), write_repeat=statistics.median(again))
      else: res["write"] = statistics.median(w.call(f"write {name}.s {64 * MIB} 1")["gbps"] for _ in range(n))
      w.call(f"read {name}.s {64 * MIB} 4")
      res["read"] = statistics.median(w.call(f"read {name}.s {64 * MIB} 1")["gbps"] for _ in range(n))
      res["launch"] = statistics.median(w.call(f"launches {name}.s 1000")["per_s"] for _ in range(5))
      if bulk: w.call("pin -")
      if opt == "profile": w.call(f"profile {name}.s 1")   # hand out the records (untimed), so that they never fill
      return res

    for rep in range(reps):
      for i, (feature, what, on, off) in enumerate(FEATURES):
        states = [("on", on), ("off", off)] if (rep + i) % 2 == 0 else [("off", off), ("on", on)]
        got = {}
        for state, (s, opt) in states:
          for side in order(rep):
            if (side, s) not in runners: continue
            try: got[(side, state)] = run(side, feature, s, opt)
            except Exception as e:
              side.fig[f"error.feat.{feature}.{state}"] = {"error": f"{type(e).__name__}: {e}"}
              log(f"  {prefix(side)}{feature} {state}: {e}")
        for side in SIDES:
          for state in ("on", "off"):
            for k, v in got.get((side, state), {}).items():
              add(f"feat.{feature}.{state}.{k}", v, FEAT_METRICS[k][0], f"{feature} {state}: {FEAT_METRICS[k][1]}", side=side)
          if (a := got.get((side, "on"))) and (b := got.get((side, "off"))):
            for k in a:
              add(f"feat.{feature}.ratio.{k}", a[k] / b[k], "×", f"{feature} on/off: {FEAT_METRICS[k][1]}", better_of(FEAT_METRICS[k][0]), side)
      for side in SIDES:
        log(f"  {prefix(side)}features run {rep + 1}/{reps}: on/off " + ", ".join(
          f"{f} ping {fmed(f'feat.{f}.ratio.ping', side)} write {fmed(f'feat.{f}.ratio.write', side)}" for f, *_ in FEATURES if f != "cache") +
          f", cache write first/again {fmed('feat.cache.ratio.write_first', side)}/{fmed('feat.cache.ratio.write_repeat', side)}")
  finally:
    for w in pw.values(): w.stop()
    for r in runners.values(): r.stop()
    for d in tmp: shutil.rmtree(d, ignore_errors=True)

def features_table(side:Side|None=None) -> list[str]:
  fig = FIG if side is None else side.fig
  if not any(k.startswith("feat.") for k in fig): return []
  w = 46
  L = ["", "6. Runner features: on vs off (the same binary, one runner per setting, same run, alternating; on/off: the median of each "
       "run's ratio)", f"{'feature / figure':<{w}} {'on':>10} {'off':>10} {'on/off':>7}  unit", "-" * (w + 50)]
  for feature, what, *_ in FEATURES:
    L.append(what)
    for k, (unit, label) in FEAT_METRICS.items():
      if f"feat.{feature}.ratio.{k}" not in fig and f"feat.{feature}.on.{k}" not in fig: continue
      on, off, r = (med(f"feat.{feature}.{x}.{k}", side) for x in ("on", "off", "ratio"))
      L.append(f"  {label[:w - 2]:<{w - 2}} {fmt_num(on, unit):>10} {fmt_num(off, unit):>10} {fmt_num(r, '×'):>7}  {unit}, "
               f"{better_of(unit)} is better")
  return L

# *** targets, table, comparison, JSON

def targets() -> list[dict]:
  T = []
  def t(name, key, op, limit, unit, fmt="{:.2f}"):
    v = med(key)
    T.append({"target": name, "figure": key, "value": v, "limit": limit, "op": op, "unit": unit,
              "met": None if v is None else (v <= limit if op == "<=" else v >= limit), "fmt": fmt})
  for regime, where in (("same", ", 1 CPU"), ("cross", ", 2 CPUs"), ("any", "")):
    if f"ratio.ping_vs_echo.{regime}" in FIG: t(f"ping RTT ≤ 1.6× C echo RTT{where}", f"ratio.ping_vs_echo.{regime}", "<=", 1.6, "×")
  # issue 10: the client's own overhead per round trip
  t("ping RTT ≤ 1.3× minimal Python send/recv loop, 1 CPU", "ratio.ping_vs_rawping.same", "<=", 1.3, "×")
  t("pipelined launches (1,000) ≥ 100,000/s, protocol", "proto.launch_1k", ">=", 100_000, "/s", "{:,.0f}")
  t("pipelined launches (100,000) ≥ 100,000/s, protocol", "proto.launch_100k", ">=", 100_000, "/s", "{:,.0f}")
  t("≤ 10 µs per launch, tinygrad REMOTE", "tg.remote.launch.us_per_launch", "<=", 10, "µs", "{:.1f}")
  for r in ("", "_same", "_cross"):
    if f"tg.remote.roundtrip{r}.median_us" in FIG:
      t(f"launch + 4-byte read ≤ 80 µs median, tinygrad REMOTE{REGIME_NAMES[r[1:] or None]}", f"tg.remote.roundtrip{r}.median_us", "<=", 80, "µs", "{:.1f}")
  # issue 19: REMOTE's launch + read costs local CPU's plus about one round trip, the link's share of it
  t("launch + 4-byte read, REMOTE ≤ CPU's + 1.2× ping RTT, 1 CPU", "ratio.tg.roundtrip_over_cpu_vs_ping.same", "<=", 1.2, "×")
  t("write 64 MiB ≥ 0.9× C stream", "ratio.write64_vs_stream", ">=", 0.9, "×")
  t("read 64 MiB ≥ 0.9× C stream", "ratio.read64_vs_stream", ">=", 0.9, "×")
  t("write 64 MiB ≥ 2 GB/s", f"proto.write.{64 * MIB}", ">=", 2.0, "GB/s")
  t("read 64 MiB ≥ 2 GB/s", f"proto.read.{64 * MIB}", ">=", 2.0, "GB/s")
  # every default-on feature pays for itself: the defaults against the same binary with resumable sessions off (features)
  t("write 64 MiB, defaults ≥ 1/1.05× resume off", "feat.resume.ratio.write", ">=", 1 / 1.05, "×", "{:.3f}")
  t("read 64 MiB, defaults ≥ 1/1.05× resume off", "feat.resume.ratio.read", ">=", 1 / 1.05, "×", "{:.3f}")
  t("256 MiB weights through tinygrad REMOTE ≥ 0.8× C stream", "ratio.tg.weights_vs_stream", ">=", 0.8, "×")
  t("MLP step, loss read every step ≥ 0.85× local CPU", "ratio.tg.remote_vs_cpu.mlp_item", ">=", 0.85, "×")
  t("MLP step, sync every 50 steps ≥ 0.95× local CPU", "ratio.tg.remote_vs_cpu.mlp_sync", ">=", 0.95, "×")
  if "ratio.tg.remote1_vs_cpu.mlp_item" in FIG:
    t("  the same, REMOTE on 1 thread: loss read every step ≥ 0.85×", "ratio.tg.remote1_vs_cpu.mlp_item", ">=", 0.85, "×")
    t("  the same, REMOTE on 1 thread: sync every 50 steps ≥ 0.95×", "ratio.tg.remote1_vs_cpu.mlp_sync", ">=", 0.95, "×")
  t("stripped daemon ≤ 200 KiB", "foot.stripped", "<=", 200, "KiB", "{:.1f}")
  t("idle RSS ≤ 4 MiB", "foot.idle_rss", "<=", 4, "MiB", "{:.2f}")
  return T

def fmt_num(v:float|None, unit:str) -> str:
  if v is None: return "-"
  if unit.endswith("/s") and unit != "GB/s": return f"{v:,.0f}"
  if unit == "×": return f"{v:.2f}"
  if abs(v) >= 100: return f"{v:.0f}"
  if abs(v) >= 10: return f"{v:.1f}"
  return f"{v:.2f}"

RTT_REGIMES = ("same", "cross", "any")
TG_ROWS = ("launch.us_per_launch", *[f"{m}{r}.{k}" for m in ("roundtrip", "ping") for r in ("", "_same", "_cross") for k in ("median_us", "p90_us")],
           "copy.copyin_gbps", "copy.copyout_gbps", "weights.gbps", "mlp_item.steps_per_s", "mlp_sync.steps_per_s")
SECTIONS = [
  ("1. Link limit (C, loopback, two processes)", [*[f"link.echo_rtt.{r}" for r in RTT_REGIMES], "link.stream_4m", "link.stream_auto", "link.stream"]),
  ("2. Protocol level (Python client)", [*[f"{k}.{r}" for r in RTT_REGIMES for k in ("proto.ping_rtt", "ratio.ping_vs_echo", "proto.rawping_rtt",
                                                                                     "ratio.rawping_vs_echo", "ratio.ping_vs_rawping")],
     "proto.launch_1k", "proto.launch_100k", "proto.ping_after_burst",
     *[f"proto.{d}.{s}" for s, _ in SIZES for d in ("write", "read")], *[f"proto.{d}_us.{s}" for s, _ in SIZES for d in ("write", "read")],
     "ratio.write64_vs_stream", "ratio.read64_vs_stream", *[f"conc.{k}.{n}" for n in (1, 2, 4) for k in ("ping", "pings", "bulk")]]),
  ("3. tinygrad level: REMOTE (this runner) vs CPU (local), same NUM_CPU_THREADS", [
     *[f"tg.{s}.{m}" for m in TG_ROWS for s in ("remote", "remote1", "cpu")], "tg.stream", "ratio.tg.weights_vs_stream",
     "ratio.tg.roundtrip_over_cpu_vs_ping.same", *[f"ratio.tg.{p}.{m}" for p in ("remote_vs_cpu", "remote1_vs_cpu") for m in ("mlp_item", "mlp_sync")]]),
  ("4. tinygrad 0.11.0 REMOTE (--remote011)", [
     *[f"tg.{s}.{m}" for m in TG_ROWS for s in ("r011", "cpu011")],
     *[f"ratio.tg.{p}.{m}" for p in ("r011_vs_cpu011", "r011_vs_remote") for m in ("mlp_item", "mlp_sync")]]),
  ("5. Footprint", ["foot.stripped", "foot.unstripped", "foot.idle_rss", "foot.idle_private", "foot.session_rss", "foot.session_private",
                    "foot.thread_session"]),
  ("6. Runner features: on vs off", [f"feat.{f}.{x}.{k}" for f, *_ in FEATURES for k in FEAT_METRICS for x in ("on", "off", "ratio")]),
]

def table(T:list[dict]) -> str:
  lines, w = [], 64
  head = f"{'figure':<{w}} {'median':>11} {'min':>11} {'max':>11}  unit"
  for title, keys in SECTIONS:
    if title.startswith("6."):   # a table of its own: on, off and their ratio side by side
      lines += features_table()
      continue
    rows = [k for k in keys if k in FIG and "runs" in FIG[k]]
    if not rows: continue
    lines += ["", title, head, "-" * len(head)]
    for k in rows:
      f = FIG[k]
      lines.append(f"{f['label'][:w]:<{w}} {fmt_num(f['median'], f['unit']):>11} {fmt_num(f['min'], f['unit']):>11} "
                   f"{fmt_num(f['max'], f['unit']):>11}  {f['unit']}")
  errs = {k: v["error"] for k, v in FIG.items() if "error" in v}
  if errs: lines += ["", "Errors (figures missing)"] + [f"  {k}: {v}" for k, v in errs.items()]
  lines += ["", "Targets", f"{'target':<{w}} {'median':>11}  result", "-" * (w + 22)]
  for t in T:
    val = "-" if t["value"] is None else t["fmt"].format(t["value"]) + (" " + t["unit"] if t["unit"] != "×" else "×")
    lines.append(f"{t['target']:<{w}} {val:>11}  {'not measured' if t['met'] is None else 'met' if t['met'] else 'MISSED'}")
  return "\n".join(lines)

WORSE = 0.9   # --compare flags a figure whose oriented ratio is below this

def compare_rows() -> list[dict]:
  """Per figure of either side: both medians and the ratio oriented so that above 1 the new tree is better."""
  new, old = SIDES
  keys = [k for _, ks in SECTIONS for k in ks]
  keys += [k for k in {**new.fig, **old.fig} if k not in keys]
  rows = []
  for k in keys:
    a, b = new.fig.get(k, {}), old.fig.get(k, {})
    if not a.get("runs") and not b.get("runs"): continue
    f = a if a.get("runs") else b
    n, o = a.get("median"), b.get("median")
    ratio = None if not n or not o or f["better"] is None else n / o if f["better"] == "higher" else o / n
    worse = ratio is not None and ratio < WORSE
    # clearly worse: every new run worse than every old one (by chance alone: 1 in 20 with 3 runs a side, 1 in 252 with 5)
    ra, rb = a.get("runs", []), b.get("runs", [])
    clear = worse and (min(ra) > max(rb) if f["better"] == "lower" else max(ra) < min(rb))
    rows.append({"figure": k, "label": f["label"], "unit": f["unit"], "better": f["better"], "new": n, "old": o, "ratio": ratio,
                 "runs_new": ra, "runs_old": rb, "worse": worse, "runs_apart": clear})
  return rows

def compare_table(rows:list[dict]) -> str:
  new, old = SIDES
  w, by = 70, {r["figure"]: r for r in rows}
  L = [f"Comparison, one run: new = {new.rev} ({new.root}), old = {old.rev} (its daemon/ and client/, built in a temporary directory); "
       f"median of each side's runs, the sides alternating run by run",
       f"ratio = new/old where higher is better, old/new where lower is better: above 1.00 the new tree is better. Below {WORSE:.2f}: "
       f"WORSE when every new run is worse than every old one, worse? when their runs overlap (likely noise: more --reps).",
       "The C link and local tinygrad CPU rows run the same code on both sides: their ratios are this run's noise."]
  head = f"{'figure':<{w}} {'new':>11} {'old':>11} {'ratio':>6}  unit, better"
  seen = set()
  for title, keys in SECTIONS + [("Other figures", [r["figure"] for r in rows])]:
    sec = [by[k] for k in keys if k in by and k not in seen]
    if not sec: continue
    seen.update(r["figure"] for r in sec)
    L += ["", title, head, "-" * (len(head) + 8)]
    for r in sec:
      ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
      L.append(f"{r['label'][:w]:<{w}} {fmt_num(r['new'], r['unit']):>11} {fmt_num(r['old'], r['unit']):>11} {ratio:>6}  "
               f"{r['unit']}, {r['better'] or '?'}{'   WORSE' if r['runs_apart'] else '   worse?' if r['worse'] else ''}")
  errs = [(s.name, k, v["error"]) for s in SIDES for k, v in s.fig.items() if "error" in v]
  if errs: L += ["", "Errors (figures missing)"] + [f"  {s}: {k}: {e}" for s, k, e in errs]
  bad, maybe = [r["figure"] for r in rows if r["runs_apart"]], [r["figure"] for r in rows if r["worse"] and not r["runs_apart"]]
  L += ["", f"of {sum(r['ratio'] is not None for r in rows)} figures, {len(bad)} WORSE than {WORSE:.2f}× old" + (f" ({', '.join(bad)})" if bad else "") +
        f", {len(maybe)} below {WORSE:.2f}× with overlapping runs" + (f" ({', '.join(maybe)})" if maybe else "")]
  return "\n".join(L)

def machine() -> dict:
  cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
  return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "os": platform.platform(),
          "python": platform.python_version(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}

INFO: dict = {}
NET: dict = {}   # --only network: bench/netbench.py's results
import netbench  # noqa: E402
MULTI: dict = {}   # --only multi: bench/multirunner.py's runs
import multirunner  # noqa: E402
LLM_RUNNERS: dict = {}   # --only llmrunners: bench/llm_runners.py's runs
import llm_runners  # noqa: E402
LLM_FIRST_TOKEN: dict = {}   # --only llmfirsttoken: bench/llm_first_token.py's runs
import llm_first_token  # noqa: E402

def git(*a) -> str:
  return subprocess.check_output(["git", "-C", ROOT, *a], text=True, stderr=subprocess.PIPE).strip()

def build_rev(rev:str, work:pathlib.Path) -> str:
  """REV's daemon/ and client/ into work, its daemon built there (as ../shared/tools/perf-guard does); returns REV's short hash."""
  short = git("rev-parse", "--short", f"{rev}^{{commit}}")
  archive = subprocess.Popen(["git", "-C", ROOT, "archive", short, "daemon", "client"], stdout=subprocess.PIPE)
  subprocess.run(["tar", "-x", "-C", work], stdin=archive.stdout, check=True)
  if archive.wait() != 0: raise RuntimeError(f"git archive {short} daemon client failed")
  r = subprocess.run(["make", "-s", "-j2", "-C", work / "daemon", "metal_runner"], capture_output=True, text=True)
  if r.returncode != 0: raise RuntimeError(f"{short}'s daemon does not build:\n{(r.stdout + r.stderr)[-2000:]}")
  return short

def main():
  os.environ["METAL_RUNNER_TOKEN_FILE"] = ""   # the runners measured here have no token: a client holding one (~/.metal_runner_token too) refuses
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--quick", action="store_true", help="fewer and shorter runs (about a minute)")
  ap.add_argument("--remote011", action="store_true", help="also measure tinygrad 0.11.0's REMOTE device (creates bench/.venv011)")
  ap.add_argument("--profiles", default=None, help="network: only these link profiles, e.g. loopback,1GbE (names in bench/netbench.py)")
  ap.add_argument("--reps", type=int, default=None, help="runs per figure (default 5, --quick 3; with --compare 7, --quick 5)")
  ap.add_argument("--only", default="link,conc,tinygrad,footprint,features", help="sections, from link,conc,tinygrad,footprint,features,network "
                  "(network: over emulated links, bench/netbench.py; not in the default set, it takes about 15 minutes; multi: several runners as one, "
                  "bench/multirunner.py, not in the default set either; llmrunners: one model across runners, bench/llm_runners.py, nor that; llmfirsttoken: its time to first token, bench/llm_first_token.py, nor that)")
  ap.add_argument("--compare", metavar="REV", default=None, help="also build REV's daemon and client and measure both trees in the same run, "
                  "alternating: per figure new, old and their ratio (bench/results/compare.json)")
  args = ap.parse_args()
  reps = args.reps or (3 if args.quick else 5) + (2 if args.compare else 0)   # a ratio of two medians needs more runs than one figure
  only = set(args.only.split(","))
  for sec in ("network", "multi", "llmrunners", "llmfirsttoken"):
    if args.compare and sec in only:
      log(f"--compare does not cover {sec}: left out")
      only.discard(sec)
  LOGS.mkdir(parents=True, exist_ok=True)
  t0, load0 = time.time(), os.getloadavg()
  INFO.update(date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"), machine=machine(), quick=args.quick, reps=reps,
              remote011=args.remote011, sections=sorted(only))
  rev = "this tree"
  try:
    rev = INFO["git"] = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--", "daemon", "client"): rev = INFO["git"] = rev + " with uncommitted changes in daemon/ or client/"
  except (OSError, subprocess.CalledProcessError): pass
  log(f"building daemon and bench/echo.c ({reps} runs per figure{', quick' if args.quick else ''})")
  subprocess.run(["make", "-s", "-C", ROOT / "daemon"], check=True, stdout=subprocess.DEVNULL)
  subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-o", RESULTS / "echo", HERE / "echo.c"], check=True)
  SIDES.append(Side("new", ROOT, rev, FIG))
  work = None
  try:
    if args.compare:
      work = pathlib.Path(tempfile.mkdtemp(prefix="bench-compare-"))
      log(f"building {args.compare}'s daemon in {work}")
      SIDES.append(Side("old", work, build_rev(args.compare, work), {}))
      INFO["compare"] = {"new": rev, "old": SIDES[1].rev}
    for side in SIDES: side.runner = Proc([side.daemon, "--host", "127.0.0.1", "--port", "0", "--backend", "cpu"], name=side.tag("runner"))
    from client.connection import Runner
    with Runner(SIDES[0].runner.addr) as r: INFO["runner"] = {"addr": r.addr, "ncores": r.info.ncores, "cpu": r.info.cpu, "name": r.info.name}
    steps = [("link", "link and protocol", lambda: bench_link_and_protocol(reps, args.quick)),
             ("conc", "concurrent clients", lambda: bench_concurrency(reps, args.quick)),
             ("tinygrad", "tinygrad level", lambda: bench_tinygrad(reps, args.remote011, INFO["runner"]["ncores"], args.quick)),
             ("footprint", "footprint", lambda: bench_footprint(reps)),
             ("features", "runner features on and off", lambda: bench_features(reps, args.quick)),
             ("network", "over emulated links",
              lambda: NET.update(netbench.bench_network(sys.modules[__name__], SIDES[0].runner, log, args.quick, args.profiles))),
             ("multi", "several runners as one", lambda: MULTI.update(multirunner.bench(2 if args.quick else 3,
              ["small"] if args.quick else ["small", "wide"], (args.profiles or ("loopback" if args.quick else "loopback,10GbE,1GbE")).split(","),
              20 if args.quick else 60))),
             ("llmrunners", "one model across runners", lambda: LLM_RUNNERS.update(llm_runners.bench(1 if args.quick else 2))),
             ("llmfirsttoken", "time to first token across runners", lambda: LLM_FIRST_TOKEN.update(llm_first_token.bench(1 if args.quick else 2)))]
    for key, name, fn in steps:
      if key not in only: continue
      log(f"{name} ...")
      t = time.time()
      try: fn()
      except Exception as e:  # report and go on: a benchmark shows what it could measure
        import traceback
        traceback.print_exc()
        FIG[f"error.{key}"] = {"error": f"{type(e).__name__}: {e}"}
      INFO.setdefault("section_s", {})[key] = round(time.time() - t, 1)
  finally:
    for side in SIDES:
      if side.runner: side.runner.stop()
    if work: shutil.rmtree(work, ignore_errors=True)
  for side in SIDES: summarize(side.fig)
  INFO.update(duration_s=round(time.time() - t0, 1), loadavg_start=load0, loadavg_end=os.getloadavg())
  m = INFO["machine"]
  print(f"metal_runner benchmark, {INFO['date']}, {m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Python {m['python']}; "
        f"{reps} runs per figure, median [min, max]; {INFO['duration_s']:.0f} s; load average {load0[0]:.2f} at start, {INFO['loadavg_end'][0]:.2f} at end")
  if args.compare:
    rows = compare_rows()
    print(compare_table(rows))
    sides = {s.name: {"rev": s.rev, "root": str(s.root), "figures": s.fig} for s in SIDES}
    (RESULTS / "compare.json").write_text(json.dumps({"info": INFO, **sides, "worse_below": WORSE, "rows": rows}, indent=1, ensure_ascii=False))
    print(f"\ncomparison: {RESULTS / 'compare.json'}")
    return
  T = targets()
  print(table(T))
  if MULTI:
    MULTI["rows"] = multirunner.rows(MULTI)
    (RESULTS / "multirunner.json").write_text(json.dumps({"info": INFO, **MULTI}, indent=1))
    print("\n8. " + multirunner.table(MULTI["rows"], MULTI))
  if LLM_RUNNERS:
    (RESULTS / "llm_runners.json").write_text(json.dumps({"info": INFO, **LLM_RUNNERS}, indent=1))
    print("\n9. One model across runners\n" + "\n".join(llm_runners.summary(LLM_RUNNERS)))
  if LLM_FIRST_TOKEN:
    (RESULTS / "llm_first_token.json").write_text(json.dumps({"info": INFO, **LLM_FIRST_TOKEN}, indent=1))
    print("\n10. Time to first token across runners\n" + "\n".join(llm_first_token.summary(LLM_FIRST_TOKEN)))
  if NET:
    (RESULTS / "network.json").write_text(json.dumps({"info": INFO, **NET}, indent=1, ensure_ascii=False))   # the raw figures first
    (RESULTS / "network.json").write_text(json.dumps({"info": INFO, **NET, "rows": netbench.derive(NET)}, indent=1, ensure_ascii=False))
    print(netbench.table(NET))
    print(f"network figures: {RESULTS / 'network.json'}")
    try:
      import plot
      plot.draw_network(RESULTS / "network.json", RESULTS / "network.png")
      print(f"network plot: {RESULTS / 'network.png'}")
    except Exception as e: print(f"network plot: not drawn: {type(e).__name__}: {e}")
  (RESULTS / "latest.json").write_text(json.dumps({"info": INFO, "figures": FIG, "targets": [{k: v for k, v in t.items() if k != "fmt"} for t in T]},
                                                  indent=1, ensure_ascii=False))
  print(f"\nfigures: {RESULTS / 'latest.json'}")
  try:
    import plot
    plot.draw(RESULTS / "latest.json", RESULTS / "latest.png")
    print(f"plot: {RESULTS / 'latest.png'}")
  except ImportError as e: print(f"plot: not drawn ({e}; pip install matplotlib, or pip install -e '.[bench]')")
  except Exception as e: print(f"plot: not drawn: {type(e).__name__}: {e}")

if __name__ == "__main__":
  main()
