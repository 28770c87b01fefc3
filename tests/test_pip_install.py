"""The client pip-installed into a fresh venv outside the clone (pyproject.toml, client/local_build.py), as the README's "In your own
Python environment" says: the wheel carries the daemon's sources and no binary; `python -m client run` with no runner named builds the
runner once into the per-user cache (~/.cache/metal_runner/<key>/, $XDG_CACHE_HOME), runs the program on it and stops it; changed
sources get a build of their own; a failed build shows the compiler's output. The clone is copied first (built daemon included, so
the wheel is shown to leave its binaries out) and installed from the copy: pip's build leaves build/ and *.egg-info behind. HOME and
XDG_CACHE_HOME are temporary folders, so nothing is left in the user's cache; tinygrad comes from PyPI (pip's cache after the first time).
"""
import os, pathlib, re, shutil, subprocess, sys, time, zipfile
import pytest
from conftest import ROOT
from test_readme import IN_YOUR_ENV

pytestmark = [pytest.mark.slow, pytest.mark.cpu_only]

# a tinygrad program that reports where its local runner was started from
MYSCRIPT = """\
from tinygrad import Device, Tensor
import client.remote_metal as rm
x = Tensor([[1.0, 2.0], [3.0, 4.0]])
print(Device.DEFAULT, (x @ x).sum().item(), rm.local_runners[0].args[0])
"""
KEY = re.compile(r"[0-9a-f]{64}")
BINARY_MAGIC = (b"\x7fELF", b"!<arch>\n", b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")

def pip_env(venv:pathlib.Path) -> dict[str, str]:
  """The user's shell with the venv activated: its bin first on PATH, nothing of the test suite's (PYTHONPATH, the token setting)."""
  drop = ("METAL_RUNNER", "METAL_RUNNER_TOKEN_FILE", "DEV", "DEBUG", "BEAM", "PYTHONPATH", "XDG_CACHE_HOME", "VIRTUAL_ENV", "CC", "MAKEFLAGS")
  env = {k: v for k, v in os.environ.items() if k not in drop}
  return {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}

def user_env(venv:pathlib.Path, home:pathlib.Path, **extra:str) -> dict[str, str]:
  return {**pip_env(venv), "HOME": str(home), **extra}

@pytest.fixture(scope="module")
def clone(tmp_path_factory, daemon_bin) -> pathlib.Path:
  """A copy of the clone as a user has it after ./setup.sh: sources and built objects and binaries, no .venv."""
  dst = tmp_path_factory.mktemp("pip") / "metal_runner"
  shutil.copytree(ROOT, dst, symlinks=True, ignore=shutil.ignore_patterns(".venv", ".git", "build", ".build", "*.egg-info", ".pytest_cache"))
  assert (dst / "daemon" / "metal_runner").is_file() and list((dst / "daemon").glob("*.o")), "the copy should hold a built daemon"
  return dst

@pytest.fixture(scope="module")
def venv(clone) -> pathlib.Path:
  """A fresh venv outside the clone with the README's pip command run in it."""
  v = clone.parent / "venv"
  subprocess.run([sys.executable, "-m", "venv", str(v)], check=True, timeout=120)
  cmd = IN_YOUR_ENV[0].replace("/path/to/metal_runner", str(clone))
  r = subprocess.run(["sh", "-c", cmd], cwd=clone.parent, env=pip_env(v), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                     timeout=900)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return v

def site_client(venv:pathlib.Path) -> pathlib.Path:
  r = subprocess.run([str(venv / "bin" / "python"), "-c", "import client; print(client.__file__)"], cwd=venv, env=pip_env(venv),
                     capture_output=True, text=True, check=True)
  return pathlib.Path(r.stdout.strip()).parent

def run_program(venv:pathlib.Path, home:pathlib.Path, work:pathlib.Path, **extra:str) -> subprocess.CompletedProcess:
  """The README's run command in work (outside the clone), with no runner named."""
  work.mkdir(parents=True, exist_ok=True)
  (work / "myscript.py").write_text(MYSCRIPT)
  try: return subprocess.run(["sh", "-c", IN_YOUR_ENV[1]], cwd=work, env=user_env(venv, home, **extra), stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=300)
  except subprocess.TimeoutExpired as e: pytest.fail(f"the program did not finish in 300 s\nstdout: {e.stdout}\nstderr: {e.stderr}")

def procs_under(d:pathlib.Path) -> list[int]:
  """The processes running a binary under d (Linux: /proc/PID/exe)."""
  pids = []
  for p in pathlib.Path("/proc").glob("[0-9]*"):
    try: exe = os.readlink(p / "exe")
    except OSError: continue
    if exe.startswith(str(d) + os.sep): pids.append(int(p.name))
  return pids

def assert_no_runner_left(d:pathlib.Path):
  deadline = time.monotonic() + 5
  while (left:=procs_under(d)) and time.monotonic() < deadline: time.sleep(0.1)
  assert not left, f"runner processes left behind: {left}"

def cache_entries(cache:pathlib.Path) -> list[str]:
  """The builds and temporary folders in the build cache; not the lock files (.KEY.lock), which only serialize builds."""
  d = cache / "metal_runner"
  return sorted(p.name for p in d.iterdir() if not p.name.endswith(".lock")) if d.exists() else []

# *** the wheel

def test_wheel_has_the_daemon_sources_and_no_binary(clone, tmp_path):
  r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(clone), "-w", str(tmp_path)], capture_output=True,
                     text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  (whl,) = tmp_path.glob("*.whl")
  with zipfile.ZipFile(whl) as z: files = {n: z.read(n) for n in z.namelist()}
  # every file daemon/ holds in git at its top level (what make reads by default), and nothing else of daemon/
  tracked = subprocess.run(["git", "ls-files", "daemon"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  want = sorted(f"client/daemon_src/{f.split('/', 1)[1]}" for f in tracked if f.count("/") == 1)
  assert "client/daemon_src/Makefile" in want and "client/daemon_src/main.c" in want and "client/daemon_src/runner.m" in want
  assert sorted(n for n in files if n.startswith("client/daemon_src/")) == want
  assert "client/local_build.py" in files and "client/run_site/sitecustomize.py" in files
  binaries = [n for n, data in files.items() if data.startswith(BINARY_MAGIC) or n.endswith((".o", ".a", ".so", ".dylib"))]
  assert not binaries, f"binaries in the wheel: {binaries}"

# *** a program with no runner named, in a fresh venv outside the clone

def test_run_builds_the_runner_once_into_the_user_cache(venv, tmp_path):
  home = tmp_path / "home"
  cache = home / ".cache"   # no XDG_CACHE_HOME: ~/.cache
  r = run_program(venv, home, tmp_path / "work")
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  device, result, exe = r.stdout.split()
  assert (device, result) == ("REMOTE", "54.0"), r.stdout
  exe = pathlib.Path(exe)
  assert exe.parent.parent == cache / "metal_runner" and KEY.fullmatch(exe.parent.name) and exe.name == "metal_runner", exe
  assert "building the local runner once" in r.stderr, r.stderr
  # only the finished binary is kept: no temporary build folder, no objects
  assert cache_entries(cache) == [exe.parent.name] and os.listdir(exe.parent) == ["metal_runner"]
  assert_no_runner_left(tmp_path)
  built = exe.stat()

  # the second run starts the same binary and builds nothing
  r = run_program(venv, home, tmp_path / "work")
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  assert r.stdout.split() == ["REMOTE", "54.0", str(exe)] and "building" not in r.stderr, r.stdout + r.stderr
  assert (exe.stat().st_ino, exe.stat().st_mtime_ns) == (built.st_ino, built.st_mtime_ns)
  assert_no_runner_left(tmp_path)

  # changed sources (another version installed) never start the build of the old ones: a build of their own, beside it
  main_c = site_client(venv) / "daemon_src" / "main.c"
  text = main_c.read_text()
  try:
    main_c.write_text(text + "/* changed by test_pip_install */\n")
    r = run_program(venv, home, tmp_path / "work")
  finally: main_c.write_text(text)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  new = pathlib.Path(r.stdout.split()[2])
  assert new != exe and new.parent.parent == exe.parent.parent and "building the local runner once" in r.stderr, r.stdout + r.stderr
  assert cache_entries(cache) == sorted([exe.parent.name, new.parent.name]) and exe.stat().st_ino == built.st_ino
  assert_no_runner_left(tmp_path)

# MYSCRIPT, then the inode of the file its local runner runs (Linux): the binary it started, whatever the cache's path holds later
RACE_SCRIPT = MYSCRIPT + 'import os\nprint(os.stat(f"/proc/{rm.local_runners[0].pid}/exe").st_ino)\n'

def test_two_programs_starting_at_once_share_one_build(venv, tmp_path):
  """The link is slowed so that the second program starts while the first builds: one build runs (the compiler's log shows one link),
  the other program waits for it, and both programs' runners run the one binary kept."""
  slow_cc, links = tmp_path / "slowcc", tmp_path / "links"
  slow_cc.write_text(f'#!/bin/sh\ncase " $* " in *" -o metal_runner "*) echo start >> {links}; sleep 3; cc "$@"; rc=$?; echo end >> {links}; '
                     'exit $rc;; esac\nexec cc "$@"\n')
  slow_cc.chmod(0o755)
  env = dict(XDG_CACHE_HOME=str(tmp_path / "xdg"), MAKEFLAGS=f"CC={slow_cc}")   # make's alone: tinygrad compiles kernels with $CC
  procs = []
  for i in range(2):
    (w:=tmp_path / f"work{i}").mkdir()
    (w / "myscript.py").write_text(RACE_SCRIPT)
    procs.append(subprocess.Popen(["sh", "-c", IN_YOUR_ENV[1]], cwd=w, env=user_env(venv, tmp_path / "home", **env),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs): assert p.returncode == 0, out + err[-3000:]
  assert links.read_text().split() == ["start", "end"], links.read_text()   # one build
  said = sorted("building the local runner once" in err for _, err in outs)
  assert said == [False, True] and any("waiting for another program's build" in err for _, err in outs), [e[-500:] for _, e in outs]
  assert all(out.split()[:2] == ["REMOTE", "54.0"] for out, _ in outs), outs
  (key,) = cache_entries(tmp_path / "xdg")   # one build kept, no temporary folder left
  exe = tmp_path / "xdg" / "metal_runner" / key / "metal_runner"
  assert {out.split()[2] for out, _ in outs} == {str(exe)}, outs
  # the path is the sources' hash either way: the inodes say both ran the one binary kept (the loser's never replaced it)
  assert [int(out.split()[3]) for out, _ in outs] == [exe.stat().st_ino] * 2, (outs, exe.stat().st_ino)
  assert_no_runner_left(tmp_path)

# *** a build that fails says why

def test_a_failing_build_shows_the_compilers_output(venv, tmp_path):
  bad_cc = tmp_path / "badcc"
  bad_cc.write_text('#!/bin/sh\necho "badcc: this compiler fails on purpose (test_pip_install)" >&2\nexit 1\n')
  bad_cc.chmod(0o755)
  xdg = tmp_path / "xdg"
  r = run_program(venv, tmp_path / "home", tmp_path / "work", XDG_CACHE_HOME=str(xdg), CC=str(bad_cc))
  assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
  assert re.search(r"^metal_runner: no runner address in METAL_RUNNER and building \S+/metal_runner failed \(make exited with 2\):$",
                   r.stderr, re.M), r.stderr
  assert "badcc: this compiler fails on purpose (test_pip_install)" in r.stderr, r.stderr
  hint = "xcode-select --install" if sys.platform == "darwin" else "sudo apt-get install clang make"
  assert hint in r.stderr.rstrip().splitlines()[-1], r.stderr   # what to install, last
  assert "Traceback" not in r.stderr and cache_entries(xdg) == [], "a failed build must leave nothing to be used later"

def test_no_make_says_what_to_install(venv, tmp_path):
  xdg = tmp_path / "xdg"
  (w:=tmp_path / "work").mkdir()
  (w / "myscript.py").write_text(MYSCRIPT)
  env = user_env(venv, tmp_path / "home", XDG_CACHE_HOME=str(xdg), PATH=str(venv / "bin"))   # the venv alone: no make, no cc
  r = subprocess.run([str(venv / "bin" / "python"), "-m", "client", "run", "myscript.py"], cwd=w, env=env, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
  assert "failed: cannot run make: [Errno 2] No such file or directory: 'make'" in r.stderr, r.stderr
  assert "the build needs a C compiler and make" in r.stderr.splitlines()[-1], r.stderr
  assert cache_entries(xdg) == []
