"""Progress of uploads to runners on stderr, for people waiting on a model load (docs/client-run.md, Upload progress).

An upload is a run of writes (tinygrad's copyins of a model's weights, tensor after tensor, to one runner or several), not one write:
it begins with a write and ends at the next read of a value (the program goes on, and may print) or when no write has been under way
for IDLE seconds. A run shows a bar, tinygrad's own tqdm, once it
has lasted METAL_RUNNER_PROGRESS seconds (default 2) and its writes took most of that time (a training loop that uploads a batch per
step is not an upload); then it shows bytes written, rate, and time left when the total is known (a run that is one large write so
far), and ends with a last line. Nothing is shown when stderr is not a terminal, or with METAL_RUNNER_PROGRESS=0.

The cost on the write path is a check of Runner.progress (None when off) and, when on, a lock and two clock reads per write; a thread
started with a run reads the runners' byte counters four times a second and draws."""
from __future__ import annotations
import atexit, os, sys, threading, time

IDLE, TICK, BUSY = 0.5, 0.25, 0.5   # s without a write that end a run; s between redraws; share of a run spent writing to show it

class Uploads:
  """The process's uploads, to all its runners: one bar for a model sharded over two runners."""
  def __init__(self, after:float):
    self.after, self.lock, self.thread, self.bar = after, threading.Lock(), None, None
    self._reset()

  def _reset(self):
    self.start = self.last = self.busy = 0.0
    self.done = self.nwrites = self.active = 0
    self.cur: tuple|None = None   # the write under way: (runner, its byte counter at the start, bytes, start time)

  def write(self, r, n:int):
    """Around a write of n bytes to runner r: `with uploads.write(r, n): ...`."""
    return _Write(self, r, n)

  def _begin(self, r, n:int):
    with self.lock:
      now = time.monotonic()
      if not self.start: self.start = now
      self.active, self.nwrites, self.cur = self.active + 1, self.nwrites + 1, (r, r._bsent, n, now)
      if self.thread is None or not self.thread.is_alive():
        self.thread = threading.Thread(target=self._run, name="metal_runner-progress", daemon=True)
        self.thread.start()

  def _end(self, n:int):
    with self.lock:
      now = time.monotonic()
      if self.cur is not None: self.busy += now - self.cur[3]
      self.active, self.done, self.last, self.cur = self.active - 1, self.done + n, now, None

  def _written(self, now:float) -> tuple[int, int, float]:
    """Bytes written so far in this run, the run's total if known (else 0), and the time spent writing."""
    done, total, busy = self.done, 0, self.busy
    if (c := self.cur) is not None:
      r, b0, n, t0 = c
      done, busy = done + min(n, max(0, r._bsent - b0)), busy + now - t0   # wire bytes: a part the runner holds is not sent
      if self.nwrites == 1: total = n
    return done, total, busy

  def _run(self):
    try: from tinygrad.helpers import tqdm
    except ImportError: return   # the client without tinygrad: no bar
    while True:
      time.sleep(min(TICK, self.after / 2))
      with self.lock:
        now = time.monotonic()
        if not self.active and now - self.last > IDLE:   # the run is over
          self._close()
          self.thread = None
          return
        done, total, busy = self._written(now)
        if self.bar is None and now - self.start >= self.after and busy >= BUSY * (now - self.start):
          self.bar = tqdm(desc="upload to runner", unit="B", unit_scale=True, total=total, disable=True)
          self.bar.st, self.bar.disable = time.perf_counter() - (now - self.start), False   # time and rate from the run's start
        if self.bar is not None:
          self.bar.t = total
          self.bar.update(done - self.bar.n)

  def stop(self):
    """The program reads a value (Runner.read): whatever it uploaded is there, and it may print next, so end the run's bar now."""
    with self.lock:
      if not self.active: self._close()

  def _close(self):
    """The run is over (or the program is): the bar's last line, with the whole run's bytes and rate."""
    if self.bar is not None:
      self.bar.t, self.bar.st = 0, time.perf_counter() - (time.monotonic() if self.active else self.last) + self.start   # the run's rate
      self.bar.update(self.done - self.bar.n, close=True)
    self.bar = None
    self._reset()

  def _exit(self):
    if self is _uploads and self.lock.acquire(timeout=1):   # not a parent's, in a child made by fork()
      self._close()
      self.lock.release()

class _Write:
  __slots__ = ("u", "r", "n")
  def __init__(self, u:Uploads, r, n:int): self.u, self.r, self.n = u, r, n
  def __enter__(self): self.u._begin(self.r, self.n)
  def __exit__(self, *exc): self.u._end(self.n)

_uploads: Uploads|None = None

def _after_fork_in_child():
  global _uploads
  _uploads = None   # its thread is not in this process, and its lock may have been held by it
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork_in_child)

def uploads() -> Uploads|None:
  """The process's Uploads, or None when progress is not shown (stderr not a terminal, METAL_RUNNER_PROGRESS=0)."""
  global _uploads
  try: after = float(os.environ.get("METAL_RUNNER_PROGRESS", "2"))
  except ValueError: after = 2.0
  if after <= 0 or sys.stderr is None or not sys.stderr.isatty(): return None   # None: no fd 2 (started with 2>&-, pythonw)
  if _uploads is None:
    _uploads = Uploads(after)
    atexit.register(_uploads._exit)
  return _uploads
