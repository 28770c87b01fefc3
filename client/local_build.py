# local_build.py: the metal_runner binary a local runner starts from (no runner address given). From a clone, the clone's daemon/, built
# there with make as setup.sh does. Installed with pip, the wheel carries the daemon's sources and no binary (client/daemon_src, package
# data: pyproject.toml), built on first use into a per-user cache, $XDG_CACHE_HOME/metal_runner/<key>/metal_runner (~/.cache without it).
# The key hashes the sources, this OS and CPU: a build of other sources, or for another machine sharing the home directory, is never used.
# Built in a temporary folder and renamed into place, so a half-built binary is never seen; one build per key at a time (a lock file
# beside it): a second program starting meanwhile waits for that build and uses it.
from __future__ import annotations
import fcntl, hashlib, os, pathlib, platform, shutil, subprocess, sys, tempfile
from client.errors import RunnerUnavailable

HERE = pathlib.Path(__file__).resolve().parent
PACKAGED = HERE / "daemon_src"           # in an installed wheel only
CLONE = HERE.parent / "daemon"           # in a clone (and an editable install of it)
SOURCES = ("*.c", "*.h", "*.m", "Makefile")   # what the default build reads; pyproject.toml ships the same set

def hint() -> str:
  if sys.platform == "darwin": return "the build needs a C compiler and make: run xcode-select --install (the Xcode command line tools)"
  return "the build needs a C compiler and make (Debian: sudo apt-get install clang make)"

def make(d:pathlib.Path, exe:pathlib.Path, jobs:int=1):
  """make -C d metal_runner; RunnerUnavailable with the end of make's output and what to install if it fails."""
  head = f"metal_runner: no runner address in METAL_RUNNER and building {exe} failed"
  try: r = subprocess.run(["make", "-s", "-C", str(d), f"-j{jobs}", "metal_runner"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  except OSError as e: raise RunnerUnavailable(f"{head}: cannot run make: {e}\n{hint()}") from None
  if r.returncode != 0 or not (d / "metal_runner").is_file():
    raise RunnerUnavailable(f"{head} (make exited with {r.returncode}):\n{r.stdout.strip()[-3000:]}\n{hint()}")

def cache_dir() -> pathlib.Path:
  xdg = os.environ.get("XDG_CACHE_HOME", "")
  return (pathlib.Path(xdg) if os.path.isabs(xdg) else pathlib.Path.home() / ".cache") / "metal_runner"

def read_sources(d:pathlib.Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for pat in SOURCES for p in sorted(d.glob(pat)) if p.is_file()}

def source_key(srcs:dict[str, bytes]) -> str:
  h = hashlib.sha256(f"{platform.system()} {platform.machine()}\0".encode())
  for name in sorted(srcs): h.update(b"%s\0%d\0%s" % (name.encode(), len(srcs[name]), srcs[name]))
  return h.hexdigest()

def cached_build(src:pathlib.Path, cache:pathlib.Path) -> pathlib.Path:
  """cache/<key>/metal_runner for the sources in src, built once. The build is of the bytes hashed, copied out first: it never mixes
  sources changed meanwhile, nor needs write access to site-packages."""
  srcs = read_sources(src)
  if "Makefile" not in srcs: raise RunnerUnavailable(f"metal_runner: no runner address in METAL_RUNNER and no daemon sources in {src}")
  dest = cache / source_key(srcs)
  if (exe:=dest / "metal_runner").is_file() and os.access(exe, os.X_OK): return exe
  cache.mkdir(parents=True, exist_ok=True)
  with open(cache / f".{dest.name}.lock", "w") as lock:   # one build of a key at a time; released when the file closes, or the process ends
    try: fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      print(f"metal_runner: waiting for another program's build of the local runner, into {dest}", file=sys.stderr, flush=True)
      fcntl.flock(lock, fcntl.LOCK_EX)
    if exe.is_file() and os.access(exe, os.X_OK): return exe   # built meanwhile
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
      (tmp / "src").mkdir()
      for name, data in srcs.items(): (tmp / "src" / name).write_bytes(data)
      print(f"metal_runner: building the local runner once, into {dest}", file=sys.stderr, flush=True)
      make(tmp / "src", exe, jobs=min(os.cpu_count() or 1, 8))
      (tmp / "out").mkdir()
      os.rename(tmp / "src" / "metal_runner", tmp / "out" / "metal_runner")
      os.rename(tmp / "out", dest)
    finally: shutil.rmtree(tmp, ignore_errors=True)
  return exe

def runner_exe() -> pathlib.Path:
  """The binary for a local runner: the packaged sources' cached build, or the clone's daemon/metal_runner (made if missing)."""
  if PACKAGED.is_dir():
    try: return cached_build(PACKAGED, cache_dir())
    except OSError as e: raise RunnerUnavailable(f"metal_runner: no runner address in METAL_RUNNER and the runner's build cache failed: {e}") from e
  if not (exe:=CLONE / "metal_runner").exists(): make(CLONE, exe)
  return exe
