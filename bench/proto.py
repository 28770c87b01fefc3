"""Protocol-level measurements with the Python client (client/connection.py), for bench/run.py.

The client is the one on PYTHONPATH when that holds a client/ (bench/run.py --compare points it at another commit's tree), else
this tree's. Run as a script, it is one of bench/run.py's measuring processes:

  python3 bench/proto.py serve
    prints {"ready": ..., "client": the client's path}, then runs one command per line of stdin and answers one JSON line each
    ({"error": ...} if it failed). NAME is a connection of this process, ADDR a runner's host:port, CPU a CPU to pin this process to
    while it measures ("-": no pinning):
      session NAME ADDR [SIZE ...]   connect (Session: the empty kernel loaded, a buffer of each SIZE, filled)
      raw NAME ADDR                  connect the minimal Python ping (RawPing)
      ping NAME N [CPU]              N round trips one after another: median, p90 and mean (µs)
      launches NAME N                N pipelined launches of the empty kernel, then one sync: launches per second
      write NAME SIZE COUNT [fresh]  COUNT writes of the SIZE buffer, pipelined, then one sync: GB/s and µs per write. fresh: first
                                     make every MiB of it content no runner has seen (untimed), as a new upload to a runner cache is
      read NAME SIZE COUNT           COUNT reads of the SIZE buffer, each waited for
      profile NAME MODE              Tprofile MODE (0 off, 1 on; waits, as sync does): the records it handed out
      progress NAME MODE             upload progress on (1) as with stderr a terminal, or off (0), for this connection
      idle ADDR N / closeidle        open N idle connections (each pings once) / close them
      close NAME
  python3 bench/proto.py conc HOST:PORT SECONDS
    one client of the concurrency test: connects, allocates 64 MiB, prints {"ready": ...}, then for each line "ping" or "bulk" on
    stdin runs that load for SECONDS and prints one JSON line: ping = round trips one after another; bulk = 64 MiB writes (each
    followed by a sync) alternating with 64 MiB reads.
"""
from __future__ import annotations
import functools, json, os, pathlib, struct, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if not any(pathlib.Path(d, "client", "connection.py").is_file() for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d):
  sys.path.insert(0, str(ROOT))
import client  # noqa: E402
from client import protocol as P  # noqa: E402
from client.connection import Runner  # noqa: E402
from client.cpu_image import cpu_image  # noqa: E402

MIB = 1 << 20
EMPTY = "void empty(float* restrict out) { }"

@functools.cache
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
    self.prog, self.bufs, self.host, self.fresh = prog, {}, {}, 0
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

  def write(self, size:int, count:int, fresh:bool=False) -> dict:
    """count writes of size bytes, pipelined, then one sync; fresh: first give every MiB new content (a counter and its offset)."""
    h, mv = self.buffer(size)
    if fresh:
      self.fresh += 1
      for i in range(0, size, MIB): mv[i:i+16] = struct.pack("<QQ", self.fresh, i)
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

  def close(self): self.r.close()

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

def pinned(cpu:str|None):
  """Run the enclosed code on one CPU (None or "-": leave affinity alone)."""
  import contextlib
  @contextlib.contextmanager
  def cm():
    old = os.sched_getaffinity(0)
    if cpu not in (None, "-"): os.sched_setaffinity(0, {int(cpu)})
    try: yield
    finally: os.sched_setaffinity(0, old)
  return cm()

def serve():
  out = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)   # stdout carries only answers
  conns, idle, default_cpus = {}, [], os.sched_getaffinity(0)
  def cmd(c:str, *a:str) -> dict:
    if c == "session": conns[a[0]] = Session(a[1], sizes=tuple(int(x) for x in a[2:]))
    elif c == "raw": conns[a[0]] = RawPing(a[1])
    elif c == "ping":
      with pinned(a[2] if len(a) > 2 else None): return conns[a[0]].ping(int(a[1]))
    elif c == "launches": return conns[a[0]].launches(int(a[1]))
    elif c == "write": return conns[a[0]].write(int(a[1]), int(a[2]), fresh=a[3:] == ("fresh",))
    elif c == "read": return conns[a[0]].read(int(a[1]), int(a[2]))
    elif c == "profile":
      recs, left, lost, cap = conns[a[0]].r.profile(int(a[1]))
      return {"records": len(recs), "left": left, "lost": lost, "cap": cap}
    elif c == "progress":   # upload progress as with stderr a terminal (client/progress.py), at its default threshold; 0: off
      from client.progress import Uploads
      conns[a[0]].r.progress = Uploads(2.0) if int(a[1]) else None
      return {}
    elif c == "idle":
      idle.extend(Runner(a[0]) for _ in range(int(a[1])))
      for r in idle: r.ping()
    elif c == "closeidle":
      for r in idle: r.close()
      idle.clear()
    elif c == "pin": os.sched_setaffinity(0, default_cpus if a[0] == "-" else {int(a[0])})   # until the next pin
    elif c == "close": conns.pop(a[0]).close()
    else: raise ValueError(f"unknown command {c!r}")
    return {"ok": True}
  out.write(json.dumps({"ready": True, "client": client.__file__}) + "\n")
  for line in sys.stdin:
    if not (a := line.split()): continue
    if a[0] == "quit": break
    try: res = cmd(*a)
    except Exception as e:  # the orchestrator reports it and goes on
      import traceback
      traceback.print_exc()
      res = {"error": f"{type(e).__name__}: {e}"}
    out.write(json.dumps(res) + "\n")
  # closed, not dropped: a resumable session whose link just drops is kept by the runner for its grace period
  for c in [*conns.values(), *idle]: c.close()

def conc_client(addr:str, seconds:float):
  out = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  s = Session(addr, sizes=(64 * MIB,))
  h, mv = s.buffer(64 * MIB)
  out.write(json.dumps({"ready": True, "client": client.__file__}) + "\n")
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
  elif sys.argv[1:] == ["serve"]: serve()
  else: sys.exit(__doc__)
