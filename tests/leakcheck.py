#!/usr/bin/env python3
"""Leak check: the daemon under valgrind, 1,000 client sessions through it, then SIGTERM; zero leaks and errors allowed.

  python3 tests/leakcheck.py                       both isolation modes, 1000 sessions each
  python3 tests/leakcheck.py --isolation thread --cycles 200

Each session connects, allocates, writes, loads a kernel, launches it, reads the result back and checks it, then
disconnects without freeing anything. Every few sessions also take other paths: an error queued ahead of a reply,
a graph, explicit frees and unloads, a core_id kernel (which starts the session's thread pool), a copy to another
session over a peer connection, a disconnect in the middle of a frame, a session resumed on a new connection after its
link dropped, or one whose client never comes back (the daemon runs with --resume-grace 2: it ends when that passes).
Several clients run at once.

valgrind runs with --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=9 --trace-children=yes
and writes one log per process (--log-file=DIR/vg.%p). In process isolation every session is a forked process that
valgrind follows and leak-checks when it exits, so the result counts one log per session plus the daemon's own;
the daemon is stopped only after every session's log is complete. "Still reachable" and "possibly lost" blocks are
not errors. The binary is the normal build (make -C daemon), never METAL_RUNNER_BIN: a sanitizer build cannot run under
valgrind. The daemon runs with --no-confine: valgrind makes system calls of its own inside a session process (as it
exits, and as a thread starts), which the seccomp filter (daemon/confine.c) traps, and valgrind aborts on the SIGSYS;
tests/test_confine.py checks the confined sessions instead.
"""
from __future__ import annotations
import argparse, dataclasses, hashlib, hmac, os, pathlib, re, shutil, signal, socket, struct, subprocess, sys, tempfile, threading, time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
  if p not in sys.path: sys.path.insert(0, p)
from client import protocol as P  # noqa: E402
from wire import Raw, compile_kernel, ADD1, CORES  # noqa: E402

VALGRIND = ["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=9",
            "--trace-children=yes", "--child-silent-after-fork=no"]

@dataclasses.dataclass
class Result:
  isolation: str
  cycles: int
  seconds: float
  processes: int = 0          # valgrind logs, one per process
  resumed: int = 0            # sessions resumed on a new connection (in process isolation each new connection is a process too)
  peers: int = 0              # copies over a peer connection (each: the destination session and the peer connection's process)
  errors: int = 0             # sum of ERROR SUMMARY counts (leaks of the kinds above included)
  definite: int = 0           # bytes definitely lost
  indirect: int = 0           # bytes indirectly lost
  exit_code: int|None = None  # the daemon's (9: valgrind found errors in it)
  problems: list[str] = dataclasses.field(default_factory=list)
  @property
  def ok(self) -> bool: return not self.problems
  def __str__(self):
    return (f"leakcheck {self.isolation}: {self.cycles} sessions in {self.seconds:.1f} s, {self.processes} processes checked, "
            f"{self.errors} errors, {self.definite} bytes definitely and {self.indirect} indirectly lost, daemon exit {self.exit_code}"
            + ("" if self.ok else "\n  " + "\n  ".join(self.problems)))

PEER_EVERY, PEER_AT = 13, 9   # which sessions also copy to another session: each adds two processes (that session, the peer connection)

def f32(*v) -> bytes: return struct.pack(f"<{len(v)}f", *v)

class Kernels:
  def __init__(self):
    self.add1 = compile_kernel(ADD1, "add1")
    self.cores = compile_kernel(CORES, "cores")

def resumes(i:int) -> bool: return i % 13 == 6

def resume_cycle(addr:str, k:Kernels, i:int):
  """A resumable session: its link drops after a launch, a new connection resumes it, reads and withdraws the key."""
  c = Raw(addr)
  tag = c.req(P.TRESUMEKEY, mode=P.RESUME_ON)
  t, key, _ = c.frame()
  assert (t, key["tag"]) == (P.RRESUMEKEY, tag), (t, key)
  _, img, entry = k.add1
  c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, f32(1, 2, 3, 4))
  c.load(1, img, "add1", nbufs=2, nvals=1, entry=entry)
  tag = c.launch(1, [(1, 0), (2, 0)], [4], wait=True)
  assert c.frame()[0] == P.RLAUNCH
  c.close()
  n = Raw(addr)
  try:
    cn = os.urandom(32)
    mac = hmac.new(key["secret"], b"metal_runner-resume-v1 client" + n.info["nonce"] + cn + struct.pack("<IQQ", c.info["session"], 6, 56 + 24),
                   hashlib.sha256).digest()
    n.req(P.TRESUME, session=c.info["session"], sent=6, received=56 + 24, cnonce=cn, mac=mac)
    t, f, _ = n.frame()
    assert (t, f["processed"]) == (P.RRESUME, 6), (t, f)
    assert n.read(1, 0, 16) == f32(2, 3, 4, 5)
    n.req(P.TRESUMEKEY, mode=P.RESUME_OFF)
    assert n.frame()[0] == P.RRESUMEKEY
  finally: n.close()

def abandoned_cycle(addr:str):
  """A resumable session whose client never comes back: it ends when the grace period passes."""
  c = Raw(addr)
  c.req(P.TRESUMEKEY, mode=P.RESUME_ON)
  assert c.frame()[0] == P.RRESUMEKEY
  c.alloc(1, 4096)
  c.write(1, 0, bytes(4096))
  c.close()

def cycle(addr:str, k:Kernels, i:int):
  """One session; raises if any reply is wrong."""
  if resumes(i): return resume_cycle(addr, k, i)
  if i % 13 == 12: return abandoned_cycle(addr)
  c = Raw(addr)
  try:
    _, img, entry = k.add1
    c.alloc(1, 16); c.alloc(2, 16); c.write(2, 0, f32(1, 2, 3, 4))
    c.load(1, img, "add1", nbufs=2, nvals=1, entry=entry)
    if i % 3 == 1:  # an error queued ahead of the launch's reply
      bad = c.req(P.TFREE, handle=999)
      tag = c.launch(1, [(1, 0), (2, 0)], [4], wait=True)
      code, etag, _ = c.error()
      assert (code, etag) == (P.EHANDLE, bad), (code, etag)
    else:
      tag = c.launch(1, [(1, 0), (2, 0)], [4], wait=True)
    t, f, _ = c.frame()
    assert (t, f["tag"]) == (P.RLAUNCH, tag), (t, f)
    if i % 4 == 2:  # a graph, left for the session's cleanup
      rec = P.launch_record(1, [(1, 0), (1, 0)], [4])
      c.req(P.TGRAPH, rec, graph=7, count=1)
      tag = c.req(P.TGRAPHRUN, flags=P.FWAIT, graph=7, count=0)
      t, f, _ = c.frame()
      assert (t, f["tag"]) == (P.RGRAPHRUN, tag), (t, f)
      assert c.read(1, 0, 16) == f32(3, 4, 5, 6)  # add1 in place: buffer 1 held 2..5
    else:
      assert c.read(1, 0, 16) == f32(2, 3, 4, 5)
    if i % PEER_EVERY == PEER_AT:  # a copy to another session of the same runner (protocol.md, Copies between runners)
      d = Raw(addr)
      try:
        d.alloc(5, 16)
        tag = d.req(P.TGRANT, handle=5, offset=0, count=16, ttl=60)
        t, f, _ = d.frame()
        assert (t, f["tag"]) == (P.RGRANT, tag), (t, f)
        host, port = addr.rsplit(":", 1)
        tag = c.req(P.TPEERSEND, host.encode(), handle=2, count=16, grant=f["grant"], secret=f["secret"], port=int(port),
                    hostlen=len(host))
        t, f2, _ = c.frame()
        assert (t, f2["tag"]) == (P.RPEERSEND, tag), (t, f2)
        assert d.read(5, 0, 16) == c.read(2, 0, 16)
      finally: d.close()
    if i % 5 == 3:  # everything freed by the client
      c.req(P.TUNLOAD, prog=1); c.req(P.TFREE, handle=1); c.req(P.TFREE, handle=2)
      assert c.until_pong() == []
    if i % 11 == 5:  # a core_id kernel starts the session's worker threads
      _, img, entry = k.cores
      c.alloc(3, 4 * 8)
      c.load(2, img, "cores", nbufs=1, nvals=1, entry=entry, corearg=1)
      tag = c.launch(2, [(3, 0)], [0], global_size=(8, 1, 1), wait=True)
      assert c.frame()[0] == P.RLAUNCH
      assert c.read(3, 0, 32) == struct.pack("<8i", *range(0, 80, 10))
    if i % 7 == 4:  # gone in the middle of a frame
      c.send(P.pack(P.TWRITE, 1, payload_len=4096, handle=2, offset=0, count=4096) + bytes(100))
  finally:
    c.close()

def parse_log(text:str) -> tuple[int|None, int, int]:
  """(errors or None if the process did not finish, definitely lost bytes, indirectly lost bytes) of one valgrind log."""
  num = lambda pat: int(m.group(1).replace(",", "")) if (m := re.search(pat, text)) else 0
  errs = re.search(r"ERROR SUMMARY: ([\d,]+) errors", text)
  return (int(errs.group(1).replace(",", "")) if errs else None, num(r"definitely lost: ([\d,]+) bytes"),
          num(r"indirectly lost: ([\d,]+) bytes"))

def run(isolation:str, cycles:int=1000, clients:int=4, binary:pathlib.Path|None=None) -> Result:
  """Run the check once; the valgrind logs are deleted when it passes and kept (path in .problems) when it fails."""
  if shutil.which("valgrind") is None: raise FileNotFoundError("valgrind is not installed")
  if binary is None:
    subprocess.run(["make", "-s", "-C", str(ROOT / "daemon")], check=True, stdout=subprocess.DEVNULL)
    binary = ROOT / "daemon" / "metal_runner"
  logdir = pathlib.Path(tempfile.mkdtemp(prefix=f"leakcheck-{isolation}-"))
  k = Kernels()
  t0 = time.monotonic()
  res = Result(isolation, cycles, 0.0)
  with open(logdir / "daemon.log", "w") as err:
    proc = subprocess.Popen(VALGRIND + [f"--log-file={logdir}/vg.%p", str(binary), "--host", "127.0.0.1", "--port", "0",
                                        "--isolation", isolation, "--no-confine", "--resume-grace", "2"],
                            stdout=subprocess.PIPE, stderr=err, text=True)
  try:
    line = proc.stdout.readline()
    if not line.startswith("listening on "): raise RuntimeError(f"daemon did not start under valgrind: {line!r}")
    addr = f"127.0.0.1:{int(line.rsplit(':', 1)[1])}"
    failures: list[str] = []
    def client(first:int):
      for i in range(first, cycles, clients):
        try: cycle(addr, k, i)
        except Exception as e:  # noqa: BLE001 - reported below
          failures.append(f"session {i}: {type(e).__name__}: {e}")
    ts = [threading.Thread(target=client, args=(j,)) for j in range(clients)]
    for t in ts: t.start()
    for t in ts: t.join()
    res.problems += failures[:5]
    # Session processes leak-check themselves as they exit: let them finish before the daemon is stopped.
    # In process isolation: a process per session, per resuming connection and per peer connection, and the peer broker
    # (whose log ends with the daemon).
    res.resumed = sum(map(resumes, range(cycles)))
    res.peers = peers = sum(i % PEER_EVERY == PEER_AT for i in range(cycles))
    sessions, deadline = (cycles + res.resumed + 2 * peers if isolation == "process" else 0), time.monotonic() + 60
    while sessions and time.monotonic() < deadline:
      if sum(parse_log(f.read_text())[0] is not None for f in logdir.glob("vg.*")) >= sessions: break
      time.sleep(0.2)
  finally:
    if proc.poll() is None: os.kill(proc.pid, signal.SIGTERM)
    try: res.exit_code = proc.wait(60)
    except subprocess.TimeoutExpired:
      os.kill(proc.pid, signal.SIGKILL)
      res.exit_code = proc.wait()
      res.problems.append("the daemon did not exit within 60 s of SIGTERM")
    proc.stdout.close()
  res.seconds = time.monotonic() - t0
  logs = sorted(logdir.glob("vg.*"))
  res.processes = len(logs)
  bad = []
  for f in logs:
    errs, d, i = parse_log(f.read_text())
    if errs is None: bad.append(f"{f.name}: valgrind did not finish (process killed?)")
    else: res.errors += errs
    res.definite += d
    res.indirect += i
    if errs or d or i: bad.append(f"{f.name}: {errs} errors, {d} bytes definitely and {i} indirectly lost")
  res.problems += bad[:10] + ([f"... and {len(bad) - 10} more processes"] if len(bad) > 10 else [])
  want = sessions + 1 + (isolation == "process")   # the daemon's own log, and in process isolation the peer broker's
  if res.processes != want: res.problems.append(f"{res.processes} valgrind logs, expected {want}")
  if res.exit_code != 0: res.problems.append(f"daemon exit code {res.exit_code}")
  if res.ok: shutil.rmtree(logdir)
  else: res.problems.append(f"valgrind logs and the daemon's stderr kept in {logdir}")
  return res

def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--isolation", choices=["process", "thread", "both"], default="both")
  ap.add_argument("--cycles", type=int, default=1000)
  ap.add_argument("--clients", type=int, default=4)
  ap.add_argument("--binary", type=pathlib.Path, help="daemon to check (default: build daemon/metal_runner)")
  a = ap.parse_args(argv)
  ok = True
  for iso in (["thread", "process"] if a.isolation == "both" else [a.isolation]):
    r = run(iso, a.cycles, a.clients, a.binary)
    print(r, flush=True)
    ok &= r.ok
  return 0 if ok else 1

if __name__ == "__main__": sys.exit(main())
