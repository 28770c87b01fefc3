#!/usr/bin/env python3
"""A copy between two runners on this machine's loopback: through the client (Tread, then Twrite) against runner to runner (Tgrant, then
Tpeersend; protocol.md, Copies between runners). Prints the median time and the bytes the client's two connections carried.

  python bench/peer_copy.py [--mib 64] [--reps 5] [--isolation process|thread]

Loopback has no link limit: this measures the copies' overhead (the client's extra pass through its own memory and socket, twice), not a
network. On a real network the copy through the client crosses the client's link twice and the direct one crosses the runners' link once.
"""
import argparse, os, pathlib, statistics, sys, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from runner_proc import RunnerProc
from client.connection import Runner

def main():
  os.environ["METAL_RUNNER_TOKEN_FILE"] = ""   # the runners measured here have no token: a client holding one (~/.metal_runner_token too) refuses
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--mib", type=int, default=64)
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--isolation", default="process", choices=("process", "thread"))
  args = ap.parse_args()
  n = args.mib << 20
  ra, rb = RunnerProc("--isolation", args.isolation), RunnerProc("--isolation", args.isolation)
  try:
    with Runner(ra.addr) as a, Runner(rb.addr) as b:
      data = os.urandom(n)
      a.alloc(1, n); a.write(1, 0, data); b.alloc(2, n); a.sync(); b.sync()
      host, port = rb.addr.rsplit(":", 1)
      def via_client():
        mv = memoryview(bytearray(n))
        a.read(1, 0, mv); b.write(2, 0, mv); b.sync()
      def direct():
        a.peer_send(1, 0, n, host, int(port), *b.grant(2, 0, n))
      for name, fn in (("through the client", via_client), ("runner to runner", direct)):
        fn()   # warm: first touch of the pages
        s0, t = (a.stats(), b.stats()), []
        for _ in range(args.reps):
          t0 = time.perf_counter(); fn(); t.append(time.perf_counter() - t0)
        moved = sum(x[k] - y[k] for x, y in zip((a.stats(), b.stats()), s0) for k in ("bytes_sent", "bytes_received")) / args.reps
        med = statistics.median(t)
        print(f"{name:20s} {args.mib} MiB: median {med * 1e3:7.1f} ms ({n / med / 1e9:5.2f} GB/s) over {args.reps}, "
              f"min {min(t) * 1e3:.1f} ms; the client carried {moved:,.0f} bytes per copy")
      out = bytearray(n); b.read(2, 0, out)
      assert out == data, "the copy is wrong"
  finally:
    ra.stop(); rb.stop()

if __name__ == "__main__": main()
