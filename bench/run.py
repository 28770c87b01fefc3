"""metal_runner benchmark: python3 bench/run.py [--quick] [--remote011]

Runs on loopback against a CPU-backend runner it starts itself, prints one table, writes bench/results/latest.json and draws
bench/results/latest.png. Every figure is the median of repeated runs, shown with their min and max; every comparison is a ratio of
figures measured in the same run, interleaved run by run (round trips and streams in short alternating blocks), so that a busy machine
slows both sides alike. It never fails on a number; a part that cannot run is reported in the table and the rest goes on.

  1. the link      C echo round trip (64 bytes, TCP_NODELAY) and a C TCP stream (4 MiB and kernel-tuned socket buffers; the faster is
                   the link limit), two processes each: bench/echo.c
  2. protocol      the Python client (client/connection.py): ping, pipelined launches of an empty kernel, write/read of 4 KiB..256 MiB,
                   1/2/4 concurrent clients, each its own process: bench/proto.py
  3. tinygrad      device REMOTE (this runner) against tinygrad's CPU device with the same NUM_CPU_THREADS (the runner's ncores), each in
                   its own process, plus REMOTE with 1 thread: bench/tg_worker.py (its docstring says exactly what is timed)
  4. --remote011   the same through tinygrad 0.11.0's REMOTE device (its HTTP server), from bench/.venv011: bench/remote011.py
  5. footprint     stripped daemon size, idle RSS, RSS per idle session (process and thread isolation)
  6. network       only with --only network (about 15 minutes): over EMULATED links (bench/linkemu.c), this runner vs local tinygrad and
                   0.11's REMOTE: bench/netbench.py

Round trips (C echo, ping, tinygrad's launch + read) are taken twice, with the server side (echo server, the runner's session process,
0.11's server) pinned to the first CPU and the client pinned to the same CPU ("1 CPU") or to the second ("2 CPUs"): on a VM, waking a
process on another vCPU costs tens of µs, so an unpinned round trip is one or the other at random.
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
  """A line-oriented measuring subprocess (tg_worker.py, proto.py conc): prints a ready line, then answers one JSON line per command."""
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

# *** figures: a list of runs -> median, min, max

FIG: dict[str, dict] = {}

def add(key:str, value:float, unit:str, label:str|None=None):
  f = FIG.setdefault(key, {"unit": unit, "label": label or key, "runs": []})
  f["runs"].append(value)

def summarize():
  for f in FIG.values():
    r = f["runs"]
    f.update(median=statistics.median(r), min=min(r), max=max(r), n=len(r))

def med(key:str) -> float|None:
  f = FIG.get(key)
  return statistics.median(f["runs"]) if f and f["runs"] else None

# *** 1 + 2: the link and the protocol, interleaved run by run

def echo_rtt(port:int, n:int, cpu:int|None=None) -> dict:
  pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
  return json.loads(subprocess.check_output([RESULTS / "echo", "rtt", str(port), str(n), "64"], text=True, preexec_fn=pin))

def echo_stream(port:int, nbytes:int, sockbuf:int=4 * MIB) -> dict:
  return json.loads(subprocess.check_output([RESULTS / "echo", "stream", str(port), str(nbytes), str(sockbuf)], text=True))

SIZES = [(4096, "4 KiB"), (MIB, "1 MiB"), (64 * MIB, "64 MiB"), (256 * MIB, "256 MiB")]

def session_pid(daemon_pid:int, connect):
  """connect() a client; returns (client, pid of the runner's session process for it) (process isolation forks one per connection)."""
  before = set(children(daemon_pid))
  c = connect()
  new = set(children(daemon_pid)) - before
  return c, (max(new) if len(new) == 1 else None)

def pinned(cpu:int|None):
  """Run the enclosed code on one CPU (None: leave affinity alone)."""
  import contextlib
  @contextlib.contextmanager
  def cm():
    old = os.sched_getaffinity(0)
    if cpu is not None: os.sched_setaffinity(0, {cpu})
    try: yield
    finally: os.sched_setaffinity(0, old)
  return cm()

def bench_link_and_protocol(runner:Proc, reps:int, quick:bool):
  from proto import Session, RawPing
  cpus = sorted(os.sched_getaffinity(0))
  regimes = [("same", cpus[0]), ("cross", cpus[1])] if len(cpus) >= 2 else [("any", None)]
  INFO["rtt_pinning"] = {"server_cpu": cpus[0] if len(cpus) >= 2 else None, "client_cpu": dict(regimes)}
  echo = Proc([RESULTS / "echo", "server"], name="echo-server")
  sinks = {"4m": Proc([RESULTS / "echo", "sink"], name="echo-sink-4m"), "auto": Proc([RESULTS / "echo", "sink", "0"], name="echo-sink-auto")}
  try:
    # separate connections, so that no figure inherits another's client state: pings; 1,000-launch batches; 100,000-launch batches; data
    pg, pg_pid = session_pid(runner.pid, lambda: Session(runner.addr, sizes=()))
    raw, raw_pid = session_pid(runner.pid, lambda: RawPing(runner.addr))
    if len(cpus) >= 2:
      for pid in (echo.pid, pg_pid, raw_pid):
        if pid: os.sched_setaffinity(pid, {cpus[0]})
    s, ln, lb = Session(runner.addr), Session(runner.addr, sizes=(4096,)), Session(runner.addr, sizes=(4096,))
    n_rtt, blocks = (500, 3) if quick else (1000, 6)
    counts = {4096: 1000 if quick else 2000, MIB: 32 if quick else 64, 256 * MIB: 1}
    for rep in range(reps):
      # the figures that are compared alternate in short blocks, so that both sides of a ratio see the same load
      rtt = {}
      for _ in range(blocks):
        for regime, cpu in regimes:
          rtt.setdefault(("e", regime), []).append(echo_rtt(echo.port, n_rtt, cpu)["median_us"])
          with pinned(cpu):
            rtt.setdefault(("p", regime), []).append(pg.ping(n_rtt)["median_us"])
            rtt.setdefault(("q", regime), []).append(raw.ping(n_rtt)["median_us"])
      for regime, _ in regimes:
        e, p, q = (statistics.median(rtt[(k, regime)]) for k in "epq")
        where = {"same": ", 1 CPU", "cross": ", 2 CPUs", "any": ""}[regime]
        add(f"link.echo_rtt.{regime}", e, "µs", f"C echo round trip, 64 B{where}")
        add(f"proto.ping_rtt.{regime}", p, "µs", f"ping round trip (Python client){where}")
        add(f"proto.rawping_rtt.{regime}", q, "µs", f"ping, minimal Python loop (1 send, 1 recv){where}")
        add(f"ratio.ping_vs_echo.{regime}", p / e, "×", f"ping RTT / C echo RTT{where}")
        add(f"ratio.rawping_vs_echo.{regime}", q / e, "×", f"minimal Python ping RTT / C echo RTT{where}")
      st4, sta, w64, r64 = [], [], [], []
      for _ in range(max(2, blocks // 2)):
        st4.append(echo_stream(sinks["4m"].port, 256 * MIB)["gbps"])
        sta.append(echo_stream(sinks["auto"].port, 256 * MIB, 0)["gbps"])
        w64.append(s.write(64 * MIB, 2))
        r64.append(s.read(64 * MIB, 2))
      st4, sta = statistics.median(st4), statistics.median(sta)
      add("link.stream_4m", st4, "GB/s", "C TCP stream, 4 MiB socket buffers")
      add("link.stream_auto", sta, "GB/s", "C TCP stream, kernel-tuned socket buffers")
      add("link.stream", st := max(st4, sta), "GB/s", "C TCP stream, the faster of the two (link limit)")
      for d, res in (("write", w64), ("read", r64)):
        add(f"proto.{d}.{64 * MIB}", g := statistics.median(x["gbps"] for x in res), "GB/s", f"{d} 64 MiB")
        add(f"proto.{d}_us.{64 * MIB}", statistics.median(x["us_per_op"] for x in res), "µs", f"{d} 64 MiB, time per {d}")
        add(f"ratio.{d}64_vs_stream", g / st, "×", f"{d} 64 MiB / C stream")
      for _ in range(3): add("proto.launch_1k", ln.launches(1000)["per_s"], "launches/s", "pipelined launches, 1,000 then sync")
      if rep == 0 or not quick:
        add("proto.launch_100k", lb.launches(100_000)["per_s"], "launches/s", "pipelined launches, 100,000 then sync")
        # the same ping, on the connection that has just had 100,000 requests in flight (see Runner._wait's bookkeeping)
        add("proto.ping_after_burst", lb.ping(n_rtt)["median_us"], "µs", "ping RTT on that connection right after the 100,000")
      for size, name in SIZES:
        if size == 64 * MIB: continue
        w, r = s.write(size, counts[size]), s.read(size, counts[size])
        add(f"proto.write.{size}", w["gbps"], "GB/s", f"write {name}")
        add(f"proto.read.{size}", r["gbps"], "GB/s", f"read {name}")
        add(f"proto.write_us.{size}", w["us_per_op"], "µs", f"write {name}, time per write")
        add(f"proto.read_us.{size}", r["us_per_op"], "µs", f"read {name}, time per read")
      log(f"  protocol run {rep + 1}/{reps}: " + "; ".join(f"{r}: echo {statistics.median(rtt[('e', r)]):.1f} µs, ping {statistics.median(rtt[('p', r)]):.1f} µs "
                                                          f"(minimal Python {statistics.median(rtt[('q', r)]):.1f} µs)" for r, _ in regimes) + f", stream {st:.2f} GB/s, "
          f"write/read 64 MiB {med(f'proto.write.{64 * MIB}'):.2f}/{med(f'proto.read.{64 * MIB}'):.2f} GB/s, launches {med('proto.launch_100k'):,.0f}/s")
    for x in (s, pg, ln, lb): x.r.close()
    raw.close()
  finally:
    echo.stop()
    for k in sinks.values(): k.stop()

def bench_concurrency(runner:Proc, reps:int, quick:bool):
  seconds = 0.3 if quick else 1.0
  for n in (1, 2, 4):
    ws = [Worker([sys.executable, HERE / "proto.py", "conc", runner.addr, seconds], os.environ.copy(), f"conc-{n}-{i}") for i in range(n)]
    try:
      for w in ws: w.ready(60)
      for _ in range(reps):
        for phase in ("ping", "bulk"):
          for w in ws: w.send(phase)
          res = [w.answer(60) for w in ws]
          if phase == "ping":
            add(f"conc.ping.{n}", statistics.median(r["mean_us"] for r in res), "µs", f"{n} client(s): ping RTT per client (median client)")
            add(f"conc.pings.{n}", sum(r["pings"] / r["seconds"] for r in res), "pings/s", f"{n} client(s): pings per second, all clients")
          else: add(f"conc.bulk.{n}", sum(r["gbps"] for r in res), "GB/s", f"{n} client(s): 64 MiB write+read, all clients")
      log(f"  {n} client(s): ping {med(f'conc.ping.{n}'):.1f} µs, {med(f'conc.bulk.{n}'):.2f} GB/s")
    finally:
      for w in ws:
        try: w.send("quit")
        except BrokenPipeError: pass
        w.stop()

# *** 3 + 4: tinygrad level, one process per side, interleaved

TG_METRICS = [("launch", 3), ("roundtrip", 1), ("copy", 1), ("mlp_item", 1), ("mlp_sync", 1)]

def tg_env(base:dict, **kw) -> dict:
  env = {k: v for k, v in base.items() if k not in ("DEV", "CPU", "REMOTE", "HOST", "DEBUG", "BEAM", "JIT", "METAL_RUNNER")}
  env.update({k: str(v) for k, v in kw.items()})
  return env

def set_affinity(pid:int, cpus:set[int]):
  """Every thread of process pid onto cpus."""
  for tid in os.listdir(f"/proc/{pid}/task"):
    try: os.sched_setaffinity(int(tid), cpus)
    except OSError: pass   # a thread that has just exited

def bench_tinygrad(runner:Proc, reps:int, remote011:bool, threads:int, quick:bool):
  cpus = sorted(os.sched_getaffinity(0))
  regimes = [("same", cpus[0]), ("cross", cpus[1])] if len(cpus) >= 2 else []
  before = set(children(runner.pid))
  sides = {
    "remote": Worker([sys.executable, HERE / "tg_worker.py", "REMOTE"], tg_env(os.environ, DEV="REMOTE", METAL_RUNNER=runner.addr,
                                                                            NUM_CPU_THREADS=threads), "tg-remote"),
    "cpu": Worker([sys.executable, HERE / "tg_worker.py", "CPU"], tg_env(os.environ, DEV="CPU", NUM_CPU_THREADS=threads), "tg-cpu"),
  }
  server011, peers = None, {}
  try:
    if remote011:
      try:
        import remote011 as r011
        py = r011.setup(sys.stderr)
        server011 = Proc([py, HERE / "remote011.py", "server"], env=tg_env(os.environ, REMOTEDEV="CPU"), name="remote011-server")
        sides["r011"] = Worker([py, HERE / "tg_worker.py", "REMOTE"], tg_env(os.environ, REMOTE=1, HOST=server011.addr), "tg-r011")
        sides["cpu011"] = Worker([py, HERE / "tg_worker.py", "CPU"], tg_env(os.environ, CPU=1), "tg-cpu011")
        peers["r011"] = server011.pid
      except Exception as e:
        FIG["error.remote011"] = {"error": f"{type(e).__name__}: {e}"}
        log(f"  --remote011: {e}")
    try:
      sides["remote"].ready()
      # the REMOTE worker's session process (for the pinned round trips): the only new child of the runner so far
      if len(new := set(children(runner.pid)) - before) == 1: peers["remote"] = new.pop()
    except Exception: pass  # reported below
    if threads > 1:  # tinygrad 0.14's CPU device runs a kernel's core_id slices one after another: the same work on one runner thread too
      sides["remote1"] = Worker([sys.executable, HERE / "tg_worker.py", "REMOTE"], tg_env(os.environ, DEV="REMOTE", METAL_RUNNER=runner.addr,
                                                                                   NUM_CPU_THREADS=1), "tg-remote1")
    for name, w in list(sides.items()):
      if w.info is not None: continue
      try: w.ready()
      except Exception as e:
        FIG[f"error.tg.{name}"] = {"error": str(e)}
        log(f"  tinygrad {name}: {e}")
        del sides[name]
    INFO["tinygrad_sides"] = {k: w.info for k, w in sides.items()}

    def ask(side:str, metric:str, regime:str|None=None) -> dict|None:
      """One measurement; with a regime, the latency is taken with the server side (session process, 0.11's server) on the first CPU
      and the client on the same or the other CPU, as for the round trips of section 2."""
      w, name = sides[side], metric + (f"_{regime}" if regime else "")
      try:
        if regime:
          set_affinity(peers[side], {cpus[0]})
          set_affinity(w.p.pid, {dict(regimes)[regime]})
        res = w.ask(f"{metric} quick" if quick else metric)
      finally:
        if regime:
          set_affinity(peers[side], set(cpus))
          set_affinity(w.p.pid, set(cpus))
      if "error" in res:
        FIG[f"error.tg.{side}.{name}"] = res
        return None
      for k, v in res.items():
        if k != "steps": add(f"tg.{side}.{name}.{k}", v, UNITS[k], f"{SIDE_NAMES[side]}: {METRIC_NAMES[metric]}{KEY_NAMES[k]}{REGIME_NAMES[regime]}")
      return res

    for rep in range(reps):
      order = list(sides) if rep % 2 == 0 else list(reversed(sides))
      for metric, times in TG_METRICS:
        for _ in range(times):
          got = {}
          for side in order:
            if side == "remote1" and not metric.startswith("mlp"): continue
            if metric == "roundtrip" and side in peers and regimes:
              for regime, _ in regimes: ask(side, metric, regime)
            elif (res := ask(side, metric)) is not None: got[side] = res
          for a, b, label in (("remote", "cpu", "REMOTE / CPU"), ("remote1", "cpu", "REMOTE 1 thread / CPU"), ("r011", "cpu011", "0.11 REMOTE / 0.11 CPU"),
                              ("r011", "remote", "0.11 REMOTE / REMOTE")):
            if a in got and b in got and metric.startswith("mlp"):
              add(f"ratio.tg.{a}_vs_{b}.{metric}", got[a]["steps_per_s"] / got[b]["steps_per_s"], "×", f"{METRIC_NAMES[metric]}: {label}")
      log(f"  tinygrad run {rep + 1}/{reps}: " + ", ".join(f"{s} mlp {med(f'tg.{s}.mlp_item.steps_per_s') or 0:.0f}/{med(f'tg.{s}.mlp_sync.steps_per_s') or 0:.0f} steps/s"
                                                             for s in sides))
  finally:
    for w in sides.values(): w.stop()
    if server011: server011.stop()

REGIME_NAMES = {None: "", "same": ", 1 CPU", "cross": ", 2 CPUs"}
KEY_NAMES = {"us_per_launch": " (1,000 then sync), per launch", "median_us": ", median", "p90_us": ", p90", "copyin_gbps": " copyin",
             "copyout_gbps": " copyout", "steps_per_s": ""}
UNITS = {"us_per_launch": "µs", "median_us": "µs", "p90_us": "µs", "copyin_gbps": "GB/s", "copyout_gbps": "GB/s", "steps_per_s": "steps/s"}
SIDE_NAMES = {"remote": "REMOTE", "remote1": "REMOTE, 1 thread", "cpu": "CPU", "r011": "0.11 REMOTE", "cpu011": "0.11 CPU"}
METRIC_NAMES = {"launch": "raw program launch", "roundtrip": "launch + 4-byte read", "copy": "64 MiB", "mlp_item": "MLP, loss read every step",
                "mlp_sync": "MLP, sync every 50 steps"}

# *** 5: footprint

def rss_kib(pid:int) -> int:
  return int(re.search(r"VmRSS:\s+(\d+)", pathlib.Path(f"/proc/{pid}/status").read_text()).group(1))

def private_kib(pid:int) -> int:
  t = pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text()
  return sum(int(re.search(rf"{k}:\s+(\d+)", t).group(1)) for k in ("Private_Clean", "Private_Dirty"))

def children(pid:int) -> list[int]:
  return [int(x) for x in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

def bench_footprint(reps:int):
  from client.connection import Runner
  with tempfile.TemporaryDirectory() as d:
    shutil.copy(DAEMON, stripped := pathlib.Path(d) / "metal_runner")
    subprocess.run(["strip", stripped], check=True)
    add("foot.stripped", stripped.stat().st_size / 1024, "KiB", "stripped daemon binary")
    add("foot.unstripped", DAEMON.stat().st_size / 1024, "KiB", "daemon binary as built (-O2 -g)")
  nsess = 8
  for _ in range(reps):
    d = Proc([DAEMON, "--host", "127.0.0.1", "--port", "0", "--backend", "cpu"], name="footprint-process")
    try:
      time.sleep(0.2)
      add("foot.idle_rss", rss_kib(d.pid) / 1024, "MiB", "idle daemon VmRSS (listening)")
      add("foot.idle_private", private_kib(d.pid), "KiB", "idle daemon private memory (smaps)")
      conns = [Runner(d.addr) for _ in range(nsess)]
      for c in conns: c.ping()
      kids = children(d.pid)
      add("foot.session_rss", statistics.median(rss_kib(k) for k in kids) / 1024, "MiB", "idle session process VmRSS (process isolation)")
      add("foot.session_private", statistics.median(private_kib(k) for k in kids), "KiB", "idle session process private memory (smaps)")
      for c in conns: c.close()
    finally: d.stop()
    d = Proc([DAEMON, "--host", "127.0.0.1", "--port", "0", "--backend", "cpu", "--isolation", "thread"], name="footprint-thread")
    try:
      time.sleep(0.2)
      before = rss_kib(d.pid)
      conns = [Runner(d.addr) for _ in range(nsess)]
      for c in conns: c.ping()
      time.sleep(0.1)
      add("foot.thread_session", (rss_kib(d.pid) - before) / nsess, "KiB", "daemon VmRSS growth per idle session (thread isolation)")
      for c in conns: c.close()
    finally: d.stop()

# *** targets, table, JSON

def targets() -> list[dict]:
  T = []
  def t(name, key, op, limit, unit, fmt="{:.2f}"):
    v = med(key)
    T.append({"target": name, "figure": key, "value": v, "limit": limit, "op": op, "unit": unit,
              "met": None if v is None else (v <= limit if op == "<=" else v >= limit), "fmt": fmt})
  for regime, where in (("same", ", 1 CPU"), ("cross", ", 2 CPUs"), ("any", "")):
    if f"ratio.ping_vs_echo.{regime}" in FIG: t(f"ping RTT ≤ 1.6× C echo RTT{where}", f"ratio.ping_vs_echo.{regime}", "<=", 1.6, "×")
  if "proto.ping_rtt.same" in FIG and "proto.rawping_rtt.same" in FIG:   # issue 10: the client's own overhead per round trip
    add("ratio.ping_vs_rawping.same", med("proto.ping_rtt.same") / med("proto.rawping_rtt.same"), "×", "ping RTT / minimal Python loop, 1 CPU")
    FIG["ratio.ping_vs_rawping.same"].update(median=FIG["ratio.ping_vs_rawping.same"]["runs"][0], min=0, max=0, n=1)
    t("ping RTT ≤ 1.3× minimal Python send/recv loop, 1 CPU", "ratio.ping_vs_rawping.same", "<=", 1.3, "×")
  t("pipelined launches (1,000) ≥ 100,000/s, protocol", "proto.launch_1k", ">=", 100_000, "/s", "{:,.0f}")
  t("pipelined launches (100,000) ≥ 100,000/s, protocol", "proto.launch_100k", ">=", 100_000, "/s", "{:,.0f}")
  t("≤ 10 µs per launch, tinygrad REMOTE", "tg.remote.launch.us_per_launch", "<=", 10, "µs", "{:.1f}")
  for r in ("", "_same", "_cross"):
    if f"tg.remote.roundtrip{r}.median_us" in FIG:
      t(f"launch + 4-byte read ≤ 80 µs median, tinygrad REMOTE{REGIME_NAMES[r[1:] or None]}", f"tg.remote.roundtrip{r}.median_us", "<=", 80, "µs", "{:.1f}")
  t("write 64 MiB ≥ 65% of C stream", "ratio.write64_vs_stream", ">=", 0.65, "×")
  t("read 64 MiB ≥ 65% of C stream", "ratio.read64_vs_stream", ">=", 0.65, "×")
  t("write 64 MiB ≥ 2 GB/s", f"proto.write.{64 * MIB}", ">=", 2.0, "GB/s")
  t("read 64 MiB ≥ 2 GB/s", f"proto.read.{64 * MIB}", ">=", 2.0, "GB/s")
  t("MLP step, loss read every step ≥ 0.85× local CPU", "ratio.tg.remote_vs_cpu.mlp_item", ">=", 0.85, "×")
  t("MLP step, sync every 50 steps ≥ 0.95× local CPU", "ratio.tg.remote_vs_cpu.mlp_sync", ">=", 0.95, "×")
  if "ratio.tg.remote1_vs_cpu.mlp_item" in FIG:
    t("  the same, REMOTE on 1 thread: loss read every step ≥ 0.85×", "ratio.tg.remote1_vs_cpu.mlp_item", ">=", 0.85, "×")
    t("  the same, REMOTE on 1 thread: sync every 50 steps ≥ 0.95×", "ratio.tg.remote1_vs_cpu.mlp_sync", ">=", 0.95, "×")
  t("stripped daemon ≤ 200 KiB", "foot.stripped", "<=", 200, "KiB", "{:.1f}")
  t("idle RSS ≤ 4 MiB", "foot.idle_rss", "<=", 4, "MiB", "{:.2f}")
  return T

def fmt_num(v:float, unit:str) -> str:
  if v is None: return "-"
  if unit.endswith("/s") and unit != "GB/s": return f"{v:,.0f}"
  if unit == "×": return f"{v:.2f}"
  if abs(v) >= 100: return f"{v:.0f}"
  if abs(v) >= 10: return f"{v:.1f}"
  return f"{v:.2f}"

RTT_REGIMES = ("same", "cross", "any")
TG_ROWS = ("launch.us_per_launch", *[f"roundtrip{r}.{k}" for r in ("", "_same", "_cross") for k in ("median_us", "p90_us")], "copy.copyin_gbps",
           "copy.copyout_gbps", "mlp_item.steps_per_s", "mlp_sync.steps_per_s")
SECTIONS = [
  ("1. Link limit (C, loopback, two processes)", [*[f"link.echo_rtt.{r}" for r in RTT_REGIMES], "link.stream_4m", "link.stream_auto", "link.stream"]),
  ("2. Protocol level (Python client)", [*[f"{k}.{r}" for r in RTT_REGIMES for k in ("proto.ping_rtt", "ratio.ping_vs_echo", "proto.rawping_rtt",
                                                                                     "ratio.rawping_vs_echo")], "proto.launch_1k", "proto.launch_100k", "proto.ping_after_burst",
     *[f"proto.{d}.{s}" for s, _ in SIZES for d in ("write", "read")], *[f"proto.{d}_us.{s}" for s, _ in SIZES for d in ("write", "read")],
     "ratio.write64_vs_stream", "ratio.read64_vs_stream", *[f"conc.{k}.{n}" for n in (1, 2, 4) for k in ("ping", "pings", "bulk")]]),
  ("3. tinygrad level: REMOTE (this runner) vs CPU (local), same NUM_CPU_THREADS", [
     *[f"tg.{s}.{m}" for m in TG_ROWS for s in ("remote", "remote1", "cpu")],
     *[f"ratio.tg.{p}.{m}" for p in ("remote_vs_cpu", "remote1_vs_cpu") for m in ("mlp_item", "mlp_sync")]]),
  ("4. tinygrad 0.11.0 REMOTE (--remote011)", [
     *[f"tg.{s}.{m}" for m in TG_ROWS for s in ("r011", "cpu011")],
     *[f"ratio.tg.{p}.{m}" for p in ("r011_vs_cpu011", "r011_vs_remote") for m in ("mlp_item", "mlp_sync")]]),
  ("5. Footprint", ["foot.stripped", "foot.unstripped", "foot.idle_rss", "foot.idle_private", "foot.session_rss", "foot.session_private",
                    "foot.thread_session"]),
]

def table(T:list[dict]) -> str:
  lines, w = [], 64
  head = f"{'figure':<{w}} {'median':>11} {'min':>11} {'max':>11}  unit"
  for title, keys in SECTIONS:
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

def machine() -> dict:
  cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
  return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "os": platform.platform(),
          "python": platform.python_version(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}

INFO: dict = {}
NET: dict = {}   # --only network: bench/netbench.py's results
import netbench  # noqa: E402

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--quick", action="store_true", help="fewer and shorter runs (about a minute)")
  ap.add_argument("--remote011", action="store_true", help="also measure tinygrad 0.11.0's REMOTE device (creates bench/.venv011)")
  ap.add_argument("--profiles", default=None, help="network: only these link profiles, e.g. loopback,1GbE (names in bench/netbench.py)")
  ap.add_argument("--reps", type=int, default=None, help="runs per figure (default 5, --quick 3)")
  ap.add_argument("--only", default="link,conc,tinygrad,footprint", help="sections, from link,conc,tinygrad,footprint,network (network: "
                  "over emulated links, bench/netbench.py; not in the default set, it takes about 15 minutes)")
  args = ap.parse_args()
  reps, only = args.reps or (3 if args.quick else 5), set(args.only.split(","))
  LOGS.mkdir(parents=True, exist_ok=True)
  t0, load0 = time.time(), os.getloadavg()
  INFO.update(date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"), machine=machine(), quick=args.quick, reps=reps,
              remote011=args.remote011)
  try: INFO["git"] = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True).strip()
  except (OSError, subprocess.CalledProcessError): pass
  log(f"building daemon and bench/echo.c ({reps} runs per figure{', quick' if args.quick else ''})")
  subprocess.run(["make", "-s", "-C", ROOT / "daemon"], check=True, stdout=subprocess.DEVNULL)
  subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-o", RESULTS / "echo", HERE / "echo.c"], check=True)
  runner = Proc([DAEMON, "--host", "127.0.0.1", "--port", "0", "--backend", "cpu"], name="runner")
  try:
    from client.connection import Runner
    with Runner(runner.addr) as r: INFO["runner"] = {"addr": runner.addr, "ncores": r.info.ncores, "cpu": r.info.cpu, "name": r.info.name}
    steps = [("link", "link and protocol", lambda: bench_link_and_protocol(runner, reps, args.quick)),
             ("conc", "concurrent clients", lambda: bench_concurrency(runner, reps, args.quick)),
             ("tinygrad", "tinygrad level", lambda: bench_tinygrad(runner, reps, args.remote011, INFO["runner"]["ncores"], args.quick)),
             ("footprint", "footprint", lambda: bench_footprint(reps)),
             ("network", "over emulated links",
              lambda: NET.update(netbench.bench_network(sys.modules[__name__], runner, log, args.quick, args.profiles)))]
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
  finally: runner.stop()
  summarize()
  INFO.update(duration_s=round(time.time() - t0, 1), loadavg_start=load0, loadavg_end=os.getloadavg())
  T = targets()
  out = table(T)
  m = INFO["machine"]
  print(f"metal_runner benchmark, {INFO['date']}, {m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Python {m['python']}; "
        f"{reps} runs per figure, median [min, max]; {INFO['duration_s']:.0f} s; load average {load0[0]:.2f} at start, {INFO['loadavg_end'][0]:.2f} at end")
  print(out)
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
  figures = {k: {kk: vv for kk, vv in v.items()} for k, v in FIG.items()}
  (RESULTS / "latest.json").write_text(json.dumps({"info": INFO, "figures": figures, "targets": [{k: v for k, v in t.items() if k != "fmt"} for t in T]},
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
