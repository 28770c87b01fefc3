"""Protocol-level measurements with the Python client (client/connection.py), for bench/run.py.

Imported, it gives one repetition of each figure on an open Runner. Run as a script it is one client of the concurrency test:
  python3 bench/proto.py conc HOST:PORT SECONDS
connects, allocates 64 MiB, prints {"ready": ...}, then for each line "ping" or "bulk" on stdin runs that load for SECONDS and prints
one JSON line: ping = round trips one after another; bulk = 64 MiB writes (each followed by a sync) alternating with 64 MiB reads.
"""
from __future__ import annotations
import json, os, pathlib, subprocess, sys, time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from client import protocol as P  # noqa: E402
from client.connection import Runner  # noqa: E402
from client.cpu_image import cpu_image  # noqa: E402

MIB = 1 << 20
EMPTY = "void empty(float* restrict out) { }"

def compile_empty() -> tuple[int, bytes, int]:
  """The empty kernel as a runner CPU image, compiled the way tinygrad's ClangCompiler compiles kernels."""
  obj = subprocess.check_output(["clang", "-c", "-x", "c", "-O2", "-fPIC", "-ffreestanding", "-fno-math-errno", "-nostdlib", "-fno-ident",
                                 "--target=x86_64-none-unknown-elf", "-march=x86-64", "-", "-o", "-"], input=EMPTY.encode())
  return cpu_image(obj, "empty")

class Session:
  """One connection with the buffers and the empty kernel every measurement uses."""
  def __init__(self, addr:str, sizes=(4096, MIB, 64 * MIB, 256 * MIB)):
    self.r = Runner(addr)
    arch, image, entry = compile_empty()
    self.r.load(prog := self.r.new_handle(), P.PROG_CPU_IMAGE, "empty", image, nbufs=1, nvals=0, entry=entry, arch=arch)
    self.prog, self.bufs, self.host = prog, {}, {}
    for size in sizes: self.buffer(size)
    self.r.sync()

  def buffer(self, size:int) -> tuple[int, memoryview]:
    if size not in self.bufs:
      self.r.alloc(h := self.r.new_handle(), size)
      self.host[size] = mv = memoryview(bytearray(os.urandom(4096) * (size // 4096)))
      self.r.write(h, 0, mv)   # touch the runner's pages; the client's are touched by os.urandom's copy
      self.r.read(h, 0, mv)
      self.bufs[size] = h
    return self.bufs[size], self.host[size]

  def ping(self, n:int) -> dict:
    ts, r = [], self.r
    t0 = time.perf_counter()
    for _ in range(n):
      t = time.perf_counter()
      r.ping()
      ts.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    ts.sort()
    return {"mean_us": total / n * 1e6, "median_us": ts[n // 2] * 1e6, "p90_us": ts[n * 9 // 10] * 1e6}

  def launches(self, n:int) -> dict:
    """n pipelined launches of the empty kernel, then one sync."""
    r, prog, arg = self.r, self.prog, [(self.bufs[4096], 0)]
    t = time.perf_counter()
    for _ in range(n): r.launch(prog, arg, [])
    r.sync()
    return {"per_s": n / (time.perf_counter() - t)}

  def write(self, size:int, count:int) -> dict:
    """count writes of size bytes, pipelined, then one sync."""
    h, mv = self.buffer(size)
    t = time.perf_counter()
    for _ in range(count): self.r.write(h, 0, mv)
    self.r.sync()
    s = time.perf_counter() - t
    return {"gbps": size * count / s / 1e9, "us_per_op": s / count * 1e6}

  def read(self, size:int, count:int) -> dict:
    """count reads of size bytes, each waited for."""
    h, mv = self.buffer(size)
    t = time.perf_counter()
    for _ in range(count): self.r.read(h, 0, mv)
    s = time.perf_counter() - t
    return {"gbps": size * count / s / 1e9, "us_per_op": s / count * 1e6}

class RawPing:
  """The floor for a Python client: Tping on a plain blocking socket, one send and one recv per round trip, no parsing beyond a length
  check. Not a client anyone should use; it shows how much of the client's round trip is Python itself."""
  def __init__(self, addr:str):
    import socket
    host, port = addr.rsplit(":", 1)
    self.s = socket.create_connection((host, int(port)))
    self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    self.buf = memoryview(bytearray(65536))
    self.s.sendall(P.pack(P.THELLO, 1, magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG))
    self._recv(P.MSGS[P.RHELLO].size)
    self.ping1()  # the runner has a session for this connection once its first reply arrives

  def _recv(self, want:int):
    got = 0
    while got < want: got += self.s.recv_into(self.buf[got:want])

  def ping1(self):
    self.s.sendall(P.pack(P.TPING, 2, count=0))
    self._recv(P.MSGS[P.RPING].size)

  def ping(self, n:int) -> dict:
    msg, want, ts, s = P.pack(P.TPING, 2, count=0), P.MSGS[P.RPING].size, [], self.s
    for _ in range(n):
      t = time.perf_counter()
      s.sendall(msg)
      self._recv(want)
      ts.append(time.perf_counter() - t)
    ts.sort()
    return {"median_us": ts[n // 2] * 1e6}

  def close(self): self.s.close()

def conc_client(addr:str, seconds:float):
  out = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  s = Session(addr, sizes=(64 * MIB,))
  h, mv = s.buffer(64 * MIB)
  out.write(json.dumps({"ready": True}) + "\n")
  for line in sys.stdin:
    cmd, n, nbytes = line.strip(), 0, 0
    if cmd == "quit": break
    t0 = time.perf_counter()
    if cmd == "ping":
      while (t := time.perf_counter() - t0) < seconds:
        for _ in range(100): s.r.ping()
        n += 100
      out.write(json.dumps({"pings": n, "seconds": t, "mean_us": t / n * 1e6}) + "\n")
    elif cmd == "bulk":
      while (t := time.perf_counter() - t0) < seconds:
        s.r.write(h, 0, mv)
        s.r.sync()
        s.r.read(h, 0, mv)
        nbytes += 2 * mv.nbytes
      out.write(json.dumps({"bytes": nbytes, "seconds": t, "gbps": nbytes / t / 1e9}) + "\n")
  s.r.close()

if __name__ == "__main__":
  if len(sys.argv) == 4 and sys.argv[1] == "conc": conc_client(sys.argv[2], float(sys.argv[3]))
  else: sys.exit(__doc__)
