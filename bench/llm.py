"""tinygrad's own LLM server (python -m tinygrad.llm --serve, through tests/llm_app.py) answering the openai client, through a CPU runner
against tinygrad's own CPU device, in the same run:

  python3 bench/llm.py [--reps 5] [--tokens 32] [--blocks 6 --dim 512 --ffn 1024 --heads 8 --vocab 4096]

The model is a GGUF made by tests/ggufgen.py (llama, random weights, float16 and Q8_0; the default 19.9 M parameters). Three servers
run at once and are asked in turn, the same prompts, streamed, temperature 0, --tokens tokens each:
  cpu        DEV=CPU: tinygrad's own CPU device in the server's process (no runner)
  loopback   python -m client run --runner ADDR: a CPU runner on 127.0.0.1
  1GbE       the same runner behind bench/linkemu.c set to 1 GbE (0.15 ms each way, 1000 Mbit/s): a test harness, an EMULATED link on
             127.0.0.1, not a network; its round trip and rate as python -m client probe measures them are printed
Figures: ready (server start until it answers: loading, the weights' upload, tinygrad's warm-up compile), time to first token (request
sent until the first chunk with content), tokens/s after the first token (completion tokens less one over the time from the first to
the last chunk). Then the weights through the runner's cache (--cache-dir): a server started twice behind the 1 GbE link, the second
start taking the weights by hash; with the bytes each runner session received (its log's "ended" line). Medians over --reps;
nothing here fails on a number. Writes bench/results/llm.json.
"""
from __future__ import annotations
import argparse, json, pathlib, re, statistics, subprocess, sys, tempfile, time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests")]
from netbench import Relay   # noqa: E402
from runner_proc import RunnerProc   # noqa: E402
from ggufgen import write   # noqa: E402
from llm_app import env_for, served   # noqa: E402

def log(*a): print(*a, file=sys.stderr, flush=True)

def ask(url:str, prompt:str, tokens:int) -> dict:
  import openai
  c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
  t0, first, last, n, text = time.perf_counter(), None, None, 0, ""
  for ch in c.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=tokens,
                                      stream=True, stream_options={"include_usage": True}):
    if ch.usage: n = ch.usage.completion_tokens
    if ch.choices and ch.choices[0].delta.content:
      last = time.perf_counter()
      first, text = first or last, text + ch.choices[0].delta.content
  return {"ttft_s": first - t0, "tok_s": (n - 1) / (last - first) if n > 1 and last > first else 0.0, "tokens": n, "text": text}

def probe(addr:str) -> dict:
  out = subprocess.run([sys.executable, "-m", "client", "probe", addr], env=env_for({}), capture_output=True, text=True, timeout=120).stdout
  rtt, rate = re.search(r"rtt\s+([\d.]+) us median", out), re.search(r"write\s+([\d.]+) GB/s", out)
  return {"rtt_us": float(rtt.group(1)) if rtt else None, "write_gbps": float(rate.group(1)) if rate else None}

def received(r:RunnerProc) -> list[int]: return [int(b) for b in re.findall(r"ended: .*?(\d+) bytes in", r.log_text())]

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--tokens", type=int, default=32)
  ap.add_argument("--context", type=int, default=256)
  for k, v in dict(blocks=6, dim=512, ffn=1024, heads=8, vocab=4096).items(): ap.add_argument(f"--{k}", type=int, default=v)
  a = ap.parse_args()
  results = HERE / "results"
  results.mkdir(exist_ok=True)
  subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-pthread", "-o", results / "linkemu", HERE / "linkemu.c"], check=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-llm-"))
  model = write(str(tmp / "model.gguf"), blocks=a.blocks, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.heads, vocab=a.vocab, context=a.context)
  args = ["--model", model, "--max_context", str(a.context)]
  prompts = [f"Hello world {i}: the" for i in range(a.reps)]
  out: dict = {"model": {**{k: getattr(a, k) for k in ("blocks", "dim", "ffn", "heads", "vocab")}, "bytes": pathlib.Path(model).stat().st_size},
               "tokens": a.tokens, "reps": a.reps}
  runner, relays, stack = RunnerProc("--resume-grace", "0"), [], []   # a server stopped ends its session at once (docs/resume.md)
  try:
    relays.append(gbe := Relay(results / "linkemu", runner.addr, "llm-1GbE", tmp))
    gbe.profile(150, 1000)
    out["link"] = {"1GbE": probe(gbe.addr), "loopback": probe(runner.addr)}
    log(f"links (client probe): {out['link']}")
    time.sleep(0.6)   # the runner logs a session's end up to half a second after it
    probes = len(received(runner))
    sides = {"cpu": ([], {"DEV": "CPU"}), "loopback": (["-m", "client", "run", "--runner", runner.addr], {}),
             "1GbE": (["-m", "client", "run", "--runner", gbe.addr], {})}
    urls, runs = {}, {k: [] for k in sides}
    for name, (prefix, env) in sides.items():
      cm = served(prefix, args, env, tmp / f"{name}.log", timeout=900)
      urls[name], ready = cm.__enter__()
      stack.append(cm)
      out.setdefault("ready_s", {})[name] = ready
      log(f"{name}: ready in {ready:.1f} s")
    for i, prompt in enumerate(prompts):   # the sides in turn, the same prompt, so that a burst of load on this machine hits them alike
      for name in sides: runs[name].append(ask(urls[name], prompt, a.tokens))
      log(f"rep {i}: " + ", ".join(f"{k} {v[-1]['ttft_s'] * 1e3:.0f} ms / {v[-1]['tok_s']:.1f} tok/s" for k, v in runs.items()))
    out["same_text_as_cpu"] = {k: [r["text"] for r in v] == [r["text"] for r in runs["cpu"]] for k, v in runs.items()}
    out["runs"] = {k: {"ttft_s": statistics.median(r["ttft_s"] for r in v), "tok_s": statistics.median(r["tok_s"] for r in v),
                       "tokens": statistics.median(r["tokens"] for r in v)} for k, v in runs.items()}
    while stack: stack.pop().__exit__(None, None, None)
    time.sleep(0.6)
    out["session_bytes_in"] = received(runner)[probes:]
  finally:
    while stack: stack.pop().__exit__(None, None, None)
    for r in relays: r.stop()
    runner.stop()
  # the cache: a runner with --cache-dir behind the 1 GbE link, a server started twice
  cached, relay = RunnerProc("--resume-grace", "0", "--cache-dir", str(tmp / "cache")), None
  try:
    relay = Relay(results / "linkemu", cached.addr, "llm-1GbE-cache", tmp)
    relay.profile(150, 1000)
    out["cache"] = {}
    for start in ("first", "second"):
      with served(["-m", "client", "run", "--runner", relay.addr], args, {}, tmp / f"cache-{start}.log", timeout=900) as (_, ready):
        out["cache"][start] = {"ready_s": ready}
      log(f"cache, {start} start behind 1GbE: ready in {ready:.1f} s")
    relay.stop()
    relay = None
    time.sleep(0.6)
    for start, b in zip(("first", "second"), received(cached)): out["cache"][start]["bytes_in"] = b
  finally:
    if relay is not None: relay.stop()
    cached.stop()
  (results / "llm.json").write_text(json.dumps(out, indent=1))
  print(f"model: {out['model']}, {a.tokens} tokens per answer, median of {a.reps}")
  print("| side | ready (s) | time to first token (ms) | tokens/s | same text as cpu |\n|---|---|---|---|---|")
  for k, v in out["runs"].items():
    print(f"| {k} | {out['ready_s'][k]:.1f} | {v['ttft_s'] * 1e3:.0f} | {v['tok_s']:.1f} | {out['same_text_as_cpu'][k]} |")
  print(f"links: {out['link']}; bytes each server's runner session received (loopback, 1GbE): {out['session_bytes_in']}")
  print(f"cache behind 1GbE: {out['cache']}")

if __name__ == "__main__": main()
