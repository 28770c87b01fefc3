# sitecustomize.py: on PYTHONPATH in `python -m client run` (client/run.py), so that each Python process the program starts
# (multiprocessing spawn and forkserver, tinygrad's BEAM workers, a subprocess) has the runner's devices, as the program has. They reach
# the same runner: client run puts METAL_RUNNER, METAL_RUNNER_TOKEN_FILE and DEV in the environment, and with DEV set the import
# connects to nothing until a device is used. Python imports the first sitecustomize on sys.path only: the one this shadows runs too.
import importlib.machinery, importlib.util, os, sys

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

try: chain()
finally: install()
