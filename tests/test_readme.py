# The README's commands, each run by a test, so the landing page cannot go stale. Every line of its ```sh blocks is matched by
# its exact text (a trailing comment aside) to a case here: a command changed or added in the README and not here, or the other
# way round, fails test_every_readme_command_has_a_case. Where a command names a Mac, it runs on this machine with the Mac played
# by a runner on 127.0.0.1 (its `make -C daemon` is this machine's build: the CPU backend on Linux) and the Mac's and the host's
# home directories two temporary ones, so the token goes from one to the other as the README says. The commands CI itself
# is (./test.sh) or runs elsewhere (tests/mac_report.py, tests/test_mac_report.py; the pip install, tests/test_pip_install.py) are checked
# as text, not run again here.
import os, pathlib, re, select, shlex, signal, stat, subprocess
import pytest
from conftest import ROOT, stop

README = ROOT / "README.md"

QUICK_START = "./setup.sh && .venv/bin/python examples/train_mlp.py"
TEST_SH = "./test.sh"
MAC_REPORT = "./setup.sh && .venv/bin/python tests/mac_report.py"
ON_THE_MAC = ["make -C daemon",
              "head -c 32 /dev/urandom | base64 > ~/.metal_runner_token && chmod 600 ~/.metal_runner_token",
              "./daemon/metal_runner --host 0.0.0.0 --port 6667 --token-file ~/.metal_runner_token"]
ON_THE_HOST = ["scp mac.local:.metal_runner_token ~/ && chmod 600 ~/.metal_runner_token",
               ".venv/bin/metal-client probe mac.local",   # port 6667 and ~/.metal_runner_token by default
               ".venv/bin/metal-client run --runner mac.local myscript.py",
               # tinygrad's server listens on every interface: tests/test_llm.py runs it through tests/llm_app.py, bound to 127.0.0.1
               LLM_SERVE:=".venv/bin/metal-client run --runner mac.local -m tinygrad.llm --model ./model.gguf --serve 8000"]
# run by tests/test_pip_install.py, in a fresh venv outside the clone with the venv's bin first on PATH (as activated)
IN_YOUR_ENV = ["pip install /path/to/metal_runner", "metal-client run myscript.py"]
CASES = [QUICK_START, TEST_SH, MAC_REPORT, *ON_THE_MAC, *ON_THE_HOST, *IN_YOUR_ENV]   # in the README's order

# a tinygrad program as its user wrote it: it never names this project
MYSCRIPT = """\
from tinygrad import Device, Tensor
x = Tensor([[1.0, 2.0], [3.0, 4.0]])
print(Device.DEFAULT, (x @ x).sum().item())
"""

def sh_commands(text:str) -> list[str]:
  """The lines of the ```sh blocks, each without its trailing comment (two spaces or more, then #)."""
  blocks = re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S)
  return [re.sub(r"\s{2,}#.*$", "", ln).strip() for b in blocks for ln in b.splitlines() if ln.strip()]

def test_every_readme_command_has_a_case():
  assert sh_commands(README.read_text()) == CASES, "a README command without its case here (or a case the README no longer shows)"

def test_readme_is_a_landing_page():
  assert len(README.read_text().splitlines()) <= 250

def test_quick_start_and_test_sh_are_what_ci_runs():
  ci = (ROOT / ".ci" / "run").read_text().splitlines()
  assert ci[-1] == f"exec {TEST_SH}", ".ci/run no longer runs the README's test command"
  test_sh = (ROOT / "test.sh").read_text()
  # test.sh sets up as the README's first command does (with the test tools), an environment assignment or not before it
  assert re.search(r"^(\w+=\S* )*\./setup\.sh test$", test_sh, re.M) and '"$PY" -m pytest -q\n' in test_sh

def test_mac_report_command_is_the_scripts_own_and_is_run():
  # tests/test_mac_report.py runs the script in ./test.sh (against the Metal emulator); its docstring shows the README's command
  assert MAC_REPORT in (ROOT / "tests" / "mac_report.py").read_text()
  assert 'str(ROOT / "tests" / "mac_report.py")' in (ROOT / "tests" / "test_mac_report.py").read_text()

def test_llm_serve_command_is_what_test_llm_serves():
  # the README's server is tinygrad's own `-m tinygrad.llm`, which tests/llm_app.py runs with its bind address on loopback
  assert LLM_SERVE.split("-m tinygrad.llm ")[1].split(" --serve")[0] == "--model ./model.gguf"
  assert 'runpy.run_module("tinygrad.llm"' in (ROOT / "tests" / "llm_app.py").read_text()
  assert "def test_serve_answers_the_openai_client" in (ROOT / "tests" / "test_llm.py").read_text()

def test_pip_install_commands_are_run_in_a_fresh_venv():
  assert "IN_YOUR_ENV" in (ROOT / "tests" / "test_pip_install.py").read_text()

def readme_env(home:pathlib.Path) -> dict[str, str]:
  """The environment of a newcomer's shell: no runner named, no token, no device chosen."""
  drop = ("METAL_RUNNER", "METAL_RUNNER_TOKEN_FILE", "DEV", "DEBUG", "BEAM", "PYTHONPATH")
  return {**{k: v for k, v in os.environ.items() if k not in drop}, "HOME": str(home)}

def sh(cmd:str, home:pathlib.Path, cwd:pathlib.Path, timeout:float=120) -> subprocess.CompletedProcess:
  return subprocess.run(["sh", "-c", cmd], cwd=cwd, env=readme_env(home), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=timeout)

@pytest.mark.cpu_only
def test_quick_start():
  r = sh(QUICK_START, pathlib.Path.home(), ROOT, timeout=300)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  assert re.search(r"^test accuracy 0\.\d+", r.stdout, flags=re.M), r.stdout[-2000:]

def as_here(cmd:str, mac_home:pathlib.Path, port:int|None=None) -> str:
  """A README command with the Mac played here: its runner on 127.0.0.1 (port 0 picks a free one), scp a copy between the homes."""
  here = cmd.replace("--host 0.0.0.0 --port 6667", "--host 127.0.0.1 --port 0").replace("scp mac.local:", f"cp {shlex.quote(str(mac_home))}/")
  if port is not None: here = here.replace("mac.local", f"127.0.0.1:{port}")   # the Mac's runner here listens on a port of its own
  assert "0.0.0.0" not in here and "mac.local" not in here, here
  return here

@pytest.mark.cpu_only
def test_your_program_on_a_macs_gpu(tmp_path):
  mac, host, work = tmp_path / "mac", tmp_path / "host", tmp_path / "work"
  for d in (mac, host, work): d.mkdir()
  (work / "myscript.py").write_text(MYSCRIPT)
  venv = ROOT / ".venv"
  assert (venv / "bin" / "python").exists(), "the README's host commands use .venv: run ./setup.sh first"
  (work / ".venv").symlink_to(venv)

  # on the Mac, from the clone
  make, token, start = ON_THE_MAC
  r = sh(as_here(make, mac), mac, ROOT, timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  r = sh(as_here(token, mac), mac, ROOT)
  assert r.returncode == 0, r.stderr
  secret = mac / ".metal_runner_token"
  assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(secret.read_bytes().strip()) >= 32
  runner = subprocess.Popen(["sh", "-c", "exec " + as_here(start, mac)], cwd=ROOT, env=readme_env(mac), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    line = runner.stdout.readline() if select.select([runner.stdout], [], [], 20)[0] else ""
    assert (m := re.match(r"listening on 127\.0\.0\.1:(\d+)$", line.strip())), f"the runner did not start: {line!r}"
    port = int(m.group(1))

    # on the host: the token copied, the runner probed, the program run on it
    copy, probe, run = (as_here(c, mac, port) for c in ON_THE_HOST if c != LLM_SERVE)
    r = sh(copy, host, work)
    assert r.returncode == 0, r.stderr
    assert (host / ".metal_runner_token").read_bytes() == secret.read_bytes()
    assert stat.S_IMODE((host / ".metal_runner_token").stat().st_mode) == 0o600
    r = sh(probe, host, work)
    assert r.returncode == 0, r.stdout + r.stderr
    info = dict(re.findall(r"^(\w+) +(.+)$", r.stdout, flags=re.M))
    assert info["runner"] == f"127.0.0.1:{port}" and info["auth"] == "token accepted", r.stdout
    device = {"cpu": "REMOTE", "metal": "METAL"}[info["backend"]]
    r = sh(run, host, work)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.split() == [device, "54.0"], r.stdout + r.stderr[-2000:]
  finally:
    stop(runner)
    try: os.killpg(runner.pid, signal.SIGKILL)   # session processes left behind, as conftest.runner does
    except (ProcessLookupError, PermissionError): pass

LINK = re.compile(r"\]\(([^)\s]+)\)")

def anchors(md:str) -> set[str]:
  """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", md, flags=re.M)}

@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_lead_somewhere(page):
  """Every relative link of the README and the manuals names a file that exists, and a heading in it when it names one."""
  bad = []
  for target in LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.S)):
    if re.match(r"[a-z]+:", target): continue   # https:, mailto:
    path, _, frag = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists(): bad.append(f"{target}: no such file")
    elif frag and dest.suffix == ".md" and frag not in anchors(dest.read_text()): bad.append(f"{target}: no such heading")
  assert not bad, bad
