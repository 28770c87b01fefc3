"""The CMake build (for embedding and cross builds) of the daemon and of metal_runner_emu, the Metal backend on the Metal
emulator (tests/metal_emulator, a test harness): both build from a clean tree and start."""
import re, select, shutil, subprocess, sys
import pytest
from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed (setup.sh test installs it)")]

def start(exe, *args) -> str:
  p = subprocess.Popen([str(exe), "--host", "127.0.0.1", "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    line = p.stdout.readline() if select.select([p.stdout], [], [], 20)[0] else ""
    assert re.match(r"listening on 127\.0\.0\.1:\d+", line), (line, p.poll())
  finally:
    p.terminate()
    p.wait(10)
  return p.stderr.read()

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
