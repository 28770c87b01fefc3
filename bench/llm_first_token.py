"""Time to first token of one model across runners (client/placement.py): tinygrad.llm's server (--serve) through `python -m client run`
on one CPU runner against two and three holding a range of blocks each, in the same run, as ratios. Also a section of bench/run.py
(--only llmfirsttoken).

  python3 bench/llm_first_token.py [--reps 2] [--requests 5] [--prompt 16] [--pin]

Time to first token is, here, the time of a streamed chat request with max_tokens=1 from its send to its last byte: the prompt's
prefill and one decode step, as a user of the server waits for them. Each server is warmed up (tinygrad.llm's own warmup, then one
untimed request); each timed request has a prompt of its own (random words, so no cached prefix of an earlier one is reused beyond the
chat template's first tokens). A figure is the median over a server's requests, then over the reps; a ratio is the median of the per-rep
ratios against one runner. The model is bench/llm_runners.py's (a GGUF from tests/ggufgen.py, 47.7 MB, random weights). --pin: each
runner pinned to a CPU (CPU i mod the CPUs), the server to the last CPU, as bench/llm_runners.py --pin. Writes
bench/results/llm_first_token.json.
"""
from __future__ import annotations
import argparse, http.client, json, os, pathlib, random, socket, statistics, subprocess, sys, tempfile, time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
from llm_runners import MODEL, Runner, log  # noqa: E402

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]

def chat(port:int, prompt:str, timeout:float=300) -> float:
  """One streamed request with max_tokens=1; seconds from its send to its last byte."""
  body = json.dumps({"model": "m", "stream": True, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": prompt}]})
  c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
  try:
    t = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    took = time.perf_counter() - t
  finally: c.close()
  if r.status != 200 or b'"error"' in data: raise RuntimeError(f"the request failed: HTTP {r.status}: {data[-500:]!r}")
  return took

class Server:
  """`python -m client run --runner ... -m tinygrad.llm --serve PORT` on 127.0.0.1, ready once it answers /v1/models."""
  def __init__(self, model:str, runners:list[Runner], logs:pathlib.Path, cpu:int|None=None):
    self.port, self.log = free_port(), open(logs / f"server-{len(runners)}.log", "w")
    e = {k: v for k, v in os.environ.items() if k not in ("DEV", "DEBUG", "METAL_RUNNER")}
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    self.p = subprocess.Popen([*pin, sys.executable, "-m", "client", "run", "--runner", ",".join(r.addr for r in runners), "-m", "tinygrad.llm",
                               "--model", model, "--max_context", "256", "--serve", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT,
                              cwd=str(ROOT), env={**e, "PYTHONPATH": str(ROOT), "METAL_RUNNER_TOKEN_FILE": ""})
    deadline = time.monotonic() + 600
    while True:
      if self.p.poll() is not None: raise RuntimeError(f"the server ended ({self.p.returncode}): {pathlib.Path(self.log.name).read_text()[-2000:]}")
      try:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        c.request("GET", "/v1/models")
        if c.getresponse().status == 200: break
      except OSError: pass
      if time.monotonic() > deadline: raise RuntimeError("the server did not answer in 600 s")
      time.sleep(0.5)
  def stop(self):
    if self.p.poll() is None:
      self.p.terminate()
      try: self.p.wait(30)
      except subprocess.TimeoutExpired: self.p.kill()
    self.log.close()

def words(rng:random.Random, n:int) -> str: return " ".join(rng.choice("abcdefghijklmnopqrstuvwxyz") * rng.randint(1, 4) for _ in range(n))

def bench(reps:int=2, requests:int=5, prompt:int=16, pin:bool=False) -> dict:
  sys.path.insert(0, str(ROOT / "tests"))
  from ggufgen import write
  ncpu, rng = os.cpu_count() or 1, random.Random(0)
  with tempfile.TemporaryDirectory(prefix="llm-first-token-") as d:
    dd = pathlib.Path(d)
    model = write(str(dd / "model.gguf"), **MODEL)
    rs = [Runner(dd, f"r{i}", i % ncpu if pin else None) for i in range(4)]
    out: dict = {"model": {**MODEL, "bytes": os.path.getsize(model)}, "pin": pin, "prompt_words": prompt, "runs": []}
    try:
      for rep in range(reps):
        modes = [("one", rs[:1]), ("two", rs[1:3]), ("three", rs[1:4])]
        for name, group in (modes if rep % 2 == 0 else modes[::-1]):
          log(f"rep {rep + 1}: {name} ...")
          s = Server(model, group, dd, ncpu - 1 if pin else None)
          try:
            chat(s.port, words(rng, prompt))   # untimed: the first request of a server
            took = [chat(s.port, words(rng, prompt)) for _ in range(requests)]
          finally: s.stop()
          out["runs"].append({"rep": rep, "mode": name, "seconds": took, "median": statistics.median(took)})
    finally:
      for r in rs: r.stop()
  return out

def summary(out:dict) -> list[str]:
  runs = out["runs"]
  def med(mode): return statistics.median(r["median"] for r in runs if r["mode"] == mode)
  def ratio(mode): return statistics.median(a["median"] / b["median"] for a in runs for b in runs
                                            if a["mode"] == mode and b["mode"] == "one" and a["rep"] == b["rep"])
  lines = [f"model: {out['model']['bytes'] / 1e6:.1f} MB GGUF; prompt of {out['prompt_words']} words; "
           f"{'runners and server pinned' if out['pin'] else 'nothing pinned'}; time to first token, median"]
  for mode in ("one", "two", "three"):
    if any(r["mode"] == mode for r in runs):
      lines.append(f"{mode:<6} {med(mode) * 1e3:8.1f} ms" + (f"  {ratio(mode):.2f}x one (lower is better)" if mode != "one" else ""))
  return lines

if __name__ == "__main__":
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--requests", type=int, default=5)
  ap.add_argument("--prompt", type=int, default=16, help="words in each prompt")
  ap.add_argument("--pin", action="store_true")
  a = ap.parse_args()
  os.environ["METAL_RUNNER_TOKEN_FILE"] = ""
  res = bench(a.reps, a.requests, a.prompt, a.pin)
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "llm_first_token.json").write_text(json.dumps(res, indent=1))
  print("\n".join(summary(res)))
