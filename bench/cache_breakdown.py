"""Where a cached write's time goes (docs/cache.md): python3 bench/cache_breakdown.py [REPS]

Prints, on this machine: hashlib's SHA-256 in CPU time over memory the CPU's caches do not hold (64 MiB in 1 MiB chunks), over one
MiB they hold, and over each chunk copied first into a buffer they hold (what client/connection.py does); then CPU seconds per GB of
each process while the client writes 64 MiB (REPS times, default 8) to a runner with a cache, of content it has not seen and the
same again, and to a runner without one: the client (all its threads), the runner's session and its cache helper (daemon/cachelink.c),
from /proc. CPU time is what a busy shared machine changes least; GB/s, the same run's medians, are shown too. Linux only."""
import hashlib, os, pathlib, shutil, statistics, sys, tempfile, time
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]
from proto import Session, MIB  # noqa: E402
from runner_proc import RunnerProc  # noqa: E402

def hash_rates() -> dict:
  big, tmp = memoryview(bytearray(os.urandom(4096) * (64 * 256))), bytearray(MIB)
  def copied(c):
    tmp[:] = c
    return hashlib.sha256(tmp).digest()
  runs = {"cold": lambda: [hashlib.sha256(big[i:i + MIB]).digest() for i in range(0, 64 * MIB, MIB)],
          "hot": lambda: [hashlib.sha256(big[:MIB]).digest() for _ in range(64)],
          "copied": lambda: [copied(big[i:i + MIB]) for i in range(0, 64 * MIB, MIB)]}
  out = {}
  for k, f in runs.items():
    best = []
    for _ in range(5):
      t = time.process_time()
      f()
      best.append(time.process_time() - t)
    out[k] = 64 * MIB / min(best) / 1e9
  return out

def kids(pid:int) -> list[int]: return [int(p) for t in pathlib.Path(f"/proc/{pid}/task").iterdir() for p in (t / "children").read_text().split()]
def comm(pid:int) -> str: return pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
def cpu(pid:int) -> float:
  f = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
  return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def per_gb(cache:bool, reps:int) -> list[tuple]:
  d = tempfile.mkdtemp(prefix="cache-breakdown-")
  r = RunnerProc("--backend", "cpu", *(["--cache-dir", d] if cache else []))
  try:
    s = Session(r.addr, sizes=(64 * MIB,))
    top = [k for k in kids(r.proc.pid) if comm(k) != "mr_peer_broker"][0]   # with a cache: the helper, the session its child
    procs = {"helper": top, "session": kids(top)[0]} if cache else {"session": top}
    s.write(64 * MIB, 4)   # untimed, as bench/run.py does
    rows = []
    for mode in ("new content", "the same again") if cache else ("plain",):
      c0, t0 = sum(os.times()[:2]), {k: cpu(v) for k, v in procs.items()}
      g = [s.write(64 * MIB, 1, fresh=mode == "new content")["gbps"] for _ in range(reps)]
      time.sleep(0.3)   # the helper's last store
      gb = reps * 64 * MIB / 1e9
      rows.append((mode, statistics.median(g), (sum(os.times()[:2]) - c0) / gb, *((cpu(v) - t0[k]) / gb for k, v in procs.items())))
    return rows
  finally:
    r.stop()
    shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
  reps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
  h = hash_rates()
  print(f"hashlib SHA-256, CPU time: {h['cold']:.2f} GB/s over memory out of the caches, {h['hot']:.2f} over cached memory, "
        f"{h['copied']:.2f} copying each MiB into a cached buffer first")
  print(f"{'64 MiB writes':<26} {'GB/s':>6} {'client':>8} {'session':>8} {'helper':>8}   (CPU seconds per GB)")
  for cache in (True, False):
    for mode, g, c, *r in per_gb(cache, reps):
      sess, helper = (r[1], r[0]) if cache else (r[0], None)
      print(f"{('cache, ' if cache else 'no cache, ') + mode:<26} {g:6.2f} {c:8.2f} {sess:8.2f} {'-' if helper is None else f'{helper:.2f}':>8}")
