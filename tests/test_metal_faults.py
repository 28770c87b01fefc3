# The Metal backend (daemon/runner.m) where a real GPU differs from a CPU: failures only a GPU has (a lost device, a nil
# command buffer or encoder), when GPU work starts, what the compiler is told. Issue 20, item 3. Each test starts a runner
# of its own on the Metal emulator (tests/metal_emulator, a test harness) with a knob that makes the emulated GPU fail, or
# report, as its README describes; against a Mac's runner (METAL_RUNNER) they skip: the knobs are the emulator's.
import re, socket, struct, time
import pytest
from conftest import metal_runner_proc, needs_own_metal_runner
from client import protocol as P
from wire import Raw

pytestmark = pytest.mark.metal

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
IDS = "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]"
ADD1 = HEAD + f"kernel void add1(device float* out, device float* a, {IDS}) {{ out[gid.x] = a[gid.x] + 1.0f; }}\n"
# about n dependent multiply-adds (no closed form a compiler could find), then a value that depends on all of them
SLOW = HEAD + (f"kernel void slow(device int* out, constant int& n, {IDS}) {{\n"
               "  uint acc = 1; for (int i = 0; i < n; i++) acc = acc * 1664525u + 1013904223u;\n"
               "  out[0] = (int)(acc | 1u);\n}\n")

def load(c:Raw, prog:int, src:str, nbufs:int, nvals:int=0) -> int:
  return c.load(prog, src.encode(), src.split("kernel void ", 1)[1].split("(", 1)[0], nbufs=nbufs, nvals=nvals, arch=0,
                kind=P.PROG_METAL_SOURCE)

def emulated(**env):
  """A runner of this test's own on the Metal emulator, with env (the knobs) in its environment."""
  needs_own_metal_runner()
  r = metal_runner_proc(env={k: str(v) for k, v in env.items()})
  if "emulator" not in Raw(r.addr).info["name"].rstrip(b"\0").decode():
    r.stop()
    pytest.skip("uses the Metal emulator's knobs (tests/metal_emulator/README.md); this runner is a real GPU's")
  return r

# *** d: compile options, set explicitly as tinygrad's -fno-fast-math means them, after the language version

def test_compile_options_are_explicit():
  r = emulated(METAL_EMU_TRACE=1)
  try:
    c = Raw(r.addr)
    load(c, 1, ADD1, 2)
    assert c.until_pong() == []
    c.close()
    log = r.wait_log("compile options set:")
  finally:
    r.stop()
  opts = re.search(r"compile options set: (.*)", log).group(1)
  # the language version first (mathMode's default depends on it), then both math settings; not the deprecated
  # fastMathEnabled, whose mapping left mathFloatingPointFunctions to the system
  assert opts == "languageVersion=4.0, mathMode=safe, mathFloatingPointFunctions=precise", opts
