"""The CMake build (for embedding and cross builds) of the daemon and of metal_runner_emu, the Metal backend on the Metal
emulator (tests/metal_emulator, a test harness): both build from a clean tree and start. The arm64 and riscv64 cross builds (make and
CMake toolchain files) make binaries for that CPU; tests/test_qemu_runners.py runs them under qemu-user."""
import shutil, subprocess, sys
import pytest
from conftest import ROOT
from runner_proc import RunnerProc

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed (setup.sh test installs it)")]

def start(exe, *args) -> str:
  """Starts exe as a runner (it must say it listens) and stops it; returns its log."""
  r = RunnerProc(*args, binary=exe)
  r.stop()
  return "\n".join(r.log)

@pytest.mark.skipif(sys.platform == "darwin", reason="the Metal emulator is for Linux; on macOS the build has the real Metal backend")
def test_cmake_builds_daemon_and_emulator(tmp_path):
  b = tmp_path / "build"
  r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(b), "-DMETAL_RUNNER_EMULATOR=ON", "-DCMAKE_OBJC_COMPILER=clang"],
                     capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr
  r = subprocess.run(["cmake", "--build", str(b), "-j2"], capture_output=True, text=True)
  assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
  assert (b / "libmetal_runner.a").exists()
  start(b / "metal_runner")
  log = start(b / "metal_runner_emu", "--backend", "metal")
  assert "TEST HARNESS" in log and "backend metal (Metal emulator" in log, log

# *** cross builds: make -C daemon cross (daemon/build/<arch>/) and the CMake toolchain files, checked by the ELF machine of what they make

CROSS = {"arm64": ("aarch64-linux-gnu", 183), "riscv64": ("riscv64-linux-gnu", 243)}   # EM_AARCH64, EM_RISCV

def elf_machine(path) -> int:
  data = open(path, "rb").read(20)
  assert data[:4] == b"\x7fELF", path
  return int.from_bytes(data[18:20], "little")

def archive_machines(path) -> set[int]:
  """The ELF machine of every member of a static library (ar format: 60-byte member headers)."""
  data, off, out = open(path, "rb").read(), 8, set()
  assert data[:8] == b"!<arch>\n"
  while off + 60 <= len(data):
    size = int(data[off + 48:off + 58]); body = data[off + 60:off + 60 + size]
    if body[:4] == b"\x7fELF": out.add(int.from_bytes(body[18:20], "little"))
    off += 60 + size + (size & 1)
  return out

@pytest.mark.parametrize("arch", list(CROSS))
def test_cross_builds(arch, tmp_path):
  triple, machine = CROSS[arch]
  if shutil.which(f"{triple}-gcc") is None: pytest.skip(f"{triple}-gcc is not installed (setup.sh test installs gcc-{triple})")
  native = ROOT / "daemon" / "metal_runner"
  before = native.stat().st_mtime_ns if native.exists() else None
  r = subprocess.run(["make", "-C", str(ROOT / "daemon"), "cross", f"ARCH={arch}"], capture_output=True, text=True)
  assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
  out = ROOT / "daemon" / "build" / arch
  assert elf_machine(out / "metal_runner") == machine and archive_machines(out / "libmetal_runner.a") == {machine}
  assert (native.stat().st_mtime_ns if native.exists() else None) == before, "the cross build touched the native daemon/metal_runner"
  b = tmp_path / "build"
  r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(b), f"-DCMAKE_TOOLCHAIN_FILE={ROOT}/cmake/toolchain-{triple}.cmake"],
                     capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr
  r = subprocess.run(["cmake", "--build", str(b), "-j2"], capture_output=True, text=True)
  assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
  assert elf_machine(b / "metal_runner") == machine and archive_machines(b / "libmetal_runner.a") == {machine}

def test_a_compiler_change_rebuilds_every_object(tmp_path):
  """make -C daemon CC=<cross gcc> builds in place: objects from the compiler before must not end up in its binary (daemon/.build-id)."""
  if shutil.which("aarch64-linux-gnu-gcc") is None: pytest.skip("aarch64-linux-gnu-gcc is not installed")
  src = tmp_path / "daemon"
  shutil.copytree(ROOT / "daemon", src, ignore=shutil.ignore_patterns("*.o", "*.a", "build", "asan", "emu", ".build-id", "metal_runner",
                                                                   "metal_runner_*", "fuzz_*"))
  for cc, machine in (("cc", None), ("aarch64-linux-gnu-gcc", 183), ("cc", None)):
    r = subprocess.run(["make", "-C", str(src), f"CC={cc}", "metal_runner"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    want = machine or elf_machine(sys.executable)
    assert elf_machine(src / "metal_runner") == want and archive_machines(src / "libmetal_runner.a") == {want}
