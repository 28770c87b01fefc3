"""Upload progress (client/progress.py): a run of copyins that takes a while shows a bar on stderr when stderr is a terminal (a pty
here), and nothing when it is a pipe, when the upload is short, when writes are only a small part of the time (a training loop's
batches), or with METAL_RUNNER_PROGRESS=0. METAL_RUNNER_PROGRESS sets after how many seconds a bar shows: the tests make it short so
that a loopback upload of some hundred MB is long enough."""
import os, pty, re, subprocess, sys, textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# tinygrad's copyins, tensor after tensor, as a model load does
LOAD = textwrap.dedent("""
  import sys, time, numpy as np
  from tinygrad import Tensor
  n, mb, gap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
  w = [Tensor(np.full((mb << 18,), i, np.float32)).realize() for i in range(n) if not time.sleep(gap)]
  assert all(int(t[0].item()) == i for i, t in enumerate(w))
  print("loaded on", w[0].device, file=sys.stderr)
""")

def run(tmp_path, addr:str, args, tty:bool, progress:str|None) -> str:
  """The program's stderr, from a pty when tty, else from a pipe."""
  (script := tmp_path / "load.py").write_text(LOAD)
  # DEV set would keep the program on that device (client run honours it): tinygrad sets it in this process's environment when a test
  # here sets Device.DEFAULT (tinygrad/device.py), so it goes, as conftest.run_python drops it
  env = {**{k: v for k, v in os.environ.items() if k not in ("DEV", "DEBUG", "BEAM")}, "PYTHONPATH": ROOT, "METAL_RUNNER_CACHE": "0"}
  env.pop("METAL_RUNNER_PROGRESS", None)
  if progress is not None: env["METAL_RUNNER_PROGRESS"] = progress
  argv = [sys.executable, "-m", "client", "run", "--runner", addr, str(script), *map(str, args)]
  if not tty:
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0 and "loaded on REMOTE" in p.stderr.decode(), p.stderr.decode()   # on the runner: else nothing to show
    return p.stderr.decode()
  m, s = pty.openpty()
  p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=s)
  os.close(s)
  out = b""
  while True:
    try: b = os.read(m, 65536)
    except OSError: break   # EIO: the program and its children closed the pty
    if not b: break
    out += b
  os.close(m)
  assert p.wait(60) == 0 and b"loaded on REMOTE" in out, out.decode(errors="replace")
  return out.decode(errors="replace")

def test_long_upload_shows_progress_on_a_terminal(tmp_path, cpu_runner):
  err = run(tmp_path, cpu_runner, (24, 16, 0), True, "0.05")   # 24 tensors of 16 MB
  lines = err.replace("\r\n", "\n").split("\r")
  bars = [ln for ln in lines if ln.startswith("upload to runner:")]
  assert len(bars) >= 2, err   # redrawn as it goes
  # the last line has every byte (24 x 16 MiB), the rate, and ends the line at the program's next read, before it prints
  assert re.fullmatch(r"upload to runner: 403MB \[[\d:]+, [\d.]+[kMG]?B/s\]\nloaded on REMOTE\n", lines[-1]), err

def test_one_large_write_shows_time_left(tmp_path, cpu_runner):
  err = run(tmp_path, cpu_runner, (1, 768, 0), True, "0.02")   # one tensor: its size is the upload's total
  lines = [ln for ln in err.replace("\r\n", "\n").split("\r") if "upload to runner:" in ln]
  assert any("/805M" in ln and "<" in ln and "%|" in ln for ln in lines), err   # bytes of the total, a bar, time left

def test_no_progress_on_a_pipe(tmp_path, cpu_runner):
  err = run(tmp_path, cpu_runner, (24, 16, 0), False, "0.05")
  assert "loaded on REMOTE" in err and "upload to runner" not in err and "\r" not in err, err

def test_no_progress_when_off_short_or_mostly_not_uploading(tmp_path, cpu_runner):
  assert "upload to runner" not in run(tmp_path, cpu_runner, (24, 16, 0), True, "0")      # METAL_RUNNER_PROGRESS=0
  assert "upload to runner" not in run(tmp_path, cpu_runner, (4, 16, 0), True, None)      # 64 MB: well under 2 s
  # writes a small part of the time, as a training loop's batches: not an upload
  assert "upload to runner" not in run(tmp_path, cpu_runner, (12, 1, 0.1), True, "0.3")
