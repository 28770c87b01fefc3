"""Type check of the Metal backend, daemon/runner.m (and the daemon/mtl_*.m files it is split into: "runner.m" below), on Linux.

This is a type check only, not a run: nothing here executes Metal or needs a GPU. clang parses daemon/runner.m as
Objective-C against tests/metal_stub/, headers that declare exactly the Foundation, Metal and dispatch API runner.m uses,
each written from Apple's documented signature. A misspelt selector, a wrong argument or return type, a message to an
undeclared method or a broken ownership rule fails it. Whether the backend works on Apple hardware is tested only by
.github/workflows/macos.yml, on a Mac.

The flags, and why each is there:
  -fsyntax-only -x objective-c   parse and type-check the .m file, generate nothing
  -fblocks                       dispatch_block_t in <dispatch/dispatch.h> is a block type
  -fobjc-runtime=macosx-13.0     Apple's Objective-C runtime rules (not GNUstep's, clang's Linux default)
  -fno-objc-arc                  runner.m uses manual retain/release, like ggml-metal; under ARC its own #error fires
  -D__APPLE__=1 -DMR_BACKEND_METAL   as a macOS build: backend.h then declares be_metal, so the definition is checked against it
  -Wall -Wextra -Wmissing-variable-declarations -Wmissing-prototypes -Werror   every warning is a failure
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The Metal backend's sources (daemon/Makefile's MTL): every .m file in daemon/, and the header they share.
RUNNER = sorted((ROOT / "daemon").glob("*.m"))
SHARED = ROOT / "daemon" / "mtl.h"
STUB = ROOT / "tests" / "metal_stub"
CLANG = shutil.which("clang")

pytestmark = [
  pytest.mark.skipif(CLANG is None, reason="clang is not installed, and the Objective-C type check of daemon/runner.m needs it "
                     "(Debian: apt-get install clang)"),
  pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the real SDK build (make -C daemon) checks runner.m; "
                     "the stub headers exist for Linux, where there is no SDK"),
]

FLAGS = ["-fsyntax-only", "-x", "objective-c", "-fblocks", "-fobjc-runtime=macosx-13.0", "-fno-objc-arc", "-D__APPLE__=1", "-DMR_BACKEND_METAL",
         "-Wall", "-Wextra", "-Wmissing-variable-declarations", "-Wmissing-prototypes", "-Werror"]


def typecheck(srcs: list[Path], flags=FLAGS) -> subprocess.CompletedProcess:
  cmd = [CLANG, *flags, "-I", str(STUB), "-I", str(ROOT / "daemon"), *map(str, srcs)]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def broken_copy(tmp_path: Path, old: str, new: str) -> list[Path]:
  assert sum(s.read_text().count(old) for s in RUNNER) == 1, f"runner.m no longer contains {old!r} exactly once: update this test"
  out = [tmp_path / s.name for s in RUNNER]
  for s, o in zip(RUNNER, out): o.write_text(s.read_text().replace(old, new))
  return out


def test_runner_typechecks():
  r = typecheck(RUNNER)
  assert r.returncode == 0, f"clang rejected daemon/runner.m:\n{r.stderr}"
  assert r.stderr == "", r.stderr


def test_renamed_selector_fails(tmp_path):
  # setBuffer:offset:atIndex: -> setBuffer:offset:index: (the Swift spelling): the check must catch it.
  src = broken_copy(tmp_path, "offset:(NSUInteger)off atIndex:i]", "offset:(NSUInteger)off index:i]")
  r = typecheck(src)
  assert r.returncode != 0, "a misspelt Metal selector passed the type check: the check cannot fail"
  assert "setBuffer:offset:index:" in r.stderr, r.stderr


@pytest.mark.parametrize("old,new,expect", [
  # a value where setBytes:length:atIndex: wants a pointer
  ("[enc setBytes:&v length:sizeof(v)", "[enc setBytes:v length:sizeof(v)", "setBytes"),
  # an NSArray where an id<MTLDevice> is expected
  ("dev = MTLCreateSystemDefaultDevice();", "dev = MTLCopyAllDevices();", "incompatible"),
  # a method Metal does not have on that protocol
  ("[cb computeCommandEncoder]", "[cb computeEncoder]", "computeEncoder"),
  # a C function with the wrong argument count
  ("dispatch_data_create(d->data, d->datalen, NULL,", "dispatch_data_create(d->data, d->datalen,", "dispatch_data_create"),
], ids=["value-for-pointer", "wrong-return-type", "unknown-method", "wrong-arg-count"])
def test_wrong_types_fail(tmp_path, old, new, expect):
  r = typecheck(broken_copy(tmp_path, old, new))
  assert r.returncode != 0, f"replacing {old!r} with {new!r} passed the type check"
  assert expect in r.stderr, r.stderr


def test_arc_build_is_refused():
  # Ownership is manual retain/release throughout; compiling under ARC must stop at runner.m's #error.
  flags = [f for f in FLAGS if f != "-fno-objc-arc"] + ["-fobjc-arc"]
  r = typecheck(RUNNER, flags)
  assert r.returncode != 0
  assert "compile it with -fno-objc-arc" in r.stderr, r.stderr


def test_stubs_declare_only_what_runner_uses():
  # The stubs are a record of exactly the API runner.m depends on; a declaration nothing uses is stale.
  code = "".join(s.read_text() for s in [*RUNNER, SHARED])
  names = set()
  for h in STUB.rglob("*.h"):
    text = re.sub(r"/\*.*?\*/", "", h.read_text(), flags=re.S)
    names |= set(re.findall(r"^[-+]\s*\([^)]*\)\s*(\w+)", text, flags=re.M))             # first selector piece of a method
    names |= set(re.findall(r"^@property\s*\([^)]*\)[^;]*?(\w+)\s*(?:NS_\w+|__attribute__|;)", text, flags=re.M))
    names |= set(re.findall(r"^extern\s[^;(]*?(\w+)\(", text, flags=re.M))                # C functions
  assert names, "found no declarations in tests/metal_stub"
  unused = sorted(n for n in names if not re.search(rf"\b{n}\b", code))
  assert not unused, f"tests/metal_stub declares API daemon/runner.m does not use: {unused}"
