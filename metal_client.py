"""metal-client: the metal_runner client's command, `metal-client run ...` and `metal-client probe ...`, the same as `python -m client ...`.

A command of its own because `client` is a common import name: `python -m client` in a folder that has its own client.py (or client/)
runs that instead, and another distribution may install a top-level `client` package too. This command is found by its own name, and
where `client` is not this package it says so, and whose it is, instead of running something else."""
import sys

def main() -> int:
  try: import client
  except ImportError: client = None
  if getattr(client, "METAL_RUNNER_CLIENT", None) is not True:
    where = getattr(client, "__file__", None) or "not importable"
    print(f"metal-client: the import name 'client' is not this package's: it is {where} (a client.py or client/ of yours on the "
          "Python path, or another distribution's package named client); rename yours, or install metal-runner-client in a virtual "
          "environment of its own", file=sys.stderr)
    return 2
  from client.__main__ import main as run
  return run(prog="metal-client")

if __name__ == "__main__": sys.exit(main())
