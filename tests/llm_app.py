"""`python -m tinygrad.llm ARGS` for the tests and bench/llm.py: with the stand-in for tinygrad.llm.kernels (client/llm_kernels.py; under
`client run` its site hook has installed it already) and --serve bound to 127.0.0.1, where tinygrad's server listens on every interface.
  DEV=CPU python tests/llm_app.py --model M.gguf --serve PORT              # tinygrad's own CPU device
  python -m client run --runner ADDR tests/llm_app.py --model M.gguf --serve PORT
Imported, it starts such a server (served()).
"""
from __future__ import annotations
import contextlib, os, pathlib, runpy, signal, socket, subprocess, sys, time, urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
OWN_VARS = ("METAL_RUNNER", "METAL_RUNNER_TOKEN_FILE", "DEV", "DEBUG", "BEAM", "METAL_RUNNER_CLIENT_RUN", "METAL_RUNNER_LLM_KERNELS_SAID")

def env_for(env:dict) -> dict:
  """The environment for a child: none of ours (a developer's runner, token, DEV), the repository importable, no token, then env."""
  e = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
  return {**e, "PYTHONPATH": str(ROOT), "METAL_RUNNER_TOKEN_FILE": "", **env}

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

if __name__ == "__main__":
  sys.path.insert(0, str(ROOT))
  from client.llm_kernels import install
  install()
  if os.environ.get("METAL_RUNNER_CLIENT_RUN") == "1":   # as client run does for -m tinygrad.llm: several runners hold the model together
    from client.run import place_over_runners
    place_over_runners()
  import tinygrad.llm.serve as serve
  bind = serve.LLMServer.__init__
  serve.LLMServer.__init__ = lambda self, addr, *a: bind(self, ("127.0.0.1", addr[1]), *a)
  runpy.run_module("tinygrad.llm", run_name="__main__", alter_sys=True)
