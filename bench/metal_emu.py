"""Protocol-level figures of the Metal runner ON THE METAL EMULATOR: python3 bench/metal_emu.py [--runner HOST:PORT] [--repeat N]

EMULATOR FIGURES. daemon/metal_runner_emu is daemon/runner.m, unchanged, on tests/metal_emulator, a TEST HARNESS that runs kernels on the
CPU behind Apple's declared Metal API. What it measures is the runner's own path (frames, encoding, commits, completion handling) and when
GPU work starts relative to the requests that carry it, with the emulator's CPU kernels in place of a GPU: the figures say nothing about an
Apple GPU's speed, and a command buffer's cost here is not a Mac's. bench/run.py measures CPU runners; this is its Metal counterpart, in the
style of bench/proto.py's "launches", with a raw socket (tests/wire.py's framing) so that the bytes reach the runner when the figure says.

Without --runner it starts daemon/metal_runner_emu (make -C daemon emu) on a free loopback port and stops it by pid. Each figure is the median
of --repeat runs (default 5), with min and max:

  pipelined    1,000 launches of an empty kernel without FWAIT, sent as one burst, then Tsync: launches per second (bench/proto.py's
               "launches")
  waited       200 launches of the empty kernel, each with FWAIT: µs per round trip
  trickle      64 launches of a kernel of about 1 ms (on the emulator's CPU), sent 4 at a time every 2 ms (a burst crossing a slow link, as
               a client's queued launches do when they pass its send buffer), then Tsync: ms from the first send to the Rsync, and
               of that the time after the last send (the GPU work left when the burst has fully arrived)
  first        one launch of the 1 ms kernel, then nothing for 300 ms, then Tsync: ms from the Tsync to its Rsync (near 0 when the launch
               ran during the pause; about the kernel's time when it waited for the Tsync)
"""
from __future__ import annotations
import argparse, json, os, pathlib, re, select, signal, socket, struct, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from client import protocol as P  # noqa: E402

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
EMPTY = HEAD + "kernel void empty(device int* out, uint3 gid [[threadgroup_position_in_grid]]) { }\n"
WORK = HEAD + ("kernel void work(device int* out, constant int& n, uint3 gid [[threadgroup_position_in_grid]]) {\n"
               "  uint acc = 1; for (int i = 0; i < n; i++) acc = acc * 1664525u + 1013904223u;\n  out[0] = (int)acc;\n}\n")

class Conn:
  def __init__(self, addr:str):
    host, port = addr.rsplit(":", 1)
    self.s = socket.create_connection((host, int(port)))
    self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    self.tag = 0
    self.send(self.frame(P.THELLO, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG))
    t, f, _ = self.recv()
    assert t == P.RHELLO, t
    self.info = f

  def frame(self, type:int, payload:bytes=b"", flags:int=0, **fields) -> bytes:
    self.tag += 1
    return P.pack(type, self.tag, flags, payload_len=len(payload), **fields) + payload

  def send(self, b:bytes): self.s.sendall(b)

  def recv_exact(self, n:int) -> bytes:
    b = bytearray()
    while len(b) < n:
      c = self.s.recv(n - len(b))
      if not c: raise EOFError("the runner closed the connection")
      b += c
    return bytes(b)

  def recv(self):
    h = self.recv_exact(P.HDR_SIZE)
    b = h + self.recv_exact(struct.unpack_from("<I", h)[0] - P.HDR_SIZE)
    t, f = P.unpack(b)
    if t == P.RERROR: raise RuntimeError(b[P.MSGS[t].size:].decode(errors="replace"))
    return t, f, b[P.MSGS[t].size:]

  def load(self, prog:int, src:str, nbufs:int, nvals:int):
    import zlib
    name, data = src.split("kernel void ", 1)[1].split("(", 1)[0].encode(), src.encode()
    self.send(self.frame(P.TLOAD, name + data, prog=prog, kind=P.PROG_METAL_SOURCE, arch=0, nbufs=nbufs, nvals=nvals,
                         corearg=P.NO_CORE, entry=0, crc=zlib.crc32(data), namelen=len(name), datalen=len(data)))

  def launch(self, prog:int, bufs, vals=(), wait:bool=False) -> bytes:
    return self.frame(P.TLAUNCH, P.launch_args(bufs, vals), P.FWAIT if wait else 0, **P.launch_fields(prog, bufs, vals))

  def sync(self):
    self.send(self.frame(P.TSYNC))
    assert self.recv()[0] == P.RSYNC

  def waited(self, prog:int, bufs, vals=()) -> int:
    self.send(self.launch(prog, bufs, vals, wait=True))
    t, f, _ = self.recv()
    assert t == P.RLAUNCH, t
    return f["ns"]

def start_runner() -> tuple[str, subprocess.Popen]:
  subprocess.run(["make", "-s", "-C", str(ROOT / "daemon"), "emu"], check=True)
  proc = subprocess.Popen([str(ROOT / "daemon" / "metal_runner_emu"), "--host", "127.0.0.1", "--port", "0", "--backend", "metal"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  line = proc.stdout.readline().decode() if select.select([proc.stdout], [], [], 30)[0] else ""
  if (m := re.match(r"listening on (\S+)", line)) is None: raise RuntimeError(f"metal_runner_emu did not start: {line!r}")
  return m.group(1), proc

def setup(addr:str) -> tuple[Conn, int]:
  """A connection with the empty kernel (1), the ~1 ms kernel (2) and buffer 1; returns it and the work kernel's n."""
  c = Conn(addr)
  c.send(c.frame(P.TALLOC, handle=1, bufsize=64))
  c.load(1, EMPTY, 1, 0)
  c.load(2, WORK, 1, 1)
  c.sync()
  n = 100_000
  for _ in range(8):   # calibrate: n for about 1 ms of the emulator's CPU
    ns = min(c.waited(2, [(1, 0)], [n]) for _ in range(3))
    n = max(1000, int(n * 1e6 / max(ns, 1)))
  return c, n

def pipelined(c:Conn, n:int=1000) -> float:
  burst = b"".join(c.launch(1, [(1, 0)]) for _ in range(n))
  t = time.perf_counter()
  c.send(burst)
  c.sync()
  return n / (time.perf_counter() - t)

def waited(c:Conn, n:int=200) -> float:
  frames = [c.launch(1, [(1, 0)], wait=True) for _ in range(n)]
  ts = []
  for f in frames:
    t = time.perf_counter()
    c.send(f)
    assert c.recv()[0] == P.RLAUNCH
    ts.append(time.perf_counter() - t)
  return sorted(ts)[n // 2] * 1e6

def trickle(c:Conn, work:int, n:int=64, per:int=4, gap:float=0.002) -> tuple[float, float]:
  chunks = [b"".join(c.launch(2, [(1, 0)], [work]) for _ in range(per)) for _ in range(n // per)]
  t0 = time.perf_counter()
  for i, ch in enumerate(chunks):
    if i: time.sleep(gap)
    c.send(ch)
  t1 = time.perf_counter()
  c.sync()
  t2 = time.perf_counter()
  return (t2 - t0) * 1e3, (t2 - t1) * 1e3

def first(c:Conn, work:int, pause:float=0.3) -> float:
  c.send(c.launch(2, [(1, 0)], [work]))
  time.sleep(pause)
  t = time.perf_counter()
  c.sync()
  return (time.perf_counter() - t) * 1e3

def stats(xs:list[float]) -> dict:
  xs = sorted(xs)
  return {"median": xs[len(xs) // 2], "min": xs[0], "max": xs[-1]}

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  ap.add_argument("--runner", help="HOST:PORT of a running Metal runner (default: start daemon/metal_runner_emu)")
  ap.add_argument("--repeat", type=int, default=5)
  ap.add_argument("--json", help="also write the figures here")
  a = ap.parse_args()
  proc = None
  addr = a.runner
  if addr is None:
    os.environ["METAL_RUNNER_TOKEN_FILE"] = ""   # the runner started here has no token: a client holding one (~/.metal_runner_token too) refuses it
    addr, proc = start_runner()
  try:
    c, work = setup(addr)
    name = P.cstr(c.info["name"])
    if "emulator" not in name: print(f"WARNING: {addr} is not the Metal emulator ({name}): these are not emulator figures")
    res = {"pipelined_launches_per_s": [], "waited_us": [], "trickle_total_ms": [], "trickle_after_last_send_ms": [],
           "first_sync_ms": []}
    for _ in range(a.repeat):
      res["pipelined_launches_per_s"].append(pipelined(c))
      res["waited_us"].append(waited(c))
      tot, after = trickle(c, work)
      res["trickle_total_ms"].append(tot)
      res["trickle_after_last_send_ms"].append(after)
      res["first_sync_ms"].append(first(c, work))
    out = {"label": "EMULATOR FIGURES (tests/metal_emulator, a CPU test harness; not an Apple GPU)", "device": name,
           "work_kernel_n": work, **{k: stats(v) for k, v in res.items()}}
  finally:
    if proc is not None:
      os.kill(proc.pid, signal.SIGTERM)
      proc.wait(10)
  print(out["label"])
  print(f"device: {out['device']}")
  for k, v in out.items():
    if isinstance(v, dict): print(f"  {k:28s} {v['median']:10.2f}   (min {v['min']:.2f}, max {v['max']:.2f})")
  if a.json: pathlib.Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

if __name__ == "__main__":
  main()
