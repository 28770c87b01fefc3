"""`python -m tinygrad.llm ARGS` for the tests and bench/llm.py: with the stand-in for tinygrad.llm.kernels (client/llm_kernels.py; under
`client run` its site hook has installed it already) and --serve bound to 127.0.0.1, where tinygrad's server listens on every interface.
  DEV=CPU python tests/llm_app.py --model M.gguf --serve PORT              # tinygrad's own CPU device
  python -m client run --runner ADDR tests/llm_app.py --model M.gguf --serve PORT
Imported, it starts such a server (served()).
A fault injection for the tests (a test harness, never set by users): LLM_APP_FAIL=DEVICE@N[,N...] makes the work sent to runner device
DEVICE raise MemoryError during the Nth request, half way through a step (fail_on()).
"""
from __future__ import annotations
import contextlib, os, pathlib, runpy, signal, socket, subprocess, sys, time, urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
OWN_VARS = ("METAL_RUNNER", "METAL_RUNNER_TOKEN_FILE", "DEV", "DEBUG", "BEAM", "METAL_RUNNER_CLIENT_RUN", "METAL_RUNNER_LLM_KERNELS_SAID")

def env_for(env:dict) -> dict:
  """The environment for a child: none of ours (a developer's runner, token, DEV), the repository importable, no token, then env."""
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  # BEAM_MAX_TASKS_PER_CHILD: tinygrad 0.14's compile pool replaces a worker after 16 tasks from a thread of its own, and sets
  # __main__.__file__ to None while it does (engine/worker.py _without_main); tinygrad.llm's warm-up runs at DEBUG=1, whose
  # inspect.stack() in the main thread then fails (TypeError: <module '__main__' from None> is a built-in module) about one start in
  # four here. Workers kept for good, none is started from that thread.
  return {**e, "PYTHONPATH": str(ROOT), "METAL_RUNNER_TOKEN_FILE": "", "BEAM_MAX_TASKS_PER_CHILD": "1000000", **env}

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]

@contextlib.contextmanager
def served(prefix:list[str], args:list[str], env:dict, log:pathlib.Path, timeout:float=300):
  """python PREFIX tests/llm_app.py ARGS --serve PORT on a free loopback port, its output to the file log (a pipe could fill and stop
  it); yields (base URL, seconds from start until it answered) once /v1/models answers; stops it by pid."""
  port, t0 = free_port(), time.perf_counter()
  with open(log, "w") as out:
    p = subprocess.Popen([sys.executable, *prefix, __file__, *args, "--serve", str(port)], env=env_for(env), stdout=out, stderr=subprocess.STDOUT,
                         cwd=str(ROOT))
  try:
    url, deadline = f"http://127.0.0.1:{port}/v1", time.monotonic() + timeout
    while True:
      if p.poll() is not None: raise RuntimeError(f"the server exited {p.returncode}: {log.read_text()[-3000:]}")
      if time.monotonic() > deadline: raise RuntimeError(f"the server did not answer in {timeout} s")
      with contextlib.suppress(OSError):
        with urllib.request.urlopen(url + "/models", timeout=2): break
      time.sleep(0.1)
    yield url, time.perf_counter() - t0
  finally:
    if p.poll() is None:
      os.kill(p.pid, signal.SIGTERM)
      try: p.wait(10)
      except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()

def fail_on(spec:str):
  """LLM_APP_FAIL=DEVICE@N[,N...]: while the Nth request (from 1) runs the model, the work sent to runner device DEVICE (a JIT's graph
  that includes it, or a kernel) raises MemoryError in place of being sent: the step ends there, as one whose allocation failed would."""
  import tinygrad.llm.serve as serve
  from client.graph import RemoteGraph
  from client.remote_metal import RemoteProgram
  device, at = spec.split("@")
  failing, state = {int(n) for n in at.split(",")}, {"request": 0, "on": False}
  def failed(): return MemoryError(f"{device}: made to fail by LLM_APP_FAIL (tests/llm_app.py)")
  graph_run, program_run, run_model = RemoteGraph.__call__, RemoteProgram.__call__, serve.Handler.run_model
  def graph(self, *args, **kwargs):
    if state["on"] and any(d.device == device for d in self.devs): raise failed()
    return graph_run(self, *args, **kwargs)
  def program(self, *args, **kwargs):
    if state["on"] and self.dev.device == device: raise failed()
    return program_run(self, *args, **kwargs)
  def runs(self, *args, **kwargs):
    state["request"] += 1
    state["on"] = state["request"] in failing
    try: return (yield from run_model(self, *args, **kwargs))
    finally: state["on"] = False
  RemoteGraph.__call__, RemoteProgram.__call__, serve.Handler.run_model = graph, program, runs

if __name__ == "__main__":
  sys.path.insert(0, str(ROOT))
  from client.llm_kernels import install
  install()
  if os.environ.get("METAL_RUNNER_CLIENT_RUN") == "1":   # as client run does for -m tinygrad.llm: several runners hold the model together
    from client.run import place_over_runners
    place_over_runners()
  if spec:=os.environ.get("LLM_APP_FAIL"): fail_on(spec)
  import tinygrad.llm.serve as serve
  bind = serve.LLMServer.__init__
  serve.LLMServer.__init__ = lambda self, addr, *a: bind(self, ("127.0.0.1", addr[1]), *a)
  runpy.run_module("tinygrad.llm", run_name="__main__", alter_sys=True)
