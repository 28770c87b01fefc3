"""How long loading a model's weights takes with and without the runner's content cache: python3 bench/cache_load.py [--mib 256]
[--rate-mbit 1000] [--repeat 3]

A fresh Python process (a fresh tinygrad) puts N MiB of float32 weights (16 tensors, fixed seed) on device REMOTE and waits for
them (Device.synchronize): wall time from the first Tensor to the end of the sync, and the bytes the client sent (Runner.stats()).
Three cases, each against its own CPU runner on loopback:
  no cache   a runner without --cache-dir
  cold       a runner with an empty --cache-dir: the first client (it hashes and sends everything; the runner stores it)
  warm       the same runner, the next client: the weights go by hash
With --rate-mbit the client reaches the runner through a relay in this script that passes at most that many megabits per second
each way (an EMULATED link, a test harness: Python threads and sleeps, no latency added, so figures through it are not a real
network's). Every figure is the median of --repeat runs, min..max beside it. Nothing here fails on a number.
"""
from __future__ import annotations
import argparse, json, os, pathlib, shutil, socket, statistics, subprocess, sys, tempfile, threading, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from runner_proc import RunnerProc   # noqa: E402

WORKER = """
import json, sys, time, numpy as np
import client.remote_metal
from tinygrad import Tensor, Device
mib = int(sys.argv[1])
rng = np.random.default_rng(1234)
ws = [rng.standard_normal(mib * 2**20 // 16 // 4, dtype=np.float32) for _ in range(16)]
Device["REMOTE"]   # connect before timing
t = time.perf_counter()
ts = [Tensor(w, device="REMOTE").realize() for w in ws]
Device["REMOTE"].synchronize()
dt = time.perf_counter() - t
assert float(ts[3][5].item()) == float(ws[3][5])
print(json.dumps({"s": dt, **Device["REMOTE"].runner.stats()}))
"""

class Relay:
  """127.0.0.1:port -> target, at most rate bytes/s each way (an emulated link; a test harness)."""
  def __init__(self, target:str, rate:float):
    self.target, self.rate = target, rate
    self.ls = socket.socket()
    self.ls.bind(("127.0.0.1", 0))
    self.ls.listen()
    self.addr = f"127.0.0.1:{self.ls.getsockname()[1]}"
    threading.Thread(target=self.accept, daemon=True).start()
  def accept(self):
    while True:
      a, _ = self.ls.accept()
      h, p = self.target.rsplit(":", 1)
      b = socket.create_connection((h, int(p)))
      for s in (a, b): s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      threading.Thread(target=self.pump, args=(a, b), daemon=True).start()
      threading.Thread(target=self.pump, args=(b, a), daemon=True).start()
  def pump(self, src, dst):
    t0, sent = time.perf_counter(), 0
    try:
      while (d := src.recv(1 << 16)):
        sent += len(d)
        if (wait := t0 + sent / self.rate - time.perf_counter()) > 0: time.sleep(wait)
        dst.sendall(d)
    except OSError: pass
    finally:
      for s in (src, dst):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass

def load(addr:str, mib:int) -> dict:
  env = {**os.environ, "METAL_RUNNER": addr, "PYTHONPATH": str(ROOT)}
  p = subprocess.run([sys.executable, "-c", WORKER, str(mib)], env=env, capture_output=True, text=True, timeout=900)
  if p.returncode != 0: raise RuntimeError(p.stderr[-2000:])
  return json.loads(p.stdout.strip().splitlines()[-1])

def main():
  os.environ["METAL_RUNNER_TOKEN_FILE"] = ""   # the runners measured here have no token: a client holding one (~/.metal_runner_token too) refuses
  ap = argparse.ArgumentParser()
  ap.add_argument("--mib", type=int, default=256)
  ap.add_argument("--rate-mbit", type=float, default=0)
  ap.add_argument("--repeat", type=int, default=3)
  a = ap.parse_args()
  rows = {"no cache": [], "cold": [], "warm": []}
  tmp = tempfile.mkdtemp(prefix="cache_load")
  try:
    plain = RunnerProc()
    for _ in range(a.repeat):
      d = pathlib.Path(tmp) / f"c{len(rows['cold'])}"
      cached = RunnerProc("--cache-dir", str(d))
      relays = {n: Relay(r.addr, a.rate_mbit * 1e6 / 8) if a.rate_mbit else None for n, r in (("plain", plain), ("cached", cached))}
      addr = {n: (relays[n].addr if relays[n] else r.addr) for n, r in (("plain", plain), ("cached", cached))}
      rows["no cache"].append(load(addr["plain"], a.mib))
      rows["cold"].append(load(addr["cached"], a.mib))
      time.sleep(0.5)   # the runner stores after the write; let it finish before the next client
      rows["warm"].append(load(addr["cached"], a.mib))
      cached.stop()
    plain.stop()
  finally: shutil.rmtree(tmp, ignore_errors=True)
  link = f"an EMULATED {a.rate_mbit:g} Mbit/s link (Python relay, a test harness)" if a.rate_mbit else "loopback"
  print(f"loading {a.mib} MiB of weights (16 float32 tensors) onto a CPU runner over {link}; median of {a.repeat} (min..max)")
  print(f"{'case':10} {'seconds':>22} {'MiB/s':>8} {'bytes sent':>14} {'round trips':>12}")
  for n, rs in rows.items():
    s = [r["s"] for r in rs]
    print(f"{n:10} {statistics.median(s):8.3f} ({min(s):.3f}..{max(s):.3f}) {a.mib / statistics.median(s):8.0f} "
          f"{int(statistics.median(r['bytes_sent'] for r in rs)):14d} {int(statistics.median(r['round_trips'] for r in rs)):12d}")

if __name__ == "__main__": main()
