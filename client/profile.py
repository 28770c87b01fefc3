# profile.py: a runner's own timings in tinygrad's profiler (PROFILE=1, VIZ=1).
# With PROFILE on, a RemoteDevice turns its runner session's profile on (protocol.md, Tprofile). The runner records the device's start
# and end of every kernel, every kernel inside a graph run and every Twrite/Rread/Tcopy, in its own clock; at each synchronize (and
# before its profile could fill up) this client fetches the records, maps them onto the host's perf_counter clock, and adds them to
# tinygrad's Compiled.profile_events as ops_metal.py adds its command buffers' GPU times: a ProfileRangeEvent per kernel, a
# ProfileGraphEvent per graph run, and ranges on "<device>:COPY" for the transfers. So PROFILE's pickle and VIZ show host work, the
# network and the device on one timeline.
# Clocks: the offset between the runner's clock and the host's is estimated as NTP does (several Tclock round trips, the one with the
# smallest round trip, its midpoint) when the device opens and again at a fetch (at most every RESAMPLE_NS); a record is mapped with
# the offset interpolated between the estimates taken before and after it, which follows a drift between the two clocks.
from __future__ import annotations
import bisect, decimal, sys, time
from tinygrad.device import Compiled, ProfileDeviceEvent, ProfileGraphEntry, ProfileGraphEvent
from tinygrad.helpers import ProfileRangeEvent, TracingKey
from client import protocol as P

CONNECT_SAMPLES, FETCH_SAMPLES = 16, 4  # Tclock round trips per offset estimate
RESAMPLE_NS = 50_000_000  # a fetch estimates the offset again only this long after the last estimate: 100 ppm of drift is 5 us

class ClockMap:
  """Runner profile clock (ns) -> host perf_counter_ns, from NTP-style estimates: (runner clock, host - runner offset, round trip)."""
  def __init__(self, runner): self.runner, self.points = runner, []
  def sample(self, n:int):
    t0, c, t1 = min((self.runner.clock() for _ in range(n)), key=lambda s: s[2] - s[0])
    if self.points and c <= self.points[-1][0]: return   # no time passed on the runner: nothing to add
    self.points.append((c, (t0 + t1) // 2 - c, t1 - t0))
  @property
  def rtt(self) -> int: return min(p[2] for p in self.points)
  def to_host(self, t:int) -> int:
    pts = self.points
    if (i:=bisect.bisect_right(pts, t, key=lambda p: p[0])) == 0: return t + pts[0][1]
    if i == len(pts): return t + pts[-1][1]
    (c0, o0, _), (c1, o1, _) = pts[i-1], pts[i]
    return t + o0 + (o1 - o0) * (t - c0) // (c1 - c0)

def us(ns:int) -> decimal.Decimal: return decimal.Decimal(ns) / 1000   # tinygrad's profile times: perf_counter microseconds

class RunnerProfiler:
  """The profile of one RemoteDevice's runner session: names of its programs, records expected since the last fetch, the clock map."""
  def __init__(self, device:str, runner):
    self.device, self.runner, self.progs, self.expected, self.lost = device, runner, {}, 0, 0
    self.cap = runner.profile(P.PROFILE_ON, 0)[3]
    self.clock = ClockMap(runner)
    self.clock.sample(CONNECT_SAMPLES)
    # tdiff 0: every record is mapped onto the host clock here, with the drift, rather than by one offset per device in VIZ
    Compiled.profile_events += [ProfileDeviceEvent(device), ProfileDeviceEvent(f"{device}:COPY")]

  def program(self, handle:int, name:str, profile_key:bytes|None): self.progs[handle] = (name, profile_key)

  def issued(self, n:int=1):
    """n more records are coming; fetch before the runner's profile could fill up (it would only count what did not fit)."""
    self.expected += n
    if self.expected > self.cap // 2: self.fetch()

  def fetch(self):
    """Wait for the session's work (Tprofile waits as Tsync does, and raises its errors), then turn every record into an event."""
    recs: list[dict] = []
    while True:
      r, left, lost, _ = self.runner.profile(P.PROFILE_ON)
      recs += r
      self.lost += lost
      if not left: break
    self.expected = 0
    if lost: print(f"{self.device}: the runner's profile was full: {lost} kernels or copies are not in the profile", file=sys.stderr)
    if recs and time.perf_counter_ns() - self.clock.points[-1][0] - self.clock.points[-1][1] > RESAMPLE_NS: self.clock.sample(FETCH_SAMPLES)
    Compiled.profile_events += self.events(recs)

  def events(self, recs:list[dict]) -> list:
    out, graph, h = [], [], self.clock.to_host
    def flush_graph():
      if not graph: return
      ents = [ProfileGraphEntry(self.device, self.progs.get(r["handle"], (f"prog {r['handle']}", None))[0], 2*i, 2*i+1,
                                self.progs.get(r["handle"], ("", None))[1]) for i, r in enumerate(graph)]
      out.append(ProfileGraphEvent(ents, [], [us(h(t)) for r in graph for t in (r["start"], r["end"])]))
      graph.clear()
    for r in recs:
      if r["start"] == r["end"] == 0: continue   # work that failed on the device
      if r["kind"] != P.PROF_GRAPH or (graph and graph[0]["tag"] != r["tag"]): flush_graph()
      st, en = us(h(r["start"])), us(h(r["end"]))
      if r["kind"] == P.PROF_LAUNCH:
        name, key = self.progs.get(r["handle"], (f"prog {r['handle']}", None))
        out.append(ProfileRangeEvent(self.device, name, st, en, key))
      elif r["kind"] == P.PROF_GRAPH: graph.append(r)
      else:
        what = {P.PROF_WRITE: f"TINY -> {self.device}", P.PROF_READ: f"{self.device} -> TINY",
                P.PROF_COPY: f"{self.device} -> {self.device}"}.get(r["kind"], f"record kind {r['kind']}")
        out.append(ProfileRangeEvent(f"{self.device}:COPY", TracingKey(what, ret=r["count"], tb=None), st, en))
    flush_graph()
    return out
