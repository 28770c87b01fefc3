"""python -m client, and the metal-client command (metal_client.py): the client's commands, probe (client/probe.py) and run (client/run.py)."""
from __future__ import annotations
import argparse, sys
from .probe import add_parser as add_probe, probe

def main(argv=None, prog:str="python -m client") -> int:
  """prog: how the user called us, for usage and messages: `python -m client` or the `metal-client` command (metal_client.py)."""
  ap = argparse.ArgumentParser(prog=prog, description="metal_runner client tools")
  sub = ap.add_subparsers(dest="cmd", required=True)
  add_probe(sub)
  sub.add_parser("run", help="run a tinygrad program on a runner: run [--runner ADDR] [--token-file F] (SCRIPT | -m MODULE) [ARGS...]",
                 add_help=False)
  if (argv:=sys.argv[1:] if argv is None else argv)[:1] == ["run"]:   # its options end at the program, as python's: not argparse's rule
    from .run import main as run
    return run(argv[1:], prog=f"{prog} run")
  args = ap.parse_args(argv)
  if args.repeat < 1: ap.error("--repeat must be at least 1")
  return probe(args)

if __name__ == "__main__": sys.exit(main())
