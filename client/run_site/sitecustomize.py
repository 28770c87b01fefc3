# sitecustomize.py: on PYTHONPATH in `python -m client run` (client/run.py), so that each Python process the program starts
# (multiprocessing spawn and forkserver, tinygrad's BEAM workers, a subprocess) has the runner's devices, as the program has. They reach
# the same runner: client run puts METAL_RUNNER, METAL_RUNNER_TOKEN_FILE and DEV in the environment, and with DEV set the import
# connects to nothing until a device is used. Python imports the first sitecustomize on sys.path only: the one this shadows runs too.
# PROFILE=1 and VIZ=1 are the program's: tinygrad writes $TMPDIR/profile.pkl.$USER (and VIZ's rewrites.pkl) at exit in every process
# that imported it, and a child (multiprocessing's resource tracker, a spawned worker) exits after the program and would overwrite the
# program's profile with its own empty one. So a child runs with them off, before it imports tinygrad (its ContextVars read them then).
import importlib.machinery, importlib.util, os, sys

def no_profile():
  if os.environ.get("METAL_RUNNER_CLIENT_RUN") != "1": return
  for var in ("PROFILE", "VIZ"): os.environ.pop(var, None)
  if os.environ.get("TRACK_MATCH_STATS", "0").strip() not in ("", "0", "1"): os.environ["TRACK_MATCH_STATS"] = "1"   # >=2 writes rewrites.pkl

def chain():
  here = os.path.dirname(os.path.abspath(__file__))
  spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != here])
  if spec is not None and spec.loader is not None:
    sys.modules["sitecustomize"] = mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

def install():
  if os.environ.get("METAL_RUNNER_CLIENT_RUN") != "1": return   # the directory stayed on a PYTHONPATH outside client run
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if root not in sys.path: sys.path.append(root)   # the client package, for a child that had it only through its parent's cwd
  try: import client.remote_metal  # noqa: F401
  except ModuleNotFoundError as e:
    if e.name != "tinygrad": raise   # another Python, without tinygrad: it cannot use the devices, and need not
    return
  from client.llm_kernels import install as stand_in_llm_kernels   # tinygrad.llm.kernels, where tinygrad lacks it (client/llm_kernels.py)
  stand_in_llm_kernels()

no_profile()
try: chain()
finally: install()
