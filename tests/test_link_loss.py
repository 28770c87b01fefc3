"""A runner lost at the other end of a link (protocol.md, Links between runners; client/graph.py). The runner: a send whose receiving
runner is killed outright (SIGKILL, its session processes too) while the send waits fails the launch or graph run that sent it with
EPEER, never success, in both isolation modes (the conformance suite, tests/conformance/test_link_faults.py, has the other ways the
receiving side goes away; it cannot kill a runner). The client: a program whose peer runner is stopped (SIGTERM or SIGKILL) in the
middle of a sharded step ends with an error whose last line names that runner and says it stopped, not only the survivor's EPEER."""
import json, os, signal, time
import pytest
from conftest import run_python, runner
from conformance.spec import Target
from conformance.test_links import SEND, dial, graph, graphrun, link_rec, listen, load_link, refused, send_text, xfer
from conformance.spec import P

N = 40 << 20

@pytest.mark.parametrize("iso", ["process", "thread"])
@pytest.mark.parametrize("via", ["launch", "graphrun"])
def test_a_send_whose_receiving_runner_is_killed_fails_with_epeer(daemon_bin, iso, via):
  with runner("--isolation", iso) as (a0, _), runner("--isolation", iso) as (a1, p1):
    c, d = Target(a0, None, iso, None).connect(), Target(a1, None, iso, None).connect()
    g, sec = listen(d, 2)
    dial(c, 1, a1, g, sec)
    c.alloc(1, N)
    load_link(c, 1, SEND, 1)
    if via == "launch": tag = xfer(c, 1, 1, 0, N, 1)
    else:
      graph(c, 1, link_rec(1, 1, 0, N, 1))
      tag = graphrun(c, 1)
    time.sleep(0.5)                                                 # the sending runner holds most of the 40 MiB
    os.killpg(p1.pid, signal.SIGKILL)                              # the runner and its session processes
    t0 = time.monotonic()
    text = refused(c, tag, P.EPEER)
    assert text.startswith(send_text(1, a1)), text
    assert time.monotonic() - t0 < 5, "the failure waited for the frame timeout"
    assert c.ping(b"still here") == b"still here"                   # the session goes on
    c.close(); d.close()

# A tensor-parallel step over two runners (an all-reduce on links every step); runner 1 is stopped after a few steps, and the error
# is left to end the program as any uncaught exception does.
PROGRAM = r"""
import os, signal, time, numpy as np, client.remote_metal
from tinygrad import Device, Tensor, TinyJit
devs = ("REMOTE:0", "REMOTE:1")
rng = np.random.default_rng(0)
W1 = Tensor(rng.standard_normal((256, 512), dtype=np.float32) / 8, device=devs[0]).shard(devs, axis=0).realize()
W2 = Tensor(rng.standard_normal((512, 256), dtype=np.float32) / 8, device=devs[0]).shard(devs, axis=1).realize()
@TinyJit
def step(x): return (W2 @ (W1 @ x).relu()).tanh().realize()
x = Tensor(np.ones((512, 1), dtype=np.float32), device=devs[0])
for i in range(40):
  if i == 4: os.kill(int(os.environ["T_PID"]), int(os.environ["T_SIG"]))
  step(x.shard(devs).realize()).numpy()
print("no error", flush=True)
"""

@pytest.mark.cpu_only
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_program_whose_peer_runner_stops_mid_step_ends_with_an_error_naming_it(daemon_bin, sig):
  with runner("--frame-timeout", "5") as (a0, _), runner("--frame-timeout", "5") as (a1, p1):
    t0 = time.monotonic()
    r = run_python(PROGRAM, {"METAL_RUNNER": f"{a0},{a1}", "T_PID": str(p1.pid), "T_SIG": str(int(getattr(signal, sig)))}, timeout=120)
    took = time.monotonic() - t0
  assert r.returncode != 0 and "no error" not in r.stdout, r.stdout + r.stderr[-3000:]
  last = r.stderr.strip().splitlines()[-1]
  assert f"runner {a1}" in last and "stopped" in last, last
  assert a0 not in last or last.index(a1) < last.index(a0), f"the last line puts the survivor first: {last}"
  assert took < 60, f"{took:.1f} s: the program waited for a frame timeout or hung"
