# A metallib from a newer macOS (issue 26, item 1). A Metal runner reports its macOS and the newest Metal language version
# that macOS has in Rhello (cpu, features: protocol.md, Thello/Rhello); a client that compiles metallibs (tinygrad's
# MetalCompiler on a Mac, at its own macOS's language version) sends one only to a runner whose macOS is at least its
# own, and source to any other. The decision is tested here on its own (metal_kind: this host has no Metal compiler), and
# end to end with a client made to look like one on macOS 26 against runners on the Metal emulator (tests/metal_emulator,
# a test harness) that report macOS 13.0 and 26.0 (METAL_EMU_MACOS) and refuse a metallib newer than that, as a Mac does.
import struct
import pytest
from conftest import metal_runner_proc, needs_own_metal_runner, run_python
from client import protocol as P
from client.remote_metal import macos_version, metal_kind
from wire import Raw

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
IDS = "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]"
VERSION = HEAD + f"kernel void version(device int* out, {IDS}) {{ out[0] = __METAL_VERSION__; }}\n"
BOTH, LIB, SRC = P.CAP_METALLIB | P.CAP_METAL_SOURCE, P.CAP_METALLIB, P.CAP_METAL_SOURCE

def emu_metallib(src:str, major:int, minor:int) -> bytes:
  """The emulator's stand-in for a metallib compiled on a Mac at language version major.minor (tests/metal_emulator/README.md)."""
  return b"MTLBEMU1" + struct.pack("<I", major << 16 | minor) + src.encode()

# *** the decision, on its own

@pytest.mark.parametrize("text,want", [("14.5", (14, 5, 0)), ("14.5.1", (14, 5, 1)), ("26.0.0", (26, 0, 0)), ("13", (13, 0, 0)),
                                       ("16.0", (26, 0, 0)), ("16.1.2", (26, 1, 2)), ("10.16", (11, 0, 0)), ("10.15.7", (10, 15, 7)),
                                       ("", None), ("znver4", None), ("14.5.1.2", None), ("14.", None)])
def test_macos_version_parses_what_rhello_and_mac_ver_give(text, want):
  # 16 is what macOS 26 tells programs built with an older SDK, 10.16 what Big Sur told them: both are the real version
  assert macos_version(text) == want

@pytest.mark.parametrize("host,runner,caps,want", [
  ((26, 0, 0), (26, 0, 0), BOTH, P.PROG_METALLIB),        # the same macOS: this host's metallib loads there
  ((14, 5, 0), (15, 1, 0), BOTH, P.PROG_METALLIB),        # a newer runner loads an older library
  ((26, 0, 0), (13, 0, 0), BOTH, P.PROG_METAL_SOURCE),    # an older runner: source, which it compiles at its own version
  ((14, 5, 0), (14, 4, 0), BOTH, P.PROG_METAL_SOURCE),    # older by a minor version only
  ((14, 5, 0), None, BOTH, P.PROG_METAL_SOURCE),          # a runner that does not say (an earlier revision): source
  ((26, 0, 0), (13, 0, 0), LIB, P.PROG_METALLIB),         # no source compiler there (item 2): the one kind it takes
  ((26, 0, 0), (26, 0, 0), SRC, P.PROG_METAL_SOURCE),     # metallibs not taken
  (None, (26, 0, 0), BOTH, P.PROG_METAL_SOURCE),          # no Metal compiler on this host (Linux, METAL_RUNNER_SOURCE)
  (None, (26, 0, 0), LIB, None),                          # nothing this host can send
  ((26, 0, 0), None, 0, None),
])
def test_metal_kind(host, runner, caps, want):
  assert metal_kind(host, runner, caps) == want

# *** the emulator's knob: a Mac of another macOS, and what it refuses

def emulated(**env):
  needs_own_metal_runner()
  r = metal_runner_proc(env={k: str(v) for k, v in env.items()})
  if "emulator" not in P.cstr(Raw(r.addr).info["name"]):
    r.stop()
    pytest.skip("uses the Metal emulator's METAL_EMU_MACOS (tests/metal_emulator/README.md)")
  return r

def version_run(c:Raw, kind:int, data:bytes) -> int:
  """__METAL_VERSION__ as the kernel was compiled, or fails with the Tload's error."""
  c.alloc(1, 16)
  c.load(1, data, "version", nbufs=1, nvals=0, arch=0, kind=kind)
  c.launch(1, [(1, 0)], wait=True)
  t, f, p = c.frame()
  assert t == P.RLAUNCH, (P.TYPE_NAMES.get(t), f, p)
  return struct.unpack("<i", c.read(1, 0, 4))[0]

@pytest.mark.metal
@pytest.mark.parametrize("macos,cpu,features,compiled", [("13.0", "13.0.0", "3.0", 300), ("14.5.1", "14.5.1", "3.1", 310),
                                                         ("15.2", "15.2.0", "3.2", 310), ("26.1", "26.1.0", "4.0", 400),
                                                         ("16.0", "26.0.0", "4.0", 400), ("12.7", "12.7.0", "2.4", 200)])
def test_rhello_reports_the_macos_and_source_compiles_at_its_version(macos, cpu, features, compiled):
  r = emulated(METAL_EMU_MACOS=macos)
  try:
    c = Raw(r.addr)
    assert (P.cstr(c.info["cpu"]), P.cstr(c.info["features"])) == (cpu, features)
    # source is compiled at the version tinygrad uses on that macOS, which it has
    assert version_run(c, P.PROG_METAL_SOURCE, VERSION.encode()) == compiled
    c.close()
  finally:
    r.stop()

# issue 35, item 3: MSL 4.0 is Metal 4's language, so it is chosen where the device has MTLGPUFamilyMetal4, not from the macOS
# alone. An Intel Mac on macOS 26 (METAL_EMU_FAMILY=Mac2: a GPU of no Apple family, without Metal 4) compiles source at 3.1,
# tinygrad's version for macOS 14 and 15, and reports 3.2 as its newest; the emulator refuses 4.0 on such a device (what a Mac
# says was not seen). Chosen from the macOS alone, its one-line probe kernel failed and it offered no source at all.

@pytest.mark.metal
@pytest.mark.parametrize("family,arch,features,compiled", [("Mac2", "Mac2", "3.2", 310), ("Apple6", "Apple6", "3.2", 310),
                                                           ("Apple7", "Apple7", "4.0", 400)])
def test_msl_4_only_on_a_device_of_the_metal_4_family(family, arch, features, compiled):
  r = emulated(METAL_EMU_MACOS="26.0", METAL_EMU_FAMILY=family, METAL_EMU_TRACE=1)
  try:
    c = Raw(r.addr)
    assert (P.cstr(c.info["arch"]), P.cstr(c.info["cpu"]), P.cstr(c.info["features"])) == (arch, "26.0.0", features)
    assert c.info["caps"] & P.CAP_METAL_SOURCE, r.log_text()   # the probe kernel compiled
    assert version_run(c, P.PROG_METAL_SOURCE, VERSION.encode()) == compiled
    if compiled < 400:   # a metallib of MSL 4.0 is refused there too, one of 3.2 loads
      c.load(2, emu_metallib(VERSION, 4, 0), "version", nbufs=1, nvals=0, arch=0, kind=P.PROG_METALLIB)
      [(code, _, text)] = c.until_pong()
      assert code == P.EPROGRAM and "language version 4.0" in text, text
    c.close()
  finally:
    r.stop()

@pytest.mark.metal
def test_a_metallib_newer_than_the_runners_macos_is_refused():
  r = emulated(METAL_EMU_MACOS="13.0")
  try:
    c = Raw(r.addr)
    assert version_run(c, P.PROG_METALLIB, emu_metallib(VERSION, 3, 0)) == 300   # its own version loads
    c.load(2, emu_metallib(VERSION, 4, 0), "version", nbufs=1, nvals=0, arch=0, kind=P.PROG_METALLIB)   # macOS 26's does not
    [(code, _, text)] = c.until_pong()
    assert code == P.EPROGRAM and "This library is using language version 4.0 which is not supported on this OS" in text, text
    c.close()
  finally:
    r.stop()

# *** end to end: a client on macOS 26 (faked: platform.mac_ver, and a compiler that makes the emulator's metallibs at 4.0,
# as tinygrad's MetalCompiler compiles at metal4.0 there) and two runners, on macOS 26.0 and 13.0, in one program

CLIENT = r'''
import json, platform, struct, sys
platform.mac_ver = lambda *a: ("26.0", ("", "", ""), "arm64")
import client.remote_metal as rm
from tinygrad.device import Compiler
class EmuMetallibCompiler(Compiler):
  def __init__(self): super().__init__(None)
  def compile(self, src:str) -> bytes: return b"MTLBEMU1" + struct.pack("<I", 4 << 16) + src.encode()
rm.METAL_SOURCE, rm.MetalCompiler = False, EmuMetallibCompiler
sys.modules["tinygrad.runtime.ops_metal"].MetalCompiler = EmuMetallibCompiler   # what tinygrad's MetalRenderer instantiates
from tinygrad import Device, Tensor
out = {}
for d in ("METAL:0", "METAL:1"):
  x = Tensor([1.0, 2.0, 3.0, 4.0], device=d)
  out[d] = {"values": (x * 2 + 1).tolist(), "kind": Device[d].kind, "compiler": type(Device[d].renderer.compiler).__name__}
print(json.dumps(out))
'''

@pytest.mark.metal
def test_a_client_on_a_newer_macos_sends_source_to_an_older_runner_and_metallibs_to_a_current_one():
  needs_own_metal_runner()
  new, old = emulated(METAL_EMU_MACOS="26.0", METAL_EMU_TRACE=1), emulated(METAL_EMU_MACOS="13.0", METAL_EMU_TRACE=1)
  try:
    r = run_python(CLIENT, {"METAL_RUNNER": f"{new.addr},{old.addr}", "DEV": "METAL"})
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["METAL:0"] == {"values": [3.0, 5.0, 7.0, 9.0], "kind": P.PROG_METALLIB, "compiler": "EmuMetallibCompiler"}, out
    assert out["METAL:1"] == {"values": [3.0, 5.0, 7.0, 9.0], "kind": P.PROG_METAL_SOURCE, "compiler": "MetalSourceCompiler"}, out
    # what each runner was given: the current one metallibs only, the old one source only (its own start-up probe is source too)
    assert "newLibraryWithData: a metallib of language version 4.0" in new.log_text()
    old_log = old.log_text()
    assert "newLibraryWithData" not in old_log and old_log.count("newLibraryWithSource") >= 2, old_log
    assert "languageVersion=3.0" in old_log, old_log
  finally:
    new.stop(); old.stop()

# *** python -m client probe shows them

@pytest.mark.metal
def test_probe_shows_the_runners_macos_and_language_version():
  import json, os, subprocess, sys
  from conftest import ROOT
  r = emulated(METAL_EMU_MACOS="14.5")
  try:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "METAL_RUNNER_TOKEN_FILE": ""}
    run = lambda *a: subprocess.run([sys.executable, "-m", "client", "probe", "--pings", "0", "--size", "4K", *a, r.addr],
                                    capture_output=True, text=True, timeout=60, env=env)
    p, j = run(), run("--json")
    assert p.returncode == 0 and j.returncode == 0, p.stderr + j.stderr
    rows = {ln.split(None, 1)[0]: ln.split(None, 1)[1].strip() for ln in p.stdout.splitlines() if ln.strip() and " " in ln.strip()}
    assert (rows["macos"], rows["metal"]) == ("14.5.0", "3.1"), p.stdout
    d = json.loads(j.stdout)
    assert (d["macos"], d["metal_language"], d["gpu_family"]) == ("14.5.0", "3.1", "Apple7"), d
  finally:
    r.stop()
