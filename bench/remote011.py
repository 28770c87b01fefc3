"""tinygrad 0.11.0's REMOTE device, the last release that shipped it, for bench/run.py --remote011.

  python3 bench/remote011.py setup     create bench/.venv011 with tinygrad==0.11.0 and numpy (pip, from PyPI); prints the venv's python
  <venv python> bench/remote011.py server
                                       0.11.0's REMOTE server (tinygrad/runtime/ops_remote.py: RemoteHandler, an HTTP server on
                                       asyncio) on 127.0.0.1 and a free port, REMOTEDEV (default CPU) behind it; prints
                                       "listening on 127.0.0.1:PORT" first

0.11.0's own entry point (python -m tinygrad.runtime.ops_remote, PORT=...) binds every interface (host=''); this one runs the same
RemoteHandler bound to 127.0.0.1 only. Clients reach it with REMOTE=1 HOST=127.0.0.1:PORT.
"""
from __future__ import annotations
import os, pathlib, subprocess, sys, venv

HERE = pathlib.Path(__file__).resolve().parent
VENV = HERE / ".venv011"
PY = VENV / "bin" / "python"
VERSION = "0.11.0"
NUMPY = "numpy==2.4.6"   # the version the main venv has

def setup(log=sys.stderr) -> pathlib.Path:
  """The venv's python, with tinygrad 0.11.0 installed (once; later calls only check it)."""
  check = [str(PY), "-c", "import importlib.metadata as m, numpy; print(m.version('tinygrad'))"]   # numpy: bench/link_worker.py
  if PY.exists() and subprocess.run(check, capture_output=True, text=True).stdout.strip() == VERSION: return PY
  print(f"creating {VENV} with tinygrad=={VERSION}", file=log)
  venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
  r = subprocess.run([str(PY), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"tinygrad=={VERSION}", NUMPY], capture_output=True, text=True)
  if r.returncode != 0: raise RuntimeError(f"pip install tinygrad=={VERSION} into {VENV} failed:\n{(r.stdout + r.stderr)[-2000:]}")
  return PY

def server():
  import asyncio
  from tinygrad.runtime.ops_remote import RemoteHandler
  device = os.environ.get("REMOTEDEV", "CPU")
  async def main():
    srv = await asyncio.start_server(RemoteHandler(device), host="127.0.0.1", port=0)
    print(f"listening on 127.0.0.1:{srv.sockets[0].getsockname()[1]}", flush=True)
    await srv.serve_forever()
  asyncio.run(main())

if __name__ == "__main__":
  if sys.argv[1:] == ["setup"]: print(setup())
  elif sys.argv[1:] == ["server"]: server()
  else: sys.exit(__doc__)
