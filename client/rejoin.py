"""The runners a model served over several (client/placement.py across_runners, placement_tp.py, client/llm_serve.py) was placed on at
start, and taking back one that was lost once it answers again at its address (restarted, or its machine back).

A lost runner's device cannot be used again: its session is gone, and tinygrad keeps, per device, what that session held (compiled
programs, the random seeds' buffers, freed buffers in the allocator's cache), whose handles name nothing, or something else, in a new
session. So a runner that comes back is opened as a new device, the next index past those in use (REMOTE:2 for the runner of REMOTE:1),
at its address (client/remote_metal.py `reopened`), and the old device is closed.

While a runner is missing a thread tries to open a session on it every WATCH_EVERY seconds (closed at once) and says on stderr when it
answers; the next request then places the model again over every runner named that answers (placement.py place_again). A request never
waits for that thread: it reads a set. With no runner lost no thread runs.
"""
from __future__ import annotations
import threading, time
from tinygrad import Device

WATCH_EVERY = 1.0   # seconds between two tries of a missing runner: a connect refused, or one that waits out CONNECT_TIMEOUT
CONNECT_TIMEOUT = 5.0

class Runners:
  """The runners named at start, the device each has now, and those lost and watched for."""
  def __init__(self, devices:tuple[str, ...], addrs:tuple[str, ...], say):
    self.addrs = addrs                                   # the runners named at start, in their order
    self.device: dict[str, str] = dict(zip(addrs, devices))   # address -> the device that has its session now
    self.back: set[str] = set()                          # missing runners that answered again, not taken back yet
    self.missing: set[str] = set()
    self.say, self.lock, self.watcher = say, threading.Lock(), None
    self.place_again = None                              # set by across_runners(_tp): place_again(drop) -> the new model

  def devices(self) -> tuple[str, ...]: return tuple(self.device[a] for a in self.addrs)

  def take_back(self, alive:tuple[str, ...]) -> list[tuple[str, str]]:
    """Each runner the watcher found answering again (and whose old device does not answer), opened as a new device: [(address,
    device)]. One that cannot be opened after all stays missing."""
    from client.remote_metal import reopened
    with self.lock: back, self.back = self.back, set()
    taken = []
    for a in (a for a in self.addrs if a in back and self.device[a] not in alive):
      base, used = self.device[a].split(":")[0], {*Device._opened_devices, *reopened}
      new = next(f"{base}:{i}" for i in range(len(self.addrs), 1 << 20) if f"{base}:{i}" not in used)
      reopened[new] = a
      try: Device[new]
      except (RuntimeError, OSError):   # RunnerUnavailable: gone again
        del reopened[new]
        continue
      Device[self.device[a]].finalize()   # the old session's: what of it is freed later sends nothing
      self.device[a] = new
      taken.append((a, new))
    return taken

  def watch(self, lost:list[str]):
    """Try the lost runners until each answers (a thread, started if none runs)."""
    with self.lock:
      self.missing = set(lost)
      if self.watcher is not None or not self.missing - self.back: return
      self.watcher = t = threading.Thread(target=self._watch, name="metal_runner rejoin", daemon=True)
    t.start()

  def _watch(self):
    from client.connection import Runner, RunnerError
    while True:
      with self.lock:
        if not (todo:=sorted(self.missing - self.back)):
          self.watcher = None
          return
      for a in todo:
        try: Runner(a, connect_timeout=CONNECT_TIMEOUT).close()
        except (RunnerError, OSError, ValueError): continue
        with self.lock: self.back.add(a)
        self.say(f"metal_runner: runner {a} answers again: the next request places the model over it too")
      time.sleep(WATCH_EVERY)
