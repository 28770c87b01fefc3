"""The macOS build, checked on Linux: the daemon compiled and linked for arm64 and x86-64 macOS through the Makefile's Darwin
path (make -C daemon macos-check: UNAME=Darwin) and CMake's (cmake/toolchain-zig-macos.cmake: CMAKE_SYSTEM_NAME=Darwin, so
if(APPLE)), every warning an error. The compiler is zig cc (PyPI ziglang, in the test extra), which carries Darwin's libc headers
and libSystem's link stubs; macOS 11 is the arm64 target, 10.15 (the oldest docs/metal.md names) the x86-64 one.

What stands in for Apple's SDK, which zig does not have: runner.m is compiled against tests/metal_stub (the project's Metal,
Foundation, objc and dispatch declarations, written from Apple's documentation: they are what is checked against Apple's
signatures by test_metal_typecheck.py, metal-cpp and PyObjC), advertise_dnssd.c against Avahi's dns_sd.h (Avahi's copy of
Apple's dns_sd API, libavahi-compat-libdnssd-dev, as test_discovery.py uses it), and the frameworks are not linked: their
symbols are left to dynamic lookup. Everything else (libc, pthreads, libdispatch, dns_sd's functions, mach_absolute_time)
resolves against zig's libSystem stubs, and this test checks that only Metal, Foundation and Objective-C runtime symbols
are left to dynamic lookup.

Checked for each build system and CPU: the build passes with -Werror and prints no warning; metal_runner is a Mach-O executable
for that CPU and macOS (LC_BUILD_VERSION or LC_VERSION_MIN_MACOSX, with the minimum version), linked against libSystem
only; every member of libmetal_runner.a is a Mach-O object for that CPU, among them runner.m's, which is Objective-C for
Apple's runtime ABI (its __objc_selrefs / __objc_classrefs sections and _OBJC_CLASS_$_ references, which the GNU runtime
does not have). And a warning fails each build (test_a_warning_fails_*).

What it cannot check: Apple's own Metal/Foundation headers and the link against the real frameworks, Apple's clang and
linker, and codesigning; the binaries are never run (no Mac here). .github/workflows/macos.yml does those on a Mac.
Builds are from scratch each run; zig caches compiled objects by content (~/.cache/zig), so only the first run is slow
(about 45 s on 2 cores), later ones take seconds.
"""
import os, re, shutil, struct, subprocess, sys
import pytest
from conftest import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform == "darwin", reason="on macOS make -C daemon is the real macOS build")]

ARCH = {"arm64": (0x0100000C, (11, 0)), "x86_64": (0x01000007, (10, 15))}   # CPU_TYPE_ARM64, CPU_TYPE_X86_64; minimum macOS
ZIG_TARGET = {"arm64": "aarch64-macos", "x86_64": "x86_64-macos"}           # zig's name for each, before .<minimum macOS>
MH_OBJECT, MH_EXECUTE = 1, 2
LC_SYMTAB, LC_LOAD_DYLIB, LC_SEGMENT_64, LC_VERSION_MIN_MACOSX, LC_BUILD_VERSION = 0x2, 0xC, 0x19, 0x24, 0x32
PLATFORM_MACOS = 1
# What may be left to dynamic lookup: Metal's C functions and classes, Foundation's classes, libobjc (Foundation links it).
DYNAMIC_OK = ("_MTL", "_OBJC_CLASS_$_MTL", "_OBJC_CLASS_$_NS", "_OBJC_METACLASS_$_NS", "_objc_")


def _missing(what: str):
  """A missing tool fails on Linux CI (CI=true), where ./setup.sh test installs it, and skips elsewhere."""
  if os.environ.get("CI") == "true": pytest.fail(what, pytrace=False)
  pytest.skip(what)


@pytest.fixture(scope="module")
def zig() -> str:
  try: import ziglang
  except ImportError: _missing("ziglang is not installed in this Python (pyproject's test extra; ./setup.sh test)")
  z = os.path.join(os.path.dirname(ziglang.__file__), "zig")
  if not os.access(z, os.X_OK): _missing(f"ziglang has no zig executable at {z}")
  if shutil.which("pkg-config") is None or subprocess.run(["pkg-config", "--exists", "avahi-compat-libdns_sd"]).returncode:
    _missing("no dns_sd.h: Avahi's compatibility header is needed (Debian: libavahi-compat-libdnssd-dev; ./setup.sh test)")
  return z


# *** reading Mach-O

def macho(data: bytes) -> dict:
  """A 64-bit little-endian Mach-O: its CPU, file type, minimum macOS, dylibs, sections and external symbols."""
  assert data[:4] == b"\xcf\xfa\xed\xfe", f"not a 64-bit Mach-O file (magic {data[:4].hex()})"
  cputype, _, filetype, ncmds = struct.unpack_from("<iiII", data, 4)
  out = {"cputype": cputype & 0xFFFFFFFF, "filetype": filetype, "platform": None, "minos": None, "dylibs": [], "sections": set(),
         "undefined": {}, "defined": set()}
  off = 32
  for _ in range(ncmds):
    cmd, size = struct.unpack_from("<II", data, off)
    if cmd == LC_BUILD_VERSION:
      platform, minos = struct.unpack_from("<II", data, off + 8)
      out["platform"], out["minos"] = platform, (minos >> 16, (minos >> 8) & 0xFF)
    elif cmd == LC_VERSION_MIN_MACOSX:
      (v,) = struct.unpack_from("<I", data, off + 8)
      out["platform"], out["minos"] = PLATFORM_MACOS, (v >> 16, (v >> 8) & 0xFF)
    elif cmd == LC_LOAD_DYLIB:
      (name,) = struct.unpack_from("<I", data, off + 8)
      out["dylibs"].append(data[off + name:off + size].split(b"\0")[0].decode())
    elif cmd == LC_SEGMENT_64:
      (nsects,) = struct.unpack_from("<I", data, off + 64)
      for i in range(nsects):
        s = off + 72 + 80 * i
        out["sections"].add(data[s:s + 16].rstrip(b"\0").decode())
    elif cmd == LC_SYMTAB:
      symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", data, off + 8)
      for i in range(nsyms):
        strx, ntype, _, desc, _ = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
        name = data[stroff + strx:].split(b"\0", 1)[0].decode()
        if ntype & 0xE0 or not ntype & 0x01: continue                           # debug entries; not external
        if ntype & 0x0E == 0: out["undefined"][name] = desc >> 8                 # N_UNDF: its library ordinal
        else: out["defined"].add(name)
    off += size
  return out


def archive_members(path) -> dict[str, bytes]:
  """The members of a static library (ar: GNU or BSD names), by name."""
  data, off, out, longnames = open(path, "rb").read(), 8, {}, b""
  assert data[:8] == b"!<arch>\n", f"{path} is not an ar archive"
  while off + 60 <= len(data):
    name, size = data[off:off + 16].decode().rstrip(), int(data[off + 48:off + 58])
    body = data[off + 60:off + 60 + size]
    if name == "//": longnames = body
    elif name.startswith("#1/"):                                                 # BSD: the name leads the body
      n = int(name[3:]); name, body = body[:n].rstrip(b"\0").decode(), body[n:]
    elif name.startswith("/") and name[1:].isdigit():                           # GNU: an offset into the // table
      name = longnames[int(name[1:]):].split(b"/\n", 1)[0].decode()
    if name not in ("/", "//", "__.SYMDEF", "__.SYMDEF SORTED"): out[name.rstrip("/")] = body
    off += 60 + size + (size & 1)
  return out


def check_macos_build(exe, lib, arch: str, runner_member: str):
  cputype, minos = ARCH[arch]
  m = macho(open(exe, "rb").read())
  assert (m["cputype"], m["filetype"]) == (cputype, MH_EXECUTE), f"{exe}: cputype {m['cputype']:#x}, filetype {m['filetype']}"
  assert (m["platform"], m["minos"]) == (PLATFORM_MACOS, minos), f"{exe}: platform {m['platform']}, minimum OS {m['minos']}"
  assert m["dylibs"] == ["/usr/lib/libSystem.B.dylib"], m["dylibs"]
  # Bound to no dylib: ld64 marks it DYNAMIC_LOOKUP_ORDINAL, zig's linker 0 (its own image); libSystem is ordinal 1.
  dynamic = {s for s, ordinal in m["undefined"].items() if ordinal not in range(1, len(m["dylibs"]) + 1)}
  stray = sorted(s for s in dynamic if not s.startswith(DYNAMIC_OK))
  assert not stray, f"{exe}: symbols neither in libSystem nor Metal/Foundation/libobjc, left to dynamic lookup: {stray}"
  assert {"_MTLCreateSystemDefaultDevice", "_objc_msgSend", "_OBJC_CLASS_$_MTLCompileOptions"} <= dynamic, sorted(dynamic)
  assert {"_DNSServiceRegister", "_dispatch_data_create", "_pthread_create"} <= set(m["undefined"]) - dynamic, \
    "dns_sd, libdispatch and pthreads must resolve in libSystem"
  members = archive_members(lib)
  assert runner_member in members and len(members) > 20, sorted(members)
  for name, body in members.items():
    o = macho(body)
    assert (o["cputype"], o["filetype"]) == (cputype, MH_OBJECT), f"{lib}({name}): cputype {o['cputype']:#x}, filetype {o['filetype']}"
    assert (o["platform"], o["minos"]) == (PLATFORM_MACOS, minos), f"{lib}({name}): platform {o['platform']}, minimum OS {o['minos']}"
  r = macho(members[runner_member])
  assert {"__objc_selrefs", "__objc_classrefs", "__objc_imageinfo"} <= r["sections"], \
    f"{runner_member} is not Objective-C for Apple's runtime ABI: sections {sorted(r['sections'])}"
  assert {"_objc_msgSend", "_OBJC_CLASS_$_NSString"} <= set(r["undefined"]), sorted(r["undefined"])


def no_warning(out: str) -> bool:
  return "warning" not in out.lower()


def check_deployment_target(out: str, zig: str, arch: str):
  """Each compile and link in the build log names the deployment target (issue 26, item 7): without one, Apple's clang takes
  the SDK's macOS, so a runner built on macOS 15 would not start on 14. zig cc ignores the flag (its target triple carries the
  version, which check_macos_build reads back from the Mach-O files), so this is where the Makefile's or CMakeLists.txt's own
  setting, the one a Mac's clang obeys, is seen."""
  want = "-mmacosx-version-min=%d.%d" % ARCH[arch][1]
  cmds = [ln for ln in out.splitlines() if f"{zig} cc " in ln]
  assert len(cmds) > 20, out[-3000:]
  missing = [ln for ln in cmds if want not in ln.split()]
  assert not missing, f"{len(missing)} of {len(cmds)} compiler commands lack {want}, e.g. {missing[0][:400]}"
  assert any(re.search(r" -o \S*metal_runner( |$)", ln) for ln in cmds), "no link of metal_runner in the log"


# *** the Makefile: make -C daemon macos-check (daemon/build/macos-<arch>/)

def make_check(zig: str, daemon, *args) -> subprocess.CompletedProcess:
  return subprocess.run(["make", "-C", str(daemon), "-j2", "macos-check", f"ZIG={zig}", *args], capture_output=True, text=True,
                        timeout=600)


@pytest.fixture(scope="module")
def make_build(zig):
  for a in ARCH: shutil.rmtree(ROOT / "daemon" / "build" / f"macos-{a}", ignore_errors=True)   # from scratch: zig's cache is fast
  return make_check(zig, ROOT / "daemon")


@pytest.mark.parametrize("arch", list(ARCH))
def test_make_builds_the_daemon_for_macos(zig, make_build, arch):
  r = make_build
  assert r.returncode == 0 and no_warning(r.stdout + r.stderr), r.stdout[-3000:] + r.stderr[-3000:]
  out = ROOT / "daemon" / "build" / f"macos-{arch}"
  assert "-Werror" in r.stdout and "-fno-objc-arc" in r.stdout and "runner.m" in r.stdout, r.stdout[-3000:]
  check_deployment_target("\n".join(ln for ln in r.stdout.splitlines() if f"-target {ZIG_TARGET[arch]}." in ln), zig, arch)
  check_macos_build(out / "metal_runner", out / "libmetal_runner.a", arch, "runner.o")


# *** CMake: cmake/toolchain-zig-macos.cmake

def cmake_check(zig: str, src, build, arch: str) -> tuple[int, str]:
  r = subprocess.run(["cmake", "-S", str(src), "-B", str(build), f"-DCMAKE_TOOLCHAIN_FILE={src}/cmake/toolchain-zig-macos.cmake",
                      f"-DMACOS_ARCH={arch}", f"-DZIG={zig}", "-DCMAKE_COMPILE_WARNING_AS_ERROR=ON"],
                     capture_output=True, text=True, timeout=300)
  if r.returncode: return r.returncode, r.stdout + r.stderr
  b = subprocess.run(["cmake", "--build", str(build), "-j2", "--", "VERBOSE=1"], capture_output=True, text=True, timeout=600)
  return b.returncode, r.stdout + r.stderr + b.stdout + b.stderr


@pytest.mark.parametrize("arch", list(ARCH))
def test_cmake_builds_the_daemon_for_macos(zig, arch, tmp_path):
  if shutil.which("cmake") is None: _missing("cmake is not installed (./setup.sh test installs it)")
  rc, out = cmake_check(zig, ROOT, tmp_path / "b", arch)
  assert rc == 0 and no_warning(out), out[-4000:]
  assert "-Werror" in out and "-fno-objc-arc" in out and "runner.m" in out, out[-3000:]
  check_deployment_target(out, zig, arch)
  check_macos_build(tmp_path / "b" / "metal_runner", tmp_path / "b" / "libmetal_runner.a", arch, "runner.m.o")


# *** the check can fail: a warning in a copy of the sources fails both builds

def _copy_with_a_warning(tmp_path):
  src = tmp_path / "src"
  shutil.copytree(ROOT / "daemon", src / "daemon", ignore=shutil.ignore_patterns("*.o", "*.a", "build", "asan", "emu", ".build-id",
                                                                              "metal_runner", "metal_runner_*", "fuzz_*"))
  shutil.copytree(ROOT / "tests" / "metal_stub", src / "tests" / "metal_stub")
  shutil.copytree(ROOT / "cmake", src / "cmake")
  shutil.copy(ROOT / "CMakeLists.txt", src)
  shutil.copytree(ROOT / "packaging", src / "packaging")
  p = src / "daemon" / "proto.c"
  p.write_text(p.read_text() + "\nstatic int mr_unused_for_the_test;\n")                          # -Wunused-variable
  return src


def test_a_warning_fails_the_make_build(zig, tmp_path):
  src = _copy_with_a_warning(tmp_path)
  r = make_check(zig, src / "daemon", "MACOS_ARCH=arm64")
  assert r.returncode != 0 and "mr_unused_for_the_test" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]


def test_a_warning_fails_the_cmake_build(zig, tmp_path):
  if shutil.which("cmake") is None: _missing("cmake is not installed (./setup.sh test installs it)")
  src = _copy_with_a_warning(tmp_path)
  rc, out = cmake_check(zig, src, tmp_path / "b", "arm64")
  assert rc != 0 and "mr_unused_for_the_test" in out, out[-3000:]
