"""One graph across runners (client/graph.py, protocol.md Links between runners): a TinyJit step sharded over two runners, or split
by layers between them, is one Tgraphrun per runner per step with the copies passed runner to runner on links, and gives tinygrad's
CPU device's results. Faults: a link cut between the runners, a runner that stalls past the frame timeout, a runner that dies, and
runners that cannot reach each other (the copies then go through the client). Each program runs in a python of its own."""
import json, os, re, signal, subprocess, sys, threading, time
import pytest
from conftest import ROOT, metal_runner_proc, needs_own_metal_runner, run_python, runner
from link_cutter import LinkCutter

# A sharded step (tensor parallel: an all-reduce between the runners) and a layer split (.to() one way, the result back), both in one
# TinyJit, with a device read each step; counts each runner's requests per step. STEPS steps; the first two capture.
PROGRAM = r"""
import json, os, sys, time, numpy as np, client.remote_metal
from client.connection import Runner, RunnerError
from tinygrad import Device, Tensor, TinyJit
DEV, MODE, STEPS = os.environ["T_DEV"], os.environ["T_MODE"], int(os.environ.get("T_STEPS", "6"))
devs = (f"{DEV}:0", f"{DEV}:1")
calls = {d: {"graph_run": 0} for d in devs}
for d in devs:
  r = Device[d].runner
  def counting(*a, _f=r.graph_run, _d=d, **k):
    calls[_d]["graph_run"] += 1
    return _f(*a, **k)
  r.graph_run = counting
rng = np.random.default_rng(0)
w1, w2 = rng.standard_normal((32, 64), dtype=np.float32) / 8, rng.standard_normal((64, 32), dtype=np.float32) / 4
def model(dev, mode):
  if mode == "tp": W1, W2 = Tensor(w1, device=devs[0]).shard(dev, axis=0), Tensor(w2, device=devs[0]).shard(dev, axis=1)
  elif mode == "split": W1, W2 = Tensor(w1, device=dev[0]), Tensor(w2, device=dev[-1])
  else: W1, W2 = Tensor(w1, device=dev[0]), Tensor(w2, device=dev[0])
  W1, W2 = W1.realize(), W2.realize()
  @TinyJit
  def step(x):
    h = (W1 @ x).relu()
    if mode == "split": h = h.to(dev[-1])
    y = (W2 @ h).tanh()
    return (y.to(dev[0]) if mode == "split" else y).realize()
  return step
def run(dev, mode, n, fault=None, on_step=None):
  # n steps, each on its own input (a stale result would show): {step: output} of the steps that worked, and the errors
  step, out, errs = model(dev, mode), {}, []
  for i in range(n):
    if fault is not None and i == n // 2: fault()
    if on_step is not None: on_step(i)
    x = Tensor(np.linspace(-1, 1, 64, dtype=np.float32).reshape(64, 1) * (i + 1), device="CPU")   # written from the host, no read
    try: out[i] = step((x.shard(dev) if mode == "tp" else x.to(dev[0])).realize()).numpy().copy()
    except RunnerError as e: errs.append(str(e))
  return out, errs
def worst(got, ref): return max(float(np.abs(got[i] - ref[i]).max()) for i in got) if got else None
ref, _ = run(("CPU",), "one", STEPS)
"""

MEASURE = PROGRAM + r"""
WARM = 3   # the first call runs the function, the second captures, the third defines the runner graphs
s0, g0 = {d: Device[d].runner.stats() for d in devs}, {d: calls[d]["graph_run"] for d in devs}
got, errs = run(devs, MODE, STEPS, on_step=lambda i: (s0.update({d: Device[d].runner.stats() for d in devs}),
                                                        g0.update({d: calls[d]["graph_run"] for d in devs})) if i == WARM else None)
s1 = {d: Device[d].runner.stats() for d in devs}
print(json.dumps({"err": worst(got, ref), "n": len(got), "errs": errs, "measured": STEPS - WARM,
                  "graph_runs": [calls[d]["graph_run"] - g0[d] for d in devs],
                  "round_trips": [s1[d]["round_trips"] - s0[d]["round_trips"] for d in devs]}))
"""

def measure(dev:str, mode:str, addrs:list[str], steps:int=6, env:dict|None=None) -> dict:
  r = run_python(MEASURE, {"T_DEV": dev, "T_MODE": mode, "T_STEPS": str(steps), "METAL_RUNNER": ",".join(addrs), **(env or {})})
  assert r.returncode == 0, r.stderr[-3000:]
  return {**json.loads(r.stdout.splitlines()[-1]), "stderr": r.stderr}

def check_one_graph_per_runner(out:dict, steps:int):
  assert out["err"] < 1e-5 and out["n"] == steps and out["errs"] == [], out
  # after the warm-up, each step is one Tgraphrun per runner, and its one round trip is the program's read (here from runner 0):
  # runner 1 is never waited for
  assert out["graph_runs"] == [out["measured"]] * 2 and out["round_trips"] == [out["measured"], 0], out

@pytest.mark.cpu_only
@pytest.mark.parametrize("iso", ["process", "thread"])
@pytest.mark.parametrize("mode", ["tp", "split"])
def test_a_step_over_two_runners_is_one_graph_per_runner(daemon_bin, iso, mode):
  with runner("--isolation", iso) as (a0, _), runner("--isolation", iso) as (a1, _):
    check_one_graph_per_runner(measure("REMOTE", mode, [a0, a1], steps=8), 8)

@pytest.mark.metal
@pytest.mark.parametrize("mode", ["tp", "split"])
def test_a_step_over_two_metal_runners_is_one_graph_per_runner(mode):
  """The same on two runners of the Metal backend (the Metal emulator, a test harness, on Linux)."""
  needs_own_metal_runner()
  r0, r1 = metal_runner_proc(), metal_runner_proc()
  try: check_one_graph_per_runner(measure("METAL", mode, [r0.addr, r1.addr], steps=8), 8)
  finally: r0.stop(), r1.stop()

@pytest.mark.cpu_only
def test_runners_that_cannot_reach_each_other_copy_through_the_client(daemon_bin):
  """Runner 0 is told to reach runner 1 at a port where nothing listens: the link's Tdial fails with EPEER, DEBUG=1 says so once,
  and the copies go through this host between graph parts; the results are the same."""
  with runner() as (a0, _), runner() as (a1, _):
    out = measure("REMOTE", "tp", [a0, a1], steps=6, env={"METAL_RUNNER_PEER_VIA": f"{a1}=127.0.0.1:1,{a0}=127.0.0.1:1", "DEBUG": "1"})
  assert out["err"] < 1e-5 and out["n"] == 6 and out["errs"] == [], out
  assert out["stderr"].count("copying through this host") == 2, out["stderr"][-2000:]   # once per direction
  assert out["graph_runs"][0] > 5 and out["graph_runs"][1] > 5, out   # the graphs are cut at the copies

FAULT = PROGRAM + r"""
import signal, subprocess
def fault():
  for sig, pid in json.loads(os.environ["T_FAULT"]): os.kill(pid, sig)
  if os.environ.get("T_CUT"): open(os.environ["T_CUT"], "w").write("cut")   # the test cuts the relay, then removes the file
  t = time.monotonic()
  while os.environ.get("T_CUT") and os.path.exists(os.environ["T_CUT"]) and time.monotonic() - t < 10: time.sleep(0.01)
  for pid in json.loads(os.environ.get("T_CONT", "[]")): threading.Timer(float(os.environ["T_STALL"]), os.kill, (pid, signal.SIGCONT)).start()
import threading
t0 = time.monotonic()
got, errs = run(devs, MODE, STEPS, fault)
print(json.dumps({"errs": errs, "n": len(got), "seconds": time.monotonic() - t0,
                  "err": worst(got, ref), "last": max(got) if got else None,
                  "alive": [Device[d].runner.ping(b"x") == b"x" for d in devs]}))
"""

def cut_mid_run(dev:str, a0:str, a1:str, cut):
  """A FAULT run of 8 tensor-parallel steps whose links go through relays (METAL_RUNNER_PEER_VIA) that are cut at step 4."""
  with LinkCutter(a0) as l0, LinkCutter(a1) as l1:
    def cutter():
      while not stop.is_set():
        if cut.exists():
          l0.cut(), l1.cut()
          cut.unlink()
        time.sleep(0.01)
    stop = threading.Event()
    threading.Thread(target=cutter, daemon=True).start()
    try:
      r = run_python(FAULT, {"T_DEV": dev, "T_MODE": "tp", "T_STEPS": "8", "METAL_RUNNER": f"{a0},{a1}", "T_FAULT": "[]",
                             "T_CUT": str(cut), "METAL_RUNNER_PEER_VIA": f"{a0}={l0.addr},{a1}={l1.addr}"}, timeout=120)
    finally: stop.set()
    assert r.returncode == 0, r.stderr[-3000:]
    assert l0.cuts + l1.cuts >= 1, "the relay carried no link"
  out = json.loads(r.stdout.splitlines()[-1])
  assert 1 <= len(out["errs"]) <= 2 and all("EPEER" in e and "link" in e for e in out["errs"]), out
  assert out["n"] >= 8 - 2 and out["err"] is not None and out["err"] < 1e-5 and out["alive"] == [True, True], out
  assert out["seconds"] < 30, out   # no hang: each wait ends within the runners' 2 s frame timeout

@pytest.mark.cpu_only
@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_link_cut_between_runners_fails_that_step_and_the_next_makes_new_links(daemon_bin, tmp_path, iso):
  """The links go through a relay that the test cuts in the middle of the run: that step fails with EPEER naming the link, within
  the frame timeout, both sessions stay usable, and the next step sets up new links through the relay and gives the right result."""
  with runner("--isolation", iso, "--frame-timeout", "2") as (a0, _), runner("--isolation", iso, "--frame-timeout", "2") as (a1, _):
    cut_mid_run("REMOTE", a0, a1, tmp_path / "cut")

@pytest.mark.metal
def test_a_link_cut_between_metal_runners_fails_that_step_and_the_next_makes_new_links(tmp_path):
  """The same between two runners of the Metal backend (the Metal emulator, a test harness, on Linux)."""
  needs_own_metal_runner()
  r0, r1 = metal_runner_proc("--frame-timeout", "2"), metal_runner_proc("--frame-timeout", "2")
  try: cut_mid_run("METAL", r0.addr, r1.addr, tmp_path / "cut")
  finally: r0.stop(), r1.stop()

@pytest.mark.cpu_only
@pytest.mark.parametrize("iso", ["process", "thread"])
def test_a_runner_that_stalls_past_the_frame_timeout_fails_the_step_not_the_sessions(daemon_bin, iso):
  """Runner 1 (its process group: the runner and its session processes) is stopped (SIGSTOP) for 4 s in the middle of the run;
  runner 0 waits for its data 2 s (its frame timeout), breaks the link and fails the step with EPEER; once runner 1 runs again, the
  next steps make new links and give the right results."""
  with runner("--isolation", iso, "--frame-timeout", "2") as (a0, _), runner("--isolation", iso, "--frame-timeout", "2") as (a1, p1):
    r = run_python(FAULT, {"T_DEV": "REMOTE", "T_MODE": "tp", "T_STEPS": "8", "METAL_RUNNER": f"{a0},{a1}",
                           "T_FAULT": json.dumps([[int(signal.SIGSTOP), -p1.pid]]), "T_CONT": json.dumps([-p1.pid]), "T_STALL": "4"},
                   timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.splitlines()[-1])
  assert out["errs"] and all("EPEER" in e for e in out["errs"]), out
  assert any("2 s" in e for e in out["errs"]), out   # the frame timeout, named
  assert out["err"] is not None and out["err"] < 1e-5 and out["alive"] == [True, True], out

@pytest.mark.cpu_only
def test_a_runner_that_dies_mid_run_leaves_the_other_session_usable(daemon_bin):
  """Runner 1 is killed in the middle of the run: runner 0's step fails with EPEER naming its link to runner 1, whose peer closed
  (link.c's peer_closed, before the send), within the frame timeout, not a hang, and runner 0's session still answers."""
  code = PROGRAM + r"""
step = model(devs, "tp")
x = Tensor(np.ones((64, 1), dtype=np.float32), device=devs[0])
for i in range(3): step(x.shard(devs).realize()).numpy()
t0 = time.monotonic()
os.kill(int(os.environ["T_PID"]), 9)
try:
  step(x.shard(devs).realize())
  Device[devs[0]].runner.sync()
  print(json.dumps({"err": None}))
except Exception as e: err = str(e)
try: Device[devs[0]].runner.sync()
except Exception: pass
print(json.dumps({"err": err, "seconds": time.monotonic() - t0, "alive": Device[devs[0]].runner.ping(b"y") == b"y"}))
os._exit(0)   # the other device's connection is gone: no orderly shutdown
"""
  with runner("--frame-timeout", "2") as (a0, _), runner("--frame-timeout", "2") as (a1, p1):
    r = run_python(code, {"T_DEV": "REMOTE", "T_MODE": "tp", "METAL_RUNNER": f"{a0},{a1}", "T_PID": str(p1.pid)}, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.splitlines()[-1])
  assert out["err"] is not None and out["alive"] and out["seconds"] < 20, out
  # the step's first link entry on runner 0 sends: it finds the receiving runner's close before it writes (a send into the closed
  # connection would succeed, and only the receive after it would fail); the client may name the runner in front of the link's text
  assert "EPEER" in out["err"] and re.search(rf"link \d+ \(sends to {re.escape(a1)}\): the receiving runner closed the link", out["err"]), out

@pytest.mark.cpu_only
@pytest.mark.parametrize("split", [False, True])
def test_the_shard_llm_example_decodes_the_cpu_devices_tokens(daemon_bin, split):
  """examples/shard_llm.py over two runners given with --runner, tensor parallel or split by layers (--split): --check decodes on
  tinygrad's CPU device too and exits 1 if a token differs."""
  with runner() as (a0, _), runner() as (a1, _):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "shard_llm.py"), "--runner", f"{a0},{a1}", "--check", "--tokens", "12",
                        "--blocks", "2", "--dim", "128", "--ffn", "256", "--heads", "4", "--vocab", "256", *(["--split"] if split else [])],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert r.returncode == 0, r.stdout + r.stderr[-3000:]
  lines = r.stdout.splitlines()
  assert lines[0].startswith(f"{'split' if split else 'tp'} over REMOTE:0, REMOTE:1: ") and len(lines[0].split(": ")[1].split()) == 12, lines
  assert "tokens/s" in lines[1] and lines[-1] == "the same tokens as tinygrad's CPU device", lines
  # the baseline: the same model on the first runner alone, the same tokens, and the ratio of the speeds
  assert re.fullmatch(rf"one runner \(REMOTE:0\) alone: [\d.]+ tokens/s; {'split' if split else 'tp'} over 2: [\d.]+x that", lines[2]), lines
  assert len(set(lines[0].split(": ")[1].split())) > 2, lines   # tokens that vary: the check compares something
