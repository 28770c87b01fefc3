"""Greedy decoding of examples/shard_llm.py's model (tinygrad.llm's Transformer, random float32 weights) through TinyJit, in one of four
modes, one process per run (bench/multirunner.py runs it):

  python3 bench/decode.py MODE [--runner A,B] [--blocks 6 --dim 512 --ffn 1024 --heads 8 --vocab 4096] [--tokens 60] [--warmup 8]

  cpu     tinygrad's own CPU device (no runner)
  one     one runner (REMOTE:0)
  split   two runners split by layers (examples/shard_llm.py --split)
  tp      two runners, tensor parallel (examples/shard_llm.py)

Prints one JSON line: tokens/s and ms per token after the warm-up, the tokens, and (runner modes) requests and round trips per token
over all runners (Runner.stats()). --runner: the runners' addresses (METAL_RUNNER); without it the client starts local runners.
"""
from __future__ import annotations
import argparse, json, os, pathlib, sys, time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

def total(rs) -> dict:
  out: dict = {}
  for r in rs:
    for k, v in r.stats().items(): out[k] = out.get(k, 0) + v
  return out

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("mode", choices=("cpu", "one", "split", "tp"))
  ap.add_argument("--runner", default=None, help="runner addresses, comma-separated (METAL_RUNNER)")
  for n, d in (("blocks", 6), ("dim", 512), ("ffn", 1024), ("heads", 8), ("vocab", 4096), ("context", 128), ("tokens", 60), ("warmup", 8)):
    ap.add_argument(f"--{n}", type=int, default=d)
  a = ap.parse_args()
  if a.mode != "cpu":
    if a.runner: os.environ["METAL_RUNNER"] = a.runner
    os.environ.setdefault("DEV", "REMOTE")
    import client.remote_metal  # noqa: F401
  from tinygrad import Device
  from shard_llm import build, decode
  devs = ("CPU",) if a.mode == "cpu" else ("REMOTE:0",) if a.mode == "one" else ("REMOTE:0", "REMOTE:1")
  step = build(devs, "one" if a.mode == "cpu" else a.mode, a.blocks, a.dim, a.ffn, a.heads, a.vocab, a.context)
  rs, mark = [Device[d].runner for d in devs if d.startswith("REMOTE")], {}
  def on_token(i):
    if i == a.warmup: mark.update(t=time.perf_counter(), s=total(rs))
  toks = decode(step, devs, "one" if a.mode == "cpu" else a.mode, a.warmup + a.tokens, a.context, on_token)
  s = time.perf_counter() - mark["t"]
  st = {k: v - mark["s"][k] for k, v in total(rs).items()} if rs else {}
  print(json.dumps({"mode": a.mode, "tok_per_s": a.tokens / s, "ms_per_tok": s / a.tokens * 1e3, "tokens": toks,
                    "requests_per_tok": st.get("requests", 0) / a.tokens, "round_trips_per_tok": st.get("round_trips", 0) / a.tokens}))

if __name__ == "__main__":
  main()
