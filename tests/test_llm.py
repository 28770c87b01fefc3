# tinygrad's own LLM app (python -m tinygrad.llm: chat, --benchmark, --serve) through `python -m client run` on a CPU runner, with a small
# GGUF made here (tests/ggufgen.py: llama, random weights, float16 and Q8_0), against tinygrad's own CPU device for the same tokens.
# The stand-in for tinygrad.llm.kernels, which tinygrad 0.14.0's wheel lacks (client/llm_kernels.py), checked on its own first.
import re, subprocess, sys
import pytest
from conftest import ROOT
from runner_proc import runner, until
from ggufgen import write
from llm_app import env_for, served

CTX = "64"

def python(*argv:str, env:dict|None=None, stdin:str|None=None, timeout:float=180) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *argv], env=env_for(env or {}), input=stdin, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))

@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str: return write(str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))

@pytest.fixture(scope="module")
def logged():
  """A runner logging each program it loads (-vv): the proof that the kernels ran there."""
  with runner("-vv") as r: yield r

def sessions(r) -> set[int]: return {int(n) for n in re.findall(r"session (\d+): accepted a connection", r.log_text(0))}

def own_log(r, before:set[int]) -> dict[int, str]:
  """The log lines of each session the runner accepted since `before` (sessions()) was taken, once each has ended: another test's never
  count (the runner is shared by the module)."""
  def lines() -> dict[int, str]:
    log = r.log_text(0).splitlines()
    return {n: "\n".join(l for l in log if f" session {n}: " in l) for n in sessions(r) - before}
  assert until(lambda: all(": ended: " in t for t in lines().values()), 10), lines()
  return lines()

def loaded(log:str) -> list[str]: return re.findall(r"session \d+: loaded (\S+)", log)

# *** the stand-in

STAND_IN = """
import sys, client.llm_kernels as k
k.install(); k.install()
from tinygrad import nn
import tinygrad.llm.model as m, tinygrad.llm.kernels.amd as amd
l = amd.Linear(64, 32, bias=False)
print(issubclass(amd.Linear, nn.Linear), m.Linear is amd.Linear, (l.in_features, l.out_features), l.ggml_type,
      amd.amd_custom_kernels_supported("CPU"), amd.amd_custom_kernels_supported("AMD"), sum(isinstance(f, k.StandIn) for f in sys.meta_path))
try: amd.flash_attention(None, None, 0)
except NotImplementedError as e: print(e)
"""

def test_the_stand_in_is_what_the_module_means_off_amd_gpus():
  p = python("-c", STAND_IN)
  assert p.returncode == 0, p.stderr
  assert p.stdout.splitlines() == ["True True (64, 32) None False False 1",
                                   "flash_attention: the AMD kernels are not in this tinygrad (client/llm_kernels.py stands in)"]
  assert p.stderr == ""   # said only at DEBUG>=1

def test_the_stand_in_steps_aside_once_the_module_exists(tmp_path):
  (tmp_path / "kernels").mkdir()
  (tmp_path / "kernels" / "__init__.py").write_text("")
  (tmp_path / "kernels" / "amd.py").write_text("REAL = True\n")
  p = python("-c", f"import client.llm_kernels as k, tinygrad.llm as t; t.__path__.append({str(tmp_path)!r}); k.install()\n"
                   "import tinygrad.llm.kernels.amd as amd; print(getattr(amd, 'REAL', False), hasattr(amd, 'Linear'))", env={"DEBUG": "1"})
  assert (p.returncode, p.stdout, p.stderr) == (0, "True False\n", "")

CHILD = """
import subprocess, sys
import tinygrad.llm.model
print(subprocess.run([sys.executable, "-c", "import tinygrad.llm.model as m; print('child', m.Linear.__module__)"]).returncode)
"""

@pytest.mark.parametrize("debug", ["0", "1"])
def test_client_run_stands_in_for_the_program_and_its_children_and_says_so_once(tmp_path, logged, debug):
  (tmp_path / "prog.py").write_text(CHILD)
  p = python("-m", "client", "run", "--runner", logged.addr, str(tmp_path / "prog.py"), env={"DEBUG": debug})
  assert p.returncode == 0, p.stderr
  assert [s for s in p.stdout.splitlines() if not s.startswith("opened device")] == ["child tinygrad.llm.kernels.amd", "0"]
  assert p.stderr.count("client/llm_kernels.py stands in") == int(debug), p.stderr

def test_without_the_stand_in_tinygrad_llm_does_not_start():
  p = python("-m", "tinygrad.llm", "--help")
  if p.returncode == 0: pytest.skip("this tinygrad has tinygrad.llm.kernels: the stand-in is not needed")
  assert "No module named 'tinygrad.llm.kernels'" in p.stderr

# *** tinygrad.llm through a runner

def test_help_through_client_run(logged):
  """`client run` connects to the runner before the program starts (a runner that cannot be used stops it): the help comes after a
  session of the runner's, with nothing loaded."""
  before = sessions(logged)
  p = python("-m", "client", "run", "--runner", logged.addr, "-m", "tinygrad.llm", "--help")
  assert p.returncode == 0 and "--serve" in p.stdout, p.stderr
  own = own_log(logged, before)
  assert len(own) == 1 and all("client connected from 127.0.0.1" in t and not loaded(t) for t in own.values()), own

@pytest.mark.slow
def test_benchmark_decodes_on_the_runner(model, logged):
  before = sessions(logged)
  p = python("-m", "client", "run", "--runner", logged.addr, "-m", "tinygrad.llm", "--model", model, "--max_context", CTX, "--benchmark", "6")
  assert p.returncode == 0, p.stderr
  assert re.search(r"using model \"ggufgen-llama\" with [\d,]+ bytes and 115,008 params, max context 64 on REMOTE\n", p.stdout), p.stdout
  assert len(re.findall(r"tok/s", p.stdout)) == 6, p.stdout
  own = own_log(logged, before)   # this program's sessions only: the module's other tests load kernels on this runner too
  assert any(loaded(t) for t in own.values()), f"no kernel was loaded on the runner by this program's sessions: {own}"

CHAT = "Hello world\n"

def answers(p:subprocess.CompletedProcess) -> list[str]:
  """The replies of the chat, each ended by the next prompt: one turn (random weights rarely end a reply, so it runs to the end of the
  context, which a second turn would exceed), then the prompt that met the end of stdin."""
  assert p.returncode == 0, p.stderr
  return p.stdout.split(">>> ")[1:]

@pytest.fixture(scope="module")
def cpu_chat(model) -> list[str]:
  p = python("-m", "client.llm_kernels", "--model", model, "--max_context", CTX, stdin=CHAT, env={"DEV": "CPU"})
  assert "on CPU" in p.stdout
  return answers(p)

@pytest.mark.slow
def test_chat_on_stdin_answers_with_the_cpu_devices_text(model, logged, cpu_chat):
  p = python("-m", "client", "run", "--runner", logged.addr, "-m", "tinygrad.llm", "--model", model, "--max_context", CTX, stdin=CHAT)
  assert "on REMOTE" in p.stdout
  assert len(answers(p)) == 2 and len(answers(p)[0]) > 20, p.stdout
  assert answers(p) == cpu_chat

@pytest.mark.slow
@pytest.mark.metal
def test_chat_on_a_metal_runner_answers_with_the_cpu_devices_text(model, metal_addr, cpu_chat):
  """On Linux the Metal emulator (a test harness), not a GPU."""
  p = python("-m", "client", "run", "--runner", metal_addr, "-m", "tinygrad.llm", "--model", model, "--max_context", CTX, stdin=CHAT,
             timeout=600)
  assert "on METAL" in p.stdout
  assert answers(p) == cpu_chat

def ask(url:str, stream:bool) -> tuple[str, str]:
  import openai
  c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
  msgs = [{"role": "user", "content": "Hello world"}]
  if not stream:
    r = c.chat.completions.create(model="ggufgen-llama", messages=msgs, temperature=0, max_tokens=12)
    assert r.usage.completion_tokens == 12 or r.choices[0].finish_reason == "stop"
    return r.choices[0].message.content or "", r.choices[0].finish_reason
  text, finish = "", None
  for ch in c.chat.completions.create(model="ggufgen-llama", messages=msgs, temperature=0, max_tokens=12, stream=True):
    if ch.choices and ch.choices[0].delta.content: text += ch.choices[0].delta.content
    if ch.choices and ch.choices[0].finish_reason: finish = ch.choices[0].finish_reason
  return text, finish

@pytest.mark.slow
def test_serve_answers_the_openai_client_with_the_cpu_devices_tokens(model, logged, tmp_path):
  args = ["--model", model, "--max_context", CTX]
  with served(["-m", "client", "run", "--runner", logged.addr], args, {}, tmp_path / "runner.log") as (url, _):
    streamed, whole = ask(url, True), ask(url, False)
  with served([], args, {"DEV": "CPU"}, tmp_path / "cpu.log") as (url, _): cpu = ask(url, False)
  assert "max context 64 on REMOTE" in (tmp_path / "runner.log").read_text() and "max context 64 on CPU" in (tmp_path / "cpu.log").read_text()
  assert len(whole[0]) > 0 and whole[1] in ("length", "stop")
  assert streamed == whole == cpu, (streamed, whole, cpu)
