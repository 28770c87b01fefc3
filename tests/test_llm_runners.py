# One tinygrad.llm model over several CPU runners (client/placement.py): `python -m client run --runner a,b[,c] -m tinygrad.llm`, split by
# layers. The split itself (plan) checked on its own first; then the app through 2 and 3 runners on 127.0.0.1, against tinygrad's own CPU
# device for the same text, with small GGUFs made here (tests/ggufgen.py), and the runners' logs for what each received.
import re, subprocess, sys
import pytest
from conftest import ROOT
from runner_proc import RunnerProc
from ggufgen import write
from llm_app import env_for, served

CTX = "64"

def python(*argv:str, env:dict|None=None, stdin:str|None=None, timeout:float=400) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *argv], env=env_for(env or {}), input=stdin, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))

class Runners:
  """n CPU runners on 127.0.0.1 logging their sessions (-v), stopped by pid."""
  def __init__(self, n:int, *args:str): self.procs = [RunnerProc("-v", *args) for _ in range(n)]
  def __enter__(self): return self
  def __exit__(self, *exc):
    for r in self.procs: r.stop()
  @property
  def addr(self) -> str: return ",".join(r.addr for r in self.procs)
  def bytes_in(self, which:list[int]|None=None) -> list[int]:
    """Bytes each runner (or each of which) received from its client: the session that ran the model (the largest), from the log line at
    its end."""
    return [max([int(b) for b in re.findall(r"ended: .*?, (\d+) bytes in", r.wait_log("bytes in"))], default=0)
            for r in (self.procs if which is None else [self.procs[i] for i in which])]

# *** the split, without runners

from client.placement import DoesNotFit, plan   # noqa: E402

DEVS = ("REMOTE", "REMOTE:1", "REMOTE:2")

def ranges(p) -> list[tuple[int, int]]: return [(q.blocks.start, q.blocks.stop) for q in p.parts]

def test_equal_runners_get_equal_contiguous_ranges_embedding_first_head_last():
  p = plan(DEVS[:2], [10] * 8, [1] * 8, 5, 5, [None, None], [1.0, 1.0], headroom=0)
  assert ranges(p) == [(0, 4), (4, 8)]
  assert [(q.first, q.last, q.weights, q.kv) for q in p.parts] == [(True, False, 45, 4), (False, True, 45, 4)]
  p = plan(DEVS, [10] * 9, [0] * 9, 0, 0, [None] * 3, [1.0] * 3, headroom=0)
  assert ranges(p) == [(0, 3), (3, 6), (6, 9)]

def test_a_faster_runner_gets_more_blocks_within_its_memory():
  # a step runs the ranges one after another: the fast one takes all it can, the slow one the one block every runner gets
  # (8 + 1/0.5 = 10 units a token, where the split in proportion to speed, 6 and 3, costs 6 + 3/0.5 = 12)
  assert ranges(plan(DEVS[:2], [10] * 9, [0] * 9, 0, 0, [None, None], [1.0, 0.5], headroom=0)) == [(0, 8), (8, 9)]
  # a slow one in the middle: one block; the fast ones share the rest evenly (equal time either way: the busiest runner's work least)
  assert ranges(plan(DEVS, [10] * 9, [0] * 9, 0, 0, [None] * 3, [1.0, 0.5, 1.0], headroom=0)) == [(0, 4), (4, 5), (5, 9)]
  # the fast one holds 4 blocks at most: the rest go to the slow one
  assert ranges(plan(DEVS[:2], [10] * 9, [0] * 9, 0, 0, [40, None], [1.0, 0.5], headroom=0)) == [(0, 4), (4, 9)]
  # memory counts the KV cache and the headroom too
  assert ranges(plan(DEVS[:2], [10] * 8, [2] * 8, 0, 0, [40, None], [1.0, 1.0], headroom=4)) == [(0, 3), (3, 8)]

def test_a_model_that_fits_nowhere_is_refused_with_what_each_runner_offers():
  with pytest.raises(DoesNotFit) as e:
    plan(DEVS[:2], [3 << 20] * 4, [1 << 20] * 4, 1 << 20, 1 << 20, [8 << 20, 8 << 20], [1.0, 1.0], ["h:1", "h:2"], headroom=2 << 20)
  assert "h:1 offers 8.0 MiB, h:2 offers 8.0 MiB" in str(e.value)
  assert "needs 14.0 MiB of weights" in str(e.value) and "4.0 MiB of KV cache" in str(e.value) and "nothing was uploaded" in str(e.value)
  assert "22.0 MiB in all, in contiguous ranges of blocks: 6.0 MiB short;" in str(e.value)   # 14 + 4 + 2 x 2 of headroom, against 2 x 8
  with pytest.raises(DoesNotFit) as e:   # 15 MiB against 18 in all, but no runner holds two 5 MiB pieces
    plan(DEVS[:2], [5 << 20] * 2, [0] * 2, 5 << 20, 0, [9 << 20, 9 << 20], [1.0, 1.0], ["h:1", "h:2"], headroom=0)
  assert "together they offer enough, but no split into contiguous ranges fits each runner's part" in str(e.value)

# *** the app over runners

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
  d = tmp_path_factory.mktemp("gguf")
  # small: 4 blocks at dim 64, so that 3 runners get a block or more each; half: 6.4 MB in 4 blocks at dim 256, weights well above
  # what the kernels weigh, held by two runners of --session-mem 9M and by neither one alone
  return {"small": write(str(d / "small.gguf"), blocks=4), "half": write(str(d / "half.gguf"), blocks=4, dim=256, ffn=1536)}

def texts(p:subprocess.CompletedProcess) -> list[str]:
  """The text after each decode step of --benchmark."""
  assert p.returncode == 0, p.stderr[-3000:]
  return re.findall(r"tok/s.*--  (.*)", p.stdout)

@pytest.fixture(scope="module")
def cpu_benchmark(models):
  """The --benchmark text of a model on tinygrad's own CPU device, made once per model, when a test first asks for it."""
  made: dict[str, list[str]] = {}
  def get(k:str) -> list[str]:
    if k not in made:
      made[k] = texts(python("-m", "client.llm_kernels", "--model", models[k], "--max_context", CTX, "--benchmark", "6", env={"DEV": "CPU"}))
    return made[k]
  return get

def placement_line(stderr:str) -> str:
  lines = [s for s in stderr.splitlines() if s.startswith("placement over")]
  assert len(lines) == 1, stderr[-3000:]
  return lines[0]

def shares(line:str) -> list[float]:
  """Bytes each runner was given, in MiB, from the placement line."""
  return [float(x) for x in re.findall(r", ([\d.]+) MiB(?:;|$)", line)]

@pytest.mark.slow
def test_benchmark_over_two_runners_that_each_hold_half(models, cpu_benchmark):
  """Neither runner could hold the model (the whole file to one device, as tinygrad.llm loads it, is 6.4 MB of 9 MiB, and the blocks' KV
  caches and headroom on top); each receives only its half, and the text is the CPU device's. By memory alone: the timing pass of
  two equal runners on a loaded 2-core machine can call one faster and move a block (the speed-aware split has tests of its own)."""
  with Runners(2, "--session-mem", "9M") as rs:
    p = python("-m", "client", "run", "--runner", rs.addr, "-m", "tinygrad.llm", "--model", models["half"], "--max_context", CTX,
               "--benchmark", "6", env={"METAL_RUNNER_PLACEMENT": "memory"})
    assert texts(p) == cpu_benchmark("half") and len(texts(p)) == 6
    line = placement_line(p.stderr)
    assert re.match(rf"placement over 2 runners: REMOTE {rs.procs[0].addr} blocks 0-1 and the embedding, [\d.]+ MiB; "
                    rf"REMOTE:1 {rs.procs[1].addr} blocks 2-3 and the output norm and head, [\d.]+ MiB$", line), line
    got, share = rs.bytes_in(), shares(line)
    assert len(share) == 2 and all(abs(g / (1 << 20) - s) <= 0.1 * s for g, s in zip(got, share)), (got, share)
    assert "max context 64 on REMOTE" in p.stdout

@pytest.mark.slow
def test_benchmark_over_three_runners(models, cpu_benchmark):
  with Runners(3) as rs:
    p = python("-m", "client", "run", "--runner", rs.addr, "-m", "tinygrad.llm", "--model", models["small"], "--max_context", CTX,
               "--benchmark", "6", env={"DEBUG": "1"})
    assert texts(p) == cpu_benchmark("small")
    assert placement_line(p.stderr).startswith("placement over 3 runners: ")
    assert "timing pass: REMOTE:" in p.stderr and "ranges that fit" in p.stderr   # DEBUG=1 says why
    assert all(b > 0 for b in rs.bytes_in())

def test_a_model_that_fits_nowhere_is_refused_before_any_upload(models):
  with Runners(2, "--session-mem", "5M") as rs:
    p = python("-m", "client", "run", "--runner", rs.addr, "-m", "tinygrad.llm", "--model", models["half"], "--max_context", CTX,
               "--benchmark", "2")
    assert p.returncode == 1, p.stderr[-3000:]
    a, b = rs.procs[0].addr, rs.procs[1].addr
    assert re.search(rf"^metal_runner: the model does not fit on these runners \({a} offers 5.0 MiB, {b} offers 5.0 MiB, per session.*"
                     r"needs [\d.]+ MiB of weights.*nothing was uploaded$", p.stderr, re.M), p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert all(n < 4096 for n in rs.bytes_in()), rs.bytes_in()   # the handshakes, no weights

def ask(url:str, stream:bool, timeout:float=300) -> str:
  import openai
  c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=timeout)
  args = dict(model="ggufgen-llama", messages=[{"role": "user", "content": "Hello world"}], temperature=0, max_tokens=12)
  if not stream: return c.chat.completions.create(**args).choices[0].message.content or ""
  return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**args, stream=True) if ch.choices)

@pytest.fixture(scope="module")
def cpu_served(models, tmp_path_factory) -> str:
  with served([], ["--model", models["small"], "--max_context", CTX], {"DEV": "CPU"}, tmp_path_factory.mktemp("cpu") / "cpu.log") as (url, _):
    return ask(url, False)

@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_serve_over_runners_answers_with_the_cpu_devices_text(models, cpu_served, tmp_path, n):
  with Runners(n) as rs:
    with served(["-m", "client", "run", "--runner", rs.addr], ["--model", models["small"], "--max_context", CTX], {}, tmp_path / "s.log") as (url, _):
      streamed, whole = ask(url, True), ask(url, False)
    assert f"placement over {n} runners" in (log:=(tmp_path / "s.log").read_text()) and "max context 64 on REMOTE" in log
    assert all(b > 0 for b in rs.bytes_in())
  assert len(cpu_served) > 0 and streamed == whole == cpu_served, (streamed, whole, cpu_served)

def ask_all(c, stream:bool=False, **kw) -> str:
  """The text of a chat at temperature 0, 100 tokens at most, through the openai client c."""
  args = dict(model="ggufgen-llama", messages=[{"role": "user", "content": "Hello world"}], temperature=0, max_tokens=100, **kw)
  if not stream: return c.chat.completions.create(**args).choices[0].message.content or ""
  return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**args, stream=True) if ch.choices)

LOST_APP = ["--max_context", "128"]

@pytest.fixture(scope="module")
def cpu_half_served(models, tmp_path_factory) -> str:
  import openai
  with served([], ["--model", models["half"], *LOST_APP], {"DEV": "CPU"}, tmp_path_factory.mktemp("cpu") / "cpu.log") as (url, _):
    return ask_all(openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300))

def until_logged(log, text:str, timeout:float=60) -> float:
  """Seconds until the server's log holds text; fails after timeout."""
  import time
  t0 = time.perf_counter()
  while text not in log.read_text():
    assert time.perf_counter() - t0 < timeout, f"the server did not say {text!r} in {timeout} s: {log.read_text()[-3000:]}"
    time.sleep(0.05)
  return time.perf_counter() - t0

def lost_mid_stream(c, lost) -> tuple[float, float]:
  """A streamed chat answer through the openai client c, the runner lost killed (SIGKILL) at its third chunk: the stream must end
  with an error that names that runner within 5 s (an error, not a hang). Returns when the signal was sent (perf_counter) and how
  long the stream took to end after it."""
  import openai, os, signal, time
  n, t = 0, 0.0
  with pytest.raises(openai.APIError) as e:
    for _ in c.chat.completions.create(model="ggufgen-llama", messages=[{"role": "user", "content": "Hello world"}], temperature=0,
                                       max_tokens=100, stream=True):
      if (n:=n + 1) == 3:
        os.kill(lost.proc.pid, signal.SIGKILL)
        t = time.perf_counter()
  waited = time.perf_counter() - t
  assert n >= 3 and lost.addr in str(e.value), (n, str(e.value))
  assert waited < 5, waited
  return t, waited

@pytest.mark.slow
def test_one_runner_lost_mid_stream_ends_it_with_an_error_then_503_until_it_answers_again(models, cpu_served, tmp_path):
  """One runner named: the model is placed on it as over several (client/run.py), so its server keeps going when the runner is lost.
  SIGKILL mid-stream: the stream ends at once with an error naming the runner; each request while it is missing gets HTTP 503 that says
  every runner is lost; the runner started again at its port is taken back (as REMOTE:1) and the next request is answered with the CPU
  device's text. Before, tinygrad's own server ran over one runner: the stream ended as if complete and every later request was a
  dropped connection, until the server was started again."""
  import openai, time
  with Runners(1) as rs:
    log = tmp_path / "s.log"
    with served(["-m", "client", "run", "--runner", rs.addr], ["--model", models["small"], "--max_context", CTX], {}, log) as (url, _):
      c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
      assert ask(url, False) == cpu_served
      lost = rs.procs[0]
      lost_mid_stream(c, lost)
      for _ in range(2):
        with pytest.raises(openai.APIStatusError) as e:
          ask(url, False)
        assert e.value.status_code == 503 and f"every runner is lost (REMOTE {lost.addr})" in str(e.value), str(e.value)
      assert lost.proc.wait(10) is not None
      t = time.perf_counter()
      rs.procs.append(back:=RunnerProc("-v", "--port", str(lost.port)))
      until_logged(log, f"metal_runner: runner {back.addr} answers again")
      assert ask(url, True) == ask(url, False) == cpu_served
      again = time.perf_counter() - t
    text = log.read_text()
  assert f"metal_runner: taking back runner {lost.addr} as REMOTE:1: placing the model again over the runner named" in text, text[-3000:]
  lines = [s for s in text.splitlines() if s.startswith("placement over")]
  assert len(lines) == 2 and all(s.startswith("placement over 1 runner: ") for s in lines), text[-3000:]
  print(f"one runner: the runner started again was serving {again:.1f} s after its start")

@pytest.mark.slow
@pytest.mark.parametrize("sig,mem", [("SIGKILL", None), ("SIGTERM", "9M")])
def test_a_runner_lost_mid_stream_ends_it_with_an_error_naming_it_then_the_rest_serve_if_they_can_and_it_is_taken_back(models, cpu_half_served,
                                                                                                                     tmp_path, sig, mem):
  """The stream ends at once with an error naming the runner lost; the server stays up; the next request places the model again over the
  runner that remains, with the same text, or, where that runner cannot hold it (--session-mem 9M), is refused with HTTP 503 that says
  which runner is lost and what is needed. Then the runner lost starts again at its address: a later request places the model over both
  again (the one back as a new device, its share of the weights sent to it), with the CPU device's text, and the 503s end."""
  import openai, os, signal, time, urllib.request
  opts = ["--session-mem", mem] if mem else []
  with Runners(2, *opts) as rs:
    app, log = ["--model", models["half"], *LOST_APP], tmp_path / "s.log"
    with served(["-m", "client", "run", "--runner", rs.addr], app, {}, log) as (url, _):
      c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
      before = ask_all(c)
      lost, n, t = rs.procs[1], 0, 0.0
      with pytest.raises(openai.APIError) as e:
        for _ in c.chat.completions.create(model="ggufgen-llama", messages=[{"role": "user", "content": "Hello world"}], temperature=0,
                                           max_tokens=100, stream=True):
          if (n:=n + 1) == 3:
            os.kill(lost.proc.pid, getattr(signal, sig))
            t = time.perf_counter()
      waited = time.perf_counter() - t
      assert n >= 3 and lost.addr in str(e.value), (n, str(e.value))
      assert waited < 5, waited   # an error, not a hang
      if mem is None:
        assert ask_all(c) == before
        recovered = time.perf_counter() - t
        assert f"lost REMOTE:1 {lost.addr}: placing the model again over the 1 runner(s) that remain" in log.read_text()
      else:
        for _ in range(2):   # every request while the runner is missing
          with pytest.raises(openai.APIStatusError) as e:
            ask_all(c)
          assert e.value.status_code == 503 and f"lost REMOTE:1 {lost.addr}, and the model does not fit" in str(e.value), str(e.value)
          recovered = time.perf_counter() - t
      assert lost.proc.wait(10) is not None
      # the runner again, at the same address: the server sees it answer, and the next request takes it back
      t = time.perf_counter()
      rs.procs.append(back:=RunnerProc("-v", *opts, "--port", str(lost.port)))
      assert back.addr == lost.addr
      seen = until_logged(log, f"metal_runner: runner {lost.addr} answers again")
      streamed = ask_all(c, stream=True)
      again = time.perf_counter() - t
      assert streamed == ask_all(c) == before == cpu_half_served, (streamed, before, cpu_half_served)
      with urllib.request.urlopen(url + "/models", timeout=5) as r: assert r.status == 200   # the server is up
    text = log.read_text()
    assert f"metal_runner: taking back runner {lost.addr} as REMOTE:2: placing the model again over all 2 runners named" in text, text[-3000:]
    lines = [s for s in text.splitlines() if s.startswith("placement over")]
    assert len(lines) == 3 - (mem is not None), text[-3000:]   # at start, over the one left (unless it could not hold it), over both again
    assert re.match(rf"placement over 2 runners: REMOTE {rs.procs[0].addr} blocks 0-\d and the embedding, [\d.]+ MiB; "
                    rf"REMOTE:2 {lost.addr} blocks \d-3 and the output norm and head, [\d.]+ MiB$", lines[-1]), lines[-1]
  # what each runner received (its log, at each session's end): the one back its share of the last placement, the one that stayed the
  # shares of every placement it was part of (the model's bytes each time; nothing cached without --cache-dir)
  got = [g / (1 << 20) for g in rs.bytes_in([0, 2])]
  stayed = sum(shares(ln)[0] for ln in lines)
  assert abs(got[1] - shares(lines[-1])[1]) <= 0.1 * shares(lines[-1])[1], (got, lines)
  assert stayed <= got[0] <= 1.1 * stayed, (got, lines)
  print(f"{sig}: the stream ended {waited:.3f} s after the signal; the next request answered {recovered:.1f} s after it"
        f"{' (HTTP 503)' if mem else ''}; the runner started again, the server saw it answer {seen:.1f} s later, and the first request "
        f"placed over both again was answered {again:.1f} s after its start")

@pytest.mark.slow
def test_an_error_in_the_middle_of_a_request_ends_it_with_that_error_and_the_next_places_the_model_again(models, cpu_served, tmp_path):
  """A MemoryError on the second runner half way through a step (LLM_APP_FAIL, tests/llm_app.py's fault injection), in a streamed
  request and in one not streamed: each ends with that error (an error event; HTTP 503), the next request places the model again over
  both runners and answers with the CPU device's text. Before, the handler died with it: the stream ended as if complete and the
  answer not streamed was a dropped connection. A body that is not JSON gets HTTP 400 naming the error, and changes nothing."""
  import openai, urllib.error, urllib.request
  with Runners(2) as rs:
    log = tmp_path / "s.log"
    with served(["-m", "client", "run", "--runner", rs.addr], ["--model", models["small"], "--max_context", CTX],
                {"LLM_APP_FAIL": "REMOTE:1@1,3"}, log) as (url, _):
      for stream in (True, False):
        with pytest.raises(openai.APIError) as e:
          ask(url, stream)
        assert getattr(e.value, "status_code", 503) == 503, str(e.value)
        assert re.search(r"metal_runner: the model failed in the middle of a request \(MemoryError: REMOTE:1: made to fail by LLM_APP_FAIL "
                         r"\(tests/llm_app.py\)\); the next request places it again", str(e.value)), str(e.value)
        assert ask(url, not stream) == cpu_served
      req = urllib.request.Request(url + "/chat/completions", data=b"{not json", headers={"Content-Type": "application/json"})
      with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(req, timeout=60)
      assert bad.value.code == 400 and "the request failed before the model ran (JSONDecodeError: " in bad.value.read().decode()
      assert ask(url, True) == ask(url, False) == cpu_served
    text = log.read_text()
  assert text.count("metal_runner: the last request failed: placing the model again over all 2 runners named") == 2, text[-3000:]
  assert text.count("Traceback") == 2 and "MemoryError" in text, text[-3000:]   # each failure's, once

@pytest.mark.slow
@pytest.mark.metal
def test_benchmark_over_two_metal_runners(models, cpu_benchmark):
  """On Linux two Metal emulator runners (a test harness running the kernels on the CPU), not a GPU."""
  from conftest import metal_runner_proc, needs_own_metal_runner
  needs_own_metal_runner()
  rs = [metal_runner_proc(), metal_runner_proc()]
  try:
    p = python("-m", "client", "run", "--runner", ",".join(r.addr for r in rs), "-m", "tinygrad.llm", "--model", models["small"],
               "--max_context", CTX, "--benchmark", "6", timeout=900)
    assert texts(p) == cpu_benchmark("small")
    assert placement_line(p.stderr).startswith(f"placement over 2 runners: METAL {rs[0].addr} blocks 0-1 and the embedding"), p.stderr[-2000:]
    assert "on METAL" in p.stdout
  finally:
    for r in rs: r.stop()

@pytest.mark.slow
@pytest.mark.metal
def test_serve_over_two_metal_runners_answers_with_the_cpu_devices_text(models, cpu_served, tmp_path):
  """The server through the openai client, streamed and not, over two Metal emulator runners on Linux (a test harness running the
  kernels on the CPU), not a GPU. By memory alone, as the CPU benchmark over two runners: the exact ranges are asserted."""
  from conftest import metal_runner_proc, needs_own_metal_runner
  needs_own_metal_runner()
  rs = [metal_runner_proc(), metal_runner_proc()]
  try:
    with served(["-m", "client", "run", "--runner", ",".join(r.addr for r in rs)], ["--model", models["small"], "--max_context", CTX],
                {"METAL_RUNNER_PLACEMENT": "memory"}, tmp_path / "s.log", timeout=900) as (url, _):
      streamed, whole = ask(url, True, timeout=600), ask(url, False, timeout=600)
    log = (tmp_path / "s.log").read_text()
    assert re.match(rf"placement over 2 runners: METAL {rs[0].addr} blocks 0-1 and the embedding, [\d.]+ MiB; "
                    rf"METAL:1 {rs[1].addr} blocks 2-3 and the output norm and head, [\d.]+ MiB$", placement_line(log)), log[-3000:]
    assert "max context 64 on METAL" in log
  finally:
    for r in rs: r.stop()
  assert len(cpu_served) > 0 and streamed == whole == cpu_served, (streamed, whole, cpu_served)
