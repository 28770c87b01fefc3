"""python -m client run [--runner ADDR[,ADDR...]] [--token-file F] (SCRIPT | -m MODULE) [ARGS...]: a tinygrad program on a runner, unchanged.

Installs the runner's devices (client/remote_metal.py), makes the runner's device tinygrad's default (METAL for a Metal runner, REMOTE
for a CPU one) unless DEV is set, then runs the program as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would: as __main__, with
its sys.argv, its exit code, its own traceback and Ctrl-C as a KeyboardInterrupt in it. Child Python processes it starts (multiprocessing
spawn and forkserver, tinygrad's BEAM workers, a subprocess) have the devices too and use the same runner (run_site/sitecustomize.py).
--runner sets METAL_RUNNER and --token-file METAL_RUNNER_TOKEN_FILE for the program and its children (one token file for every runner, or
one per --runner address, comma-separated in the same order; neither given nor set: ~/.metal_runner_token if it exists); with neither
--runner nor METAL_RUNNER, a local runner is started once and stopped at exit. A runner that cannot be used stops the program before it starts, with
one line that names it and says why (exit code 1): the program never runs on another device instead. Every runner named is checked
before the program starts. SIGTERM and SIGHUP end the program as Ctrl-C does, its sessions with it, then as the signal would. With several
runners, -m tinygrad.llm puts the model over all of them. Its --serve listens on 127.0.0.1 unless --listen ADDR says otherwise (0.0.0.0:
every interface), and with --api-key-file F answers only requests with that key (Authorization: Bearer, the openai client's api_key=). More: docs/client-run.md in the metal_runner repository (not installed by pip).
"""
from __future__ import annotations
import importlib.machinery, importlib.util, io, os, pathlib, runpy, sys, types, zipfile
from .errors import RunnerUnavailable, TokenFileError
from .settings import CLIENT_RUN, apply_options, read_token

USAGE = "usage: {prog} [--runner ADDR[,ADDR...]] [--token-file F] [--listen ADDR] [--api-key-file F] (SCRIPT | -m MODULE) [ARGS...]"
SITE = pathlib.Path(__file__).resolve().parent / "run_site"   # holds the sitecustomize.py that child processes import
MARKER = CLIENT_RUN                                           # set for the program: that sitecustomize installs the devices only then

class Usage(Exception): pass   # a mistyped command line: the usage line and what is wrong, exit code 2

def parse(argv:list[str]) -> tuple[dict[str, str], str|None, str, list[str]]|None:
  """(our options, "-m" or None, the script or module, the program's arguments); None for -h. As for python itself, our options end at
  the program: whatever follows it is the program's, even what looks like ours."""
  opts: dict[str, str] = {}
  i = 0
  while i < len(argv):
    a = argv[i]
    if a in ("-h", "--help"): return None
    if a.startswith("-m"):   # -m MODULE or -mMODULE
      if not (mod:=a[2:] or (argv[i + 1] if i + 1 < len(argv) else "")): raise Usage("-m needs a module")
      return opts, "-m", mod, argv[i + (1 if a[2:] else 2):]
    name, eq, val = a.partition("=")
    if name in ("--runner", "--token-file", "--listen", "--api-key-file"):
      if not eq:
        if i + 1 >= len(argv): raise Usage(f"{name} needs a value")
        i, val = i + 1, argv[i + 1]
      opts[name], i = val, i + 1
    elif a == "--":
      if i + 1 < len(argv): return opts, None, argv[i + 1], argv[i + 2:]
      break
    elif a.startswith("-"): raise Usage(f"unknown option {a} (-h for help)")
    else: return opts, None, a, argv[i + 1:]
  raise Usage("no program given")

def program_frames(tb:types.TracebackType|None) -> types.TracebackType|None:
  """The traceback without its outer frames in this module, client/__main__.py and runpy: the program's own, as python would show it."""
  ours = {__file__, str(pathlib.Path(__file__).with_name("__main__.py")), runpy.__file__, "<frozen runpy>"}
  while tb is not None and tb.tb_frame.f_code.co_filename in ours: tb = tb.tb_next
  return tb

def show_programs_frames(prev):
  def hook(t, e, tb):
    tb = program_frames(tb)
    prev(t, e.with_traceback(tb) if isinstance(e, BaseException) else e, tb)   # python prints the exception's own __traceback__
  return hook

def run_file(path:str):
  """As python runs a script: a fresh __main__ that stays __main__ (multiprocessing's spawn finds the script through it), the script's
  directory first on sys.path, __file__ absolute and sys.argv[0] as given. A directory or zip file with a __main__.py goes through runpy."""
  if os.path.isdir(path) or not path.endswith(".py") and zipfile.is_zipfile(path): return runpy.run_path(path, run_name="__main__")
  full = os.path.abspath(path)
  with io.open_code(full) as f: code = compile(f.read(), full, "exec", dont_inherit=True)   # not this module's __future__ flags
  sys.path[0] = os.path.dirname(os.path.realpath(full))
  main = types.ModuleType("__main__")
  main.__dict__.update(__file__=full, __cached__=None, __loader__=importlib.machinery.SourceFileLoader("__main__", full))
  sys.modules["__main__"] = main
  exec(code, main.__dict__)

def setup_children():
  """Child Python processes import SITE's sitecustomize.py, which installs the devices while MARKER is set; METAL_RUNNER, the token file
  and DEV reach them through the environment, so they use the same runner and the same default device."""
  os.environ[MARKER] = "1"
  os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE)] + ([p] if (p:=os.environ.get("PYTHONPATH")) else []))

def main(argv:list[str], prog:str="python -m client run") -> int:
  try: parsed = parse(argv)
  except Usage as e:
    print(f"{USAGE.format(prog=prog)}\n{prog}: {e}", file=sys.stderr)
    return 2
  if parsed is None:
    print(__doc__.replace("python -m client run", prog, 1))
    return 0
  opts, flag, target, args = parsed
  serves = flag == "-m" and target == "tinygrad.llm"
  if not serves and (given:=[o for o in ("--listen", "--api-key-file") if o in opts]):
    print(f"{USAGE.format(prog=prog)}\n{prog}: {' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to -m tinygrad.llm --serve only",
          file=sys.stderr)
    return 2
  if flag is None and not os.path.exists(target):   # python's own wording and exit code
    print(f"{prog}: can't open file {os.path.abspath(target)!r}: [Errno 2] No such file or directory", file=sys.stderr)
    return 2
  apply_options(opts)   # --runner and --token-file as METAL_RUNNER and METAL_RUNNER_TOKEN_FILE, which messages name as typed (client/settings.py)
  setup_children()
  try:
    import client.remote_metal as rm   # with METAL_RUNNER set and DEV unset, connects and makes the runner's device the default
    if not rm.runner_addrs():          # no runner named: one local runner for the program and its children, stopped at exit
      os.environ["METAL_RUNNER"] = rm.start_local_runner("metal" if sys.platform == "darwin" else "cpu")
      rm.use_runner_by_default()
  except RunnerUnavailable as e:   # before the program starts: it never runs on another device instead
    print(e, file=sys.stderr)
    return 1
  stand_in_llm_kernels()
  if serves:
    from .llm_access import guard
    try: key = read_token(opts["--api-key-file"], "--api-key-file") if "--api-key-file" in opts else None
    except TokenFileError as e:
      print(f"{prog}: {e}", file=sys.stderr)
      return 1
    guard(opts.get("--listen", "127.0.0.1"), key)
    place_over_runners()
  # -m a.b imports the package a to find b: only now, so that the package's own code finds the devices installed
  if flag == "-m" and not importable(target):
    print(f"{prog}: No module named {target}", file=sys.stderr)
    return 1
  sys.excepthook = show_programs_frames(sys.excepthook)
  sys.argv = [target, *args]
  if flag == "-m" and target == "tinygrad.device": list_devices()
  elif flag == "-m": runpy.run_module(target, run_name="__main__", alter_sys=True)   # sys.argv[0] becomes the module's file, as with python -m
  else: run_file(target)
  return 0

def stand_in_llm_kernels():
  """tinygrad.llm (python -m tinygrad.llm, its Transformer) needs tinygrad.llm.kernels, missing from tinygrad 0.14.0's wheel: a stand-in
  while it is (client/llm_kernels.py), in the program as in its children (run_site/sitecustomize.py)."""
  from .llm_kernels import install
  install()

PLACEMENTS = ("", "memory", "tp", "one")   # METAL_RUNNER_PLACEMENT: by memory and speed (unset), by memory alone, tensor parallel, the first runner
                                           # alone as tinygrad loads it

def place_over_runners():
  """tinygrad.llm over the runners named: its model over all of them, a range of blocks each (client/placement.py), tensor parallel
  (METAL_RUNNER_PLACEMENT=tp, client/placement_tp.py), or on the first alone as tinygrad loads it (=one). One runner gets the whole
  model the first way too: only its tensors' bytes (tinygrad 0.14 first copies the whole file to the device), and its server keeps
  going when the runner is lost and comes back (client/llm_serve.py)."""
  from .discovery import runner_addrs
  if (how:=os.environ.get("METAL_RUNNER_PLACEMENT", "")) not in PLACEMENTS:
    raise RunnerUnavailable(f"metal_runner: METAL_RUNNER_PLACEMENT={how} is not a placement: memory, tp, one, or unset (by memory and speed)")
  addrs = runner_addrs()
  if how == "one":
    if len(addrs) > 1:
      print(f"metal_runner: the model on the first runner alone, {addrs[0]} (METAL_RUNNER_PLACEMENT=one); unused: {', '.join(addrs[1:])}",
            file=sys.stderr)
  elif how == "tp" and len(addrs) > 1:
    from .placement_tp import across_runners_tp
    across_runners_tp()
  else:
    from .placement import across_runners
    across_runners()

def list_devices():
  """`-m tinygrad.device`, tinygrad's list of its devices, with the runner's. Run by runpy, tinygrad/device.py would be a second copy of
  the module (the one imported has the devices installed) listing its own ALL_DEVICES, which names METAL but not REMOTE: so the listing
  runs in the imported module, with REMOTE next to METAL, and tinygrad marks the default device (the runner's, unless DEV is set)."""
  import tinygrad.device as td
  sys.argv[0] = td.__file__
  if "REMOTE" not in td.ALL_DEVICES: td.ALL_DEVICES.insert(td.ALL_DEVICES.index("METAL") + 1, "REMOTE")
  for s in td.enumerate_devices_str(): print(s)

def importable(name:str) -> bool:
  try: return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError): return False
