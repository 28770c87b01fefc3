"""python -m client run (client/run.py), and `import client.remote_metal` with METAL_RUNNER set, against real runners.

A program written for plain tinygrad runs on a runner unchanged, as `python SCRIPT` (or `python -m MODULE`) would run it: sys.argv,
__main__, exit code, its own traceback, Ctrl-C, and child processes (multiprocessing spawn and forkserver, tinygrad's BEAM workers) on
the same runner. A runner that is named but cannot be used (a host that does not resolve, a dead port, a refused or missing token)
stops the program with one line naming it and a non-zero exit, before the program computes anything: never on the local CPU instead.
Every program runs in its own python; runners listen on 127.0.0.1 and are stopped by pid (tests/runner_proc.py).
"""
import getpass, json, os, re, signal, socket, subprocess, sys, textwrap, time
import pytest
from runner_proc import ROOT, RunnerProc, runner

pytestmark = pytest.mark.cpu_only
TOKEN = b"client run test token"
# what the tests set themselves; anything else of the environment passes through, as for any program (METAL_RUNNER_TOKEN_FILE set and
# empty by conftest.py: no token, not even the developer's ~/.metal_runner_token, unless a test names one)
OWN_VARS = ("DEV", "DEBUG", "BEAM", "PARALLEL", "METAL_RUNNER", "METAL_RUNNER_CLIENT_RUN")

# a training script for plain tinygrad: it names no device, no runner, nothing of this project
TRAIN = """
from tinygrad import Device, Tensor, nn
from tinygrad.helpers import Context
print("default device:", Device.DEFAULT, flush=True)
Tensor.manual_seed(0)
x = Tensor.randn(64, 4)
y = (x[:, 0:1] > x[:, 1:2]).float()
model = nn.Linear(4, 1)
opt = nn.optim.SGD(nn.state.get_parameters(model), lr=2.0)
losses = []
with Context(TRAINING=1):
  for step in range(8):
    opt.zero_grad()
    loss = (model(x).sigmoid() - y).square().mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())
print("loss", losses[0], losses[-1])
"""

SCRIPTS = {
  "train.py": TRAIN,
  "tinytrain.py": "import json, sys\nprint(json.dumps({'argv': sys.argv, 'name': __name__}))\n" + TRAIN,
  # the same training in a program that installs the devices itself and leaves the device to METAL_RUNNER
  "import_train.py": "import client.remote_metal\n" + TRAIN,
  "argv.py": """
import json, sys
m = sys.modules["__main__"]
print(json.dumps({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0], "spec": repr(__spec__),
                  "main": m.__dict__ is globals(), "loader": type(__loader__).__name__, "doc": __doc__}))
""",
  "exits.py": "import sys\nprint('before exit', flush=True)\nsys.exit(7)\n",
  "boom.py": "def inner(): raise ValueError('the program\\'s own error')\ndef outer(): inner()\nprint('started', flush=True)\nouter()\n",
  "sleeps.py": "import time\nprint('ready', flush=True)\ntime.sleep(60)\n",
  # children made by fork after the device is open: one uses the device, one exits normally; then the parent computes again
  "forked.py": """
import json, multiprocessing, os, sys
from tinygrad import Device, Tensor
def work(n):
  try: return (Tensor([1.0, 2.0, 3.0]) * n).tolist()
  except Exception as e: return f"{type(e).__name__}: {e}"
if __name__ == "__main__":
  first = work(1)
  with multiprocessing.get_context("fork").Pool(1) as pool: child = pool.apply(work, (2,))
  if (pid := os.fork()) == 0: sys.exit(0)   # a child that leaves through sys.exit, running its atexit functions
  os.waitpid(pid, 0)
  print(json.dumps({"first": first, "child": child, "after": work(3)}))
""",
  # a fork pool's child whose first use of the runner is an allocation (a size the parent never used), its error left uncaught
  "forkalloc.py": """
import multiprocessing
from tinygrad import Tensor
def work(n): return (Tensor([1.0] * n) * n).tolist()
if __name__ == "__main__":
  print(work(2), flush=True)
  with multiprocessing.get_context("fork").Pool(1) as pool: print(pool.apply(work, (5,)))
""",
  # tensors built and dropped without end, so that finalizers (UOp.__del__) run all the time; each Ctrl-C is caught and counted
  "churn.py": """
from tinygrad import Tensor
caught = 0
print("ready", flush=True)
while True:
  try:
    while True:
      for i in range(50): y = (Tensor.ones(8) * i + caught).contiguous().sum()
  except KeyboardInterrupt:
    caught += 1
    print(caught, flush=True)
""",
  # the local runner's pid, once the default device is open, then a long sleep
  "local_pid.py": "import time, client.remote_metal as rm\nfrom tinygrad import Device\nDevice[Device.DEFAULT]\n"
                  "print(rm.local_runners[0].pid, flush=True)\ntime.sleep(60)\n",
  # a session holding a buffer of the runner's memory, then a long sleep
  "holds.py": "import time, client.remote_metal\nfrom tinygrad import Tensor\nx = Tensor.ones(1 << 18).contiguous().realize()\n"
              "print('ready', flush=True)\ntime.sleep(60)\n",
  # BEAM with tinygrad's pool of spawned compile workers; they report whether they have the runner's devices
  "beam.py": """
import numpy as np
from tinygrad import Tensor
from tinygrad.helpers import Context
from tinygrad.engine import worker
a, b = np.random.default_rng(0).random((16, 16), dtype=np.float32), np.random.default_rng(1).random((16, 16), dtype=np.float32)
with Context(BEAM=2, CACHELEVEL=0): out = (Tensor(a) @ Tensor(b)).numpy()
pool = worker.worker_pool
print("error", float(np.abs(out - a @ b).max()))
print("workers", pool is not None and pool.apply(eval, ("'tinygrad.runtime.ops_remote' in __import__('sys').modules",)))
""",
  # a child process started with multiprocessing spawn or forkserver that computes on the default device
  "children.py": """
import json, multiprocessing, os, sys
from tinygrad import Device, Tensor
def work(n):
  return {"x": (Tensor([1.0, 2.0, 3.0]) * n).tolist(), "dev": Device.DEFAULT, "addr": Device[Device.DEFAULT].runner.addr, "pid": os.getpid()}
if __name__ == "__main__":
  mine = work(1)
  with multiprocessing.get_context(sys.argv[1]).Pool(1) as pool: child = pool.apply(work, (2,))
  print(json.dumps({"parent": mine, "child": child, "METAL_RUNNER": os.environ["METAL_RUNNER"]}))
""",
}

@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
  d = tmp_path_factory.mktemp("programs")
  for name, text in SCRIPTS.items(): (d / name).write_text(textwrap.dedent(text).lstrip())
  return d

def python(*argv:str, env:dict|None=None, cwd=None, timeout:float=120) -> subprocess.CompletedProcess:
  """argv in a python of its own; env adds to the environment, a value of None unsets the variable."""
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  e.update({"PYTHONPATH": str(ROOT), **(env or {})})
  return subprocess.run([sys.executable, *argv], env={k: v for k, v in e.items() if v is not None}, cwd=cwd, capture_output=True, text=True,
                        timeout=timeout)

def client_run(*args:str, **kw) -> subprocess.CompletedProcess: return python("-m", "client", "run", *args, **kw)

@pytest.fixture
def logged():
  """A runner of its own for one test, logging every program it loads (-vv): the proof that kernels ran there."""
  with runner("-vv") as r: yield r

def loaded(r:RunnerProc) -> list[str]: return re.findall(r"session \d+: loaded (\S+)", r.log_text())

@pytest.fixture(scope="module")
def shared():
  with runner() as r: yield r

@pytest.fixture(scope="module")
def authed(tmp_path_factory):
  d = tmp_path_factory.mktemp("token")
  (d / "token").write_bytes(TOKEN + b"\n")
  (d / "wrong").write_bytes(b"not the token\n")
  for f in ("token", "wrong"): (d / f).chmod(0o600)   # the runner and the client refuse a token others can read
  with runner("--token-file", str(d / "token")) as r:
    r.token, r.wrong, r.missing = d / "token", d / "wrong", d / "missing"
    yield r

def trained(p:subprocess.CompletedProcess, device:str):
  assert p.returncode == 0, (p.stdout, p.stderr[-3000:])
  assert f"default device: {device}" in p.stdout, p.stdout
  first, last = map(float, p.stdout.split("loss ")[1].split())
  assert last < first, p.stdout

# *** the program runs on the runner

def test_training_script_runs_on_the_runner(scripts, logged):
  trained(client_run("--runner", logged.addr, str(scripts / "train.py")), "REMOTE")
  assert len(loaded(logged)) >= 5, logged.log_text()   # its forward, backward and optimizer kernels ran there

def test_import_with_metal_runner_makes_the_runner_the_default(scripts, logged):
  # a program that installs the devices itself: with METAL_RUNNER set and DEV unset, the runner is the default, not tinygrad's CPU
  trained(python(str(scripts / "import_train.py"), env={"METAL_RUNNER": logged.addr}), "REMOTE")
  assert len(loaded(logged)) >= 5, logged.log_text()

def test_token_file(scripts, authed):
  trained(client_run("--runner", authed.addr, "--token-file", str(authed.token), str(scripts / "train.py")), "REMOTE")

def test_the_token_in_home_is_used_when_none_is_named(scripts, authed, tmp_path):
  # as ssh takes ~/.ssh/id_*: the README has the token saved there, and neither --token-file nor METAL_RUNNER_TOKEN_FILE is needed
  (tmp_path / ".metal_runner_token").write_bytes(authed.token.read_bytes())
  (tmp_path / ".metal_runner_token").chmod(0o600)
  home = {"HOME": str(tmp_path), "METAL_RUNNER_TOKEN_FILE": None}
  trained(client_run("--runner", authed.addr, str(scripts / "train.py"), env=home), "REMOTE")
  trained(python(str(scripts / "import_train.py"), env={"METAL_RUNNER": authed.addr, **home}), "REMOTE")
  (tmp_path / ".metal_runner_token").chmod(0o644)   # as ssh refuses such a key
  stopped(client_run("--runner", authed.addr, str(scripts / "train.py"), env=home), authed.addr,
          f"the token file {tmp_path}/.metal_runner_token (used when no token file is named) is open to group or others (mode 0644), as a "
          f"secret must not be: chmod 600 {tmp_path}/.metal_runner_token")

def test_a_token_file_per_runner(scripts, authed, tmp_path):
  # two runners, two secrets: --token-file takes one file per --runner address, in the same order
  (tf2 := tmp_path / "token2").write_bytes(b"the second runner's token\n")
  tf2.chmod(0o600)
  two = "from tinygrad import Tensor\nprint('sum', (Tensor([1.0, 2.0]) + Tensor([3.0, 4.0], device='REMOTE:1').to('REMOTE')).tolist())\n"
  (tmp_path / "two.py").write_text(two)
  (tmp_path / "import_two.py").write_text("import client.remote_metal\n" + two)
  with runner("--token-file", str(tf2)) as r2:
    addrs, files = f"{authed.addr},{r2.addr}", f"{authed.token},{tf2}"
    p = client_run("--runner", addrs, "--token-file", files, str(tmp_path / "two.py"))
    assert p.returncode == 0 and "sum [4.0, 6.0]" in p.stdout, (p.stdout, p.stderr[-3000:])
    p = python(str(tmp_path / "import_two.py"), env={"METAL_RUNNER": addrs, "METAL_RUNNER_TOKEN_FILE": files})
    assert p.returncode == 0 and "sum [4.0, 6.0]" in p.stdout, (p.stdout, p.stderr[-3000:])
    # ~ after the comma, which the shell leaves as it is: the home directory all the same
    p = client_run("--runner", addrs, "--token-file", f"{authed.token},~/token2", str(tmp_path / "two.py"), env={"HOME": str(tmp_path)})
    assert p.returncode == 0 and "sum [4.0, 6.0]" in p.stdout, (p.stdout, p.stderr[-3000:])
    # one file serves every runner; the wrong one for the second is refused, naming the file and the option
    p = client_run("--runner", addrs, "--token-file", str(authed.token), str(tmp_path / "two.py"))
    stopped(p, r2.addr, f"the runner refused the token from --token-file {authed.token}", ("METAL_RUNNER",))
    p = client_run("--runner", addrs, "--token-file", f"{files},{tf2}", str(tmp_path / "two.py"))
    stopped(p, "", f"--token-file {files},{tf2} names 3 token files, one per runner, but --runner {addrs} names 2 runner addresses",
            ("METAL_RUNNER",))

def test_an_index_without_a_runner_names_what_the_user_typed(tmp_path, shared):
  (tmp_path / "shard.py").write_text(shard := "from tinygrad import Tensor\nprint(Tensor([1.0], device='REMOTE:1').tolist())\n")
  (tmp_path / "import_shard.py").write_text("import client.remote_metal\n" + shard)
  stopped(client_run("--runner", shared.addr, str(tmp_path / "shard.py")), "", f"REMOTE:1: --runner {shared.addr} has no runner for index 1",
          ("METAL_RUNNER",))
  stopped(python(str(tmp_path / "import_shard.py"), env={"METAL_RUNNER": shared.addr}), "",
          f"REMOTE:1: METAL_RUNNER={shared.addr} has no runner for index 1", ("--runner",))

def test_dev_given_is_kept(scripts, shared):
  trained(client_run("--runner", shared.addr, str(scripts / "train.py"), env={"DEV": "CPU"}), "CPU")

def test_module_with_m(scripts, logged):
  p = client_run("--runner", logged.addr, "-m", "tinytrain", "first", "--runner", "x", cwd=scripts)
  trained(p, "REMOTE")
  assert len(loaded(logged)) >= 5, logged.log_text()
  # as python -m sets them: argv[0] the module's file, the arguments after the module the program's, even one that looks like ours
  assert json.loads(p.stdout.splitlines()[0]) == {"argv": [str(scripts / "tinytrain.py"), "first", "--runner", "x"], "name": "__main__"}

def devices_listed(p:subprocess.CompletedProcess) -> dict[str, tuple[str, str]]:
  """python -m tinygrad.device's lines, "* CPU     : PASS" with '*' on the default device: {device: (mark, the rest)}."""
  assert p.returncode == 0, (p.stdout, p.stderr[-3000:])
  return {m[2]: (m[1], m[3]) for line in re.sub(r"\x1b\[[0-9;]*m", "", p.stdout).splitlines() if (m:=re.match(r"([* ]) (\w+)\s*: (.*)", line))}

def test_tinygrads_device_list_shows_the_runner_as_the_default(shared):
  listed = devices_listed(client_run("--runner", shared.addr, "-m", "tinygrad.device"))
  assert listed["REMOTE"] == ("*", "PASS"), listed   # a CPU runner: REMOTE, tinygrad's default
  assert [d for d, (mark, _) in listed.items() if mark == "*"] == ["REMOTE"], listed
  assert listed["CPU"] == (" ", "PASS") and "(use REMOTE for it)" in listed["METAL"][1], listed   # tinygrad's own devices as before
  listed = devices_listed(client_run("--runner", shared.addr, "-m", "tinygrad.device", env={"DEV": "CPU"}))   # DEV given: the user's default
  assert listed["CPU"][0] == "*" and listed["REMOTE"] == (" ", "PASS"), listed

def test_beam_with_spawned_workers(scripts, logged):
  p = client_run("--runner", logged.addr, str(scripts / "beam.py"), env={"PARALLEL": "2", "BEAM_STRICT_MODE": "1"})
  assert p.returncode == 0, p.stderr[-3000:]
  assert "workers True" in p.stdout and float(p.stdout.split("error ")[1].split()[0]) < 1e-4, p.stdout
  assert loaded(logged).count("test") >= 5, logged.log_text()   # BEAM's candidates ("test"), compiled by the workers, timed on the runner

@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_children_use_the_same_local_runner(scripts, method):
  # no runner named: one local runner, started once, for the program and its children; stopped at exit
  p = client_run(str(scripts / "children.py"), method)
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout.splitlines()[-1])
  parent, child, addr = out["parent"], out["child"], out["METAL_RUNNER"]
  assert parent["x"] == [1.0, 2.0, 3.0] and child["x"] == [2.0, 4.0, 6.0] and parent["pid"] != child["pid"]
  assert parent["dev"] == child["dev"] == "REMOTE" and parent["addr"] == child["addr"] == addr and addr.startswith("127.0.0.1:")
  with pytest.raises(ConnectionRefusedError): socket.create_connection(("127.0.0.1", int(addr.rsplit(":", 1)[1])), timeout=5).close()

def test_a_child_python_keeps_its_own_sitecustomize(scripts, shared, tmp_path):
  # client run's sitecustomize shadows the one a child would import: that one runs too
  (tmp_path / "sitecustomize.py").write_text("import sys\nsys.own_site_ran = True\n")
  child = "import sys; print('tinygrad.runtime.ops_remote' in sys.modules, getattr(sys, 'own_site_ran', False))"
  (scripts / "subproc.py").write_text(f"import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', {child!r}]).returncode)\n")
  p = client_run("--runner", shared.addr, str(scripts / "subproc.py"), env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
  assert p.returncode == 0 and p.stdout == "True True\n0\n", (p.stdout, p.stderr)

# *** PROFILE=1 and VIZ=1: the program's profile, which no child overwrites

# plain tinygrad that starts a child python (multiprocessing spawn): the child computes too, and exits through atexit, where tinygrad
# writes its profile to the same $TMPDIR/profile.pkl.<user>
PROFILED = """
import multiprocessing
from tinygrad import Tensor
def child(): print("child", (Tensor([1.0, 2.0]) + 1).tolist(), flush=True)
if __name__ == "__main__":
  x = Tensor([[float(i * 8 + j) for j in range(8)] for i in range(8)])   # copied in: a kernel of constants alone runs on the CPU
  print("program", (x @ x).sum().item(), flush=True)
  (p := multiprocessing.get_context("spawn").Process(target=child)).start()
  p.join()
  print("exit code", p.exitcode, flush=True)
"""
# reads the file back as tinygrad's viewer does (tinygrad/viz/cli.py): its rows, or "empty profile"
VIEW = """
import json, sys
from tinygrad.viz import serve as viz
from tinygrad.viz.cli import decode_profile
events = viz.load_pickle(sys.argv[1], default=[])
data = viz.get_profile(viz.VizData(viz.load_pickle(sys.argv[2], default=viz.RewriteTrace([], [], {}))), events)
print(json.dumps(None if data is None else sorted(decode_profile(data)["layout"])))
"""

@pytest.mark.parametrize("var", ["PROFILE", "VIZ"])
def test_profile_through_client_run_holds_the_runners_rows(shared, tmp_path, var):
  (tmp_path / "profiled.py").write_text(PROFILED)
  (out := tmp_path / "out").mkdir()   # tinygrad's temp(): $TMPDIR/profile.pkl.<user>, of this test only
  p = client_run("--runner", shared.addr, str(tmp_path / "profiled.py"), env={"TMPDIR": str(out), "PROFILE": None, "VIZ": None, var: "1"})
  assert p.returncode == 0 and "program 529536.0" in p.stdout and "child [2.0, 3.0]" in p.stdout and "exit code 0" in p.stdout, \
    (p.stdout, p.stderr[-3000:])
  user = getpass.getuser()
  (tmp_path / "view.py").write_text(VIEW)
  v = python(str(tmp_path / "view.py"), str(out / f"profile.pkl.{user}"), str(out / f"rewrites.pkl.{user}"), env={"PROFILE": None, "VIZ": None})
  assert v.returncode == 0, v.stderr[-3000:]
  rows = json.loads(v.stdout)
  assert rows is not None, "empty profile: a child process overwrote the program's"
  assert "REMOTE" in rows and ({"REMOTE:NET", "REMOTE:COPY"} & set(rows)), rows

# *** as python SCRIPT would run it

def test_argv_and_main_as_python_sets_them(scripts, shared):
  args = ("a b", "--runner", "x", "-m", "y")   # the program's arguments, even those that look like ours
  p, plain = client_run("--runner", shared.addr, str(scripts / "argv.py"), *args), python(str(scripts / "argv.py"), *args)
  assert p.returncode == 0 and plain.returncode == 0, p.stderr
  assert json.loads(p.stdout) == json.loads(plain.stdout)
  assert json.loads(p.stdout)["argv"] == [str(scripts / "argv.py"), *args]
  rel = client_run("--runner", shared.addr, "argv.py", "z", cwd=scripts)   # a relative path: argv[0] as given, __file__ absolute
  assert json.loads(rel.stdout) == json.loads(python("argv.py", "z", cwd=scripts).stdout)

def test_exit_code(scripts, shared):
  p = client_run("--runner", shared.addr, str(scripts / "exits.py"))
  assert p.returncode == 7 and p.stdout == "before exit\n" and p.stderr == "", (p.stdout, p.stderr)

def test_exception_shows_the_programs_own_traceback(scripts, shared):
  p, plain = client_run("--runner", shared.addr, str(scripts / "boom.py")), python(str(scripts / "boom.py"))
  assert p.returncode == plain.returncode == 1 and p.stdout == "started\n"
  assert p.stderr == plain.stderr, p.stderr   # frames of boom.py only: none of client/run.py, runpy or client/__main__.py
  assert "in outer" in p.stderr and p.stderr.endswith("ValueError: the program's own error\n")

def interrupted(argv:list[str], cwd) -> tuple[int, str]:
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  p = subprocess.Popen([sys.executable, *argv], env={**e, "PYTHONPATH": str(ROOT)}, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  try:
    assert p.stdout.readline() == "ready\n"
    time.sleep(0.5)   # in its sleep, not still returning from print: the two tracebacks then show the same line
    os.kill(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=30)
  finally:
    if p.poll() is None: p.kill()
  return p.returncode, err

def test_every_ctrl_c_reaches_the_program_even_during_a_finalizer(scripts, shared):
  """A KeyboardInterrupt raised while a finalizer runs was printed as "Exception ignored" and dropped (about one Ctrl-C in ten): 50 at
  random points, each must reach the program's own except clause."""
  import random, select
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  p = subprocess.Popen([sys.executable, "-m", "client", "run", "--runner", shared.addr, "churn.py"], env={**e, "PYTHONPATH": str(ROOT)},
                       cwd=scripts, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert p.stdout.readline() == "ready\n", p.communicate(timeout=30)[1][-3000:]
    rng, lost = random.Random(0), 0
    for _ in range(50):
      time.sleep(rng.uniform(0.02, 0.2))
      os.kill(p.pid, signal.SIGINT)
      if select.select([p.stdout], [], [], 3)[0]: p.stdout.readline()
      else: lost += 1
  finally:
    p.kill()
    err = p.communicate(timeout=30)[1]
  assert lost == 0 and "Exception ignored" not in err, (lost, err[-3000:])

def test_ctrl_c_is_a_keyboard_interrupt_in_the_program(scripts, shared):
  code, err = interrupted(["-m", "client", "run", "--runner", shared.addr, "sleeps.py"], scripts)
  assert (code, err) == interrupted(["sleeps.py"], scripts), err
  assert code == -signal.SIGINT and err.endswith("KeyboardInterrupt\n") and "sleeps.py" in err and "run.py" not in err

@pytest.mark.parametrize("how", ["client run", "import"])
def test_a_terminated_program_stops_its_local_runner(scripts, how):
  # SIGTERM (a service manager, kill, a closed terminal's SIGHUP) skips atexit: the local runner must not outlive the program
  argv = ["-m", "client", "run", "local_pid.py"] if how == "client run" else ["local_pid.py"]
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  p = subprocess.Popen([sys.executable, *argv], env={**e, "PYTHONPATH": str(ROOT), **({"DEV": "REMOTE"} if how == "import" else {})},
                       cwd=scripts, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  pid = None
  try:
    pid = int(p.stdout.readline() or 0)
    assert pid, p.communicate(timeout=30)[1][-3000:]
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(timeout=30) == -signal.SIGTERM   # it still ends as SIGTERM ends a program
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline: time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), f"the local runner {pid} outlived the program"
  finally:
    if p.poll() is None: p.kill()
    p.wait()
    if pid and os.path.exists(f"/proc/{pid}"): os.kill(pid, signal.SIGKILL)

@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("how", ["client run", "import"])
def test_a_terminated_program_ends_its_sessions_at_once(scripts, how, sig):
  """kill, systemctl stop or docker stop: the program's sessions end on the runner at once, their memory freed, as on Ctrl-C, where they
  waited a minute for the client to resume; the program still ends as the signal ends it."""
  with runner() as r:
    argv = ["-m", "client", "run", "--runner", r.addr, "holds.py"] if how == "client run" else ["holds.py"]
    e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
    p = subprocess.Popen([sys.executable, *argv], env={**e, "PYTHONPATH": str(ROOT), **({"METAL_RUNNER": r.addr} if how == "import" else {})},
                         cwd=scripts, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
      assert p.stdout.readline() == "ready\n", p.communicate(timeout=30)[1][-3000:]
      os.kill(p.pid, getattr(signal, sig))
      assert p.wait(timeout=30) == -getattr(signal, sig), p.stderr.read()[-3000:]
      log = r.wait_log("session 1: ended: ", timeout=5)
    finally:
      if p.poll() is None: p.kill()
      p.wait()
  assert "waiting up to" not in log and "ended: the client disconnected" in log, log
  assert "Traceback" not in p.stderr.read()

SIGTERM_IN_A_WORKER = """
import multiprocessing, signal, sys
def default(_):
  import client.remote_metal   # as a tinygrad compile worker does, unpickling the renderer's compiler
  return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
if __name__ == "__main__":
  import client.remote_metal
  with multiprocessing.get_context(sys.argv[1]).Pool(1) as pool: print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, pool.map(default, [0]))
"""

@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
@pytest.mark.parametrize("how", ["import", "client run"])
def test_a_compile_worker_keeps_sigterms_default_so_the_pool_can_end_it(tmp_path, shared, how, method):
  """Pool.terminate() (at exit, after tinygrad compiled in parallel) SIGTERMs its workers and joins them: one that unwound instead of
  dying could leave the pool's queue lock taken and the program hung at exit (CI, test_cache_loads). The program itself unwinds. Under
  client run a spawned worker imports the client from sitecustomize, before multiprocessing calls it a child; a forked one inherits."""
  (tmp_path / "w.py").write_text(SIGTERM_IN_A_WORKER)
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  argv = ["-m", "client", "run", "--runner", shared.addr, "w.py"] if how == "client run" else ["w.py"]
  p = subprocess.run([sys.executable, *argv, method], cwd=tmp_path, env={**e, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                     timeout=120)
  assert (p.returncode, p.stdout) == (0, "False [True]\n"), p.stderr[-3000:]

METAL_CLIENT = os.path.join(os.path.dirname(sys.executable), "metal-client")   # the command setup.sh's pip install makes

def test_the_metal_client_command_runs_a_program_beside_a_client_py_of_the_users(shared, tmp_path):
  """`python -m client` in a folder with its own client.py runs that file; the command runs the program on the runner, and its usage
  names the command."""
  (tmp_path / "client.py").write_text("print('this is my own client.py')\n")
  (tmp_path / "prog.py").write_text("from tinygrad import Device, Tensor\nprint(Device.DEFAULT, (Tensor([1.0, 2.0]) + 1).tolist())\n")
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS and k != "PYTHONPATH"}
  p = subprocess.run([METAL_CLIENT, "run", "--runner", shared.addr, "prog.py"], cwd=tmp_path, env=e, capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0 and p.stdout == "REMOTE [2.0, 3.0]\n", (p.stdout, p.stderr[-2000:])
  p = subprocess.run([sys.executable, "-m", "client", "run", "--runner", shared.addr, "prog.py"], cwd=tmp_path, env=e, capture_output=True,
                     text=True, timeout=120)
  assert p.stdout == "this is my own client.py\n", (p.stdout, p.stderr)   # why the command: python -m finds the folder's client first
  p = subprocess.run([METAL_CLIENT, "run", "--nope"], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=60)
  assert p.returncode == 2 and p.stderr.startswith("usage: metal-client run ") and "metal-client run: unknown option --nope" in p.stderr

def test_the_metal_client_command_says_when_client_is_another_package(tmp_path):
  (tmp_path / "client").mkdir()
  (tmp_path / "client" / "__init__.py").write_text("")
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  p = subprocess.run([METAL_CLIENT, "probe", "127.0.0.1:1"], env={**e, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                     timeout=60)
  assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
  assert "the import name 'client' is not this package's" in p.stderr and str(tmp_path / "client" / "__init__.py") in p.stderr, p.stderr

def test_a_forked_child_cannot_use_the_parents_connection(scripts):
  # fork shares the parent's socket: a frame the child sent would land in the parent's session. The child is refused with a reason that
  # says what to do; the parent's session and its local runner (which the child's atexit must not stop) carry on
  p = client_run(str(scripts / "forked.py"))
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout.splitlines()[-1])
  assert out["first"] == [1.0, 2.0, 3.0] and out["after"] == [3.0, 6.0, 9.0], out
  assert "this process is a fork of the one that opened the connection" in out["child"] and "spawn or forkserver" in out["child"], out

def test_a_forked_childs_allocation_ends_with_the_reason_as_its_last_line(scripts):
  """tinygrad turns an allocation's error into `MemoryError: Allocation of 20 B failed`, the reason only in the chained cause, which a
  fork pool does not carry to the parent: the last line the user sees is the reason."""
  p = client_run(str(scripts / "forkalloc.py"))
  assert p.returncode == 1 and p.stdout == "[2.0, 2.0]\n", (p.stdout, p.stderr[-3000:])
  last = p.stderr.strip().splitlines()[-1]
  assert "this process is a fork of the one that opened the connection" in last and "MemoryError" not in p.stderr, p.stderr[-3000:]

def test_usage_errors(scripts, shared):
  p = client_run()
  assert p.returncode == 2 and "usage: python -m client run" in p.stderr and len(p.stderr.splitlines()) <= 3, p.stderr
  p = client_run("--runer", "h:1", "train.py")
  assert p.returncode == 2 and "--runer" in p.stderr and len(p.stderr.splitlines()) <= 3, p.stderr
  p = client_run("--runner", "127.0.0.1:1", str(scripts / "missing.py"))
  assert p.returncode == 2 and "missing.py" in p.stderr and "No such file" in p.stderr, p.stderr
  p = client_run("--runner", shared.addr, "-m", "no_such_module_here")
  assert p.returncode == 1 and "No module named no_such_module_here" in p.stderr and "Traceback" not in p.stderr, p.stderr

# *** no silent fall-back: a named runner that cannot be used stops the program with one line

def dead_port() -> str:
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
  s.close()   # nothing listens there now
  return f"127.0.0.1:{port}"

UNUSABLE = {   # case: (address of (runner with a token, runner without), token file, what the line says: {token} is the token file's path)
  "unresolvable": (lambda a, p: "macbok.invalid:6670", None, "does not resolve"),   # .invalid never resolves (RFC 6761)
  "dead_port": (lambda a, p: dead_port(), None, "nothing listens"),
  "wrong_token": (lambda a, p: a.addr, "wrong", "{token}"),
  "no_token": (lambda a, p: a.addr, None, "the runner requires a token: {give}"),
  "missing_token_file": (lambda a, p: a.addr, "missing", "{token}"),
  "runner_without_a_token": (lambda a, p: p.addr, "token", "{token}"),   # it cannot prove it holds ours: an impostor, maybe
}

def stopped(p:subprocess.CompletedProcess, addr:str, says:str, unsaid:tuple[str, ...]=()):
  assert p.returncode != 0, (p.stdout, p.stderr)
  assert p.stdout == "", p.stdout   # the program computed nothing: not even its first line, on any device
  lines = p.stderr.splitlines()
  assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
  assert addr in lines[0] and says in lines[0], lines[0]
  assert not [u for u in unsaid if u in lines[0]], lines[0]   # what the user did not type: a variable the wrapper set, token=

@pytest.mark.parametrize("case", UNUSABLE)
def test_client_run_stops_for_a_runner_it_cannot_use(scripts, authed, shared, case):
  where, token, says = UNUSABLE[case]
  addr, tf = where(authed, shared), str(getattr(authed, token)) if token else None
  p = client_run("--runner", addr, *(("--token-file", tf) if tf else ()), str(scripts / "train.py"))
  stopped(p, addr, says.format(token=tf, give="pass --token-file FILE"), ("token=", "METAL_RUNNER"))

@pytest.mark.parametrize("case", UNUSABLE)
def test_import_stops_for_a_runner_it_cannot_use(scripts, authed, shared, case):
  where, token, says = UNUSABLE[case]
  addr, tf = where(authed, shared), str(getattr(authed, token)) if token else None
  p = python(str(scripts / "import_train.py"), env={"METAL_RUNNER": addr, **({"METAL_RUNNER_TOKEN_FILE": tf} if tf else {})})
  stopped(p, addr, says.format(token=tf, give="set METAL_RUNNER_TOKEN_FILE=FILE"), ("token=", "--token-file " + str(tf)))

@pytest.mark.parametrize("how", ["client run", "import"])
def test_every_runner_named_is_checked_before_the_program_starts(scripts, shared, how):
  """The runners after the first are checked too, all at once: one that cannot be used stops the program before its first line, and
  each such runner has a line of its own."""
  dead1, dead2 = dead_port(), dead_port()
  for addrs, bad in [([shared.addr, dead1], [dead1]), ([dead1, shared.addr, dead2], [dead1, dead2])]:
    if how == "client run": p = client_run("--runner", ",".join(addrs), str(scripts / "train.py"))
    else: p = python(str(scripts / "import_train.py"), env={"METAL_RUNNER": ",".join(addrs)})
    assert p.returncode == 1 and p.stdout == "", (p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == len(bad) and all(a in ln and "nothing listens" in ln for a, ln in zip(bad, lines)), p.stderr

def test_a_runner_checked_at_the_start_and_used_later_gets_a_new_session_if_its_first_ended(tmp_path):
  """The session each runner is checked with waits for its device; one the runner dropped meanwhile (its --idle-timeout) is resumed at
  the device's first use (client/resume.py), not handed to it dead."""
  (tmp_path / "later.py").write_text("import time\nfrom tinygrad import Tensor\nprint((Tensor([1.0]) + 1).tolist(), flush=True)\n"
                                     "time.sleep(2.5)\nprint((Tensor([1.0], device='REMOTE:1') + 2).tolist())\n")
  with runner() as a, runner("--idle-timeout", "1") as b:
    p = client_run("--runner", f"{a.addr},{b.addr}", str(tmp_path / "later.py"))
  assert p.returncode == 0 and p.stdout == "[2.0]\n[3.0]\n", (p.stdout, p.stderr[-3000:])

@pytest.mark.parametrize("how", ["client run", "import"])
def test_a_host_alone_is_the_runner_at_port_6667(scripts, how):
  addr = "macbok.invalid"   # never resolves (RFC 6761): the line shows the address as it was understood
  p = client_run("--runner", addr, str(scripts / "train.py")) if how == "client run" else \
    python(str(scripts / "import_train.py"), env={"METAL_RUNNER": addr})
  stopped(p, "cannot use the runner at macbok.invalid:6667: the host name macbok.invalid does not resolve", "")

# *** a runner lost mid-run: one line, as at start-up

LOST = "import sys\nfrom tinygrad import Tensor\nx = Tensor([1.0, 2.0]) + 1\nprint('ready', x.tolist(), flush=True)\nsys.stdin.readline()\n" \
       "print((x * 2).tolist())\n"

@pytest.mark.parametrize("debug", ["0", "1"])
def test_a_runner_lost_mid_run_ends_the_program_with_one_line(tmp_path, debug):
  (tmp_path / "lost.py").write_text(LOST)
  r = RunnerProc()
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  p = subprocess.Popen([sys.executable, "-m", "client", "run", "--runner", r.addr, str(tmp_path / "lost.py")], env={**e, "PYTHONPATH": str(ROOT),
                       "DEBUG": debug}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    while (line := p.stdout.readline()) and not line.startswith("ready"): pass   # DEBUG=1: tinygrad's lines first
    assert line == "ready [2.0, 3.0]\n", p.communicate(timeout=30)[1][-3000:]
    os.kill(r.proc.pid, signal.SIGKILL)   # the runner and its session processes (PR_SET_PDEATHSIG) are gone; its port is closed
    r.proc.wait(10)
    out, err = p.communicate("go\n", timeout=60)
  finally:
    if p.poll() is None: p.kill()
    r.stop()
  assert p.returncode == 1 and "[4.0, 6.0]" not in out and (out == "" or debug == "1"), (p.returncode, out, err)
  if debug == "1":   # the whole story, for whoever debugs it
    assert "Traceback" in err and "RunnerConnectionError" in err, err
    return
  lines = err.splitlines()
  assert len(lines) == 1 and "Traceback" not in err, err
  assert lines[0].startswith(f"metal_runner: runner {r.addr}: the link dropped (the runner closed the connection") or \
    lines[0].startswith(f"metal_runner: runner {r.addr}: the link dropped (connection failed:"), lines[0]
  assert "no longer listens" in lines[0] and "the session is lost" in lines[0] and "()" not in lines[0], lines[0]

def test_a_device_opened_later_stops_with_one_line_too(shared):
  # DEV names the device: the runner is reached when the program first uses it, and an unusable one is still one line
  addr = dead_port()
  p = python("-c", "import client.remote_metal\nfrom tinygrad import Tensor\nprint('started', flush=True)\nprint((Tensor([1]) + 1).tolist())",
             env={"METAL_RUNNER": addr, "DEV": "REMOTE"})
  assert p.returncode == 1 and p.stdout == "started\n", (p.stdout, p.stderr)
  assert len(p.stderr.splitlines()) == 1 and addr in p.stderr and "Traceback" not in p.stderr, p.stderr
