"""Runners by name (client/settings.py): ~/.metal_runner_config names each runner with its address, token file and the address other
runners reach it at; `metal-client run --runner studio1,studio2` and `metal-client probe studio1` use the names, names and addresses
mix in one list, and a file others may write is refused. The runners listen on 127.0.0.1 and are stopped by pid."""
import json, os, subprocess, sys
import pytest
from runner_proc import ROOT, runner

pytestmark = pytest.mark.cpu_only
TOKEN = b"settings test token"
METAL_CLIENT = os.path.join(os.path.dirname(sys.executable), "metal-client")
SHOW = """
import json, os
from tinygrad import Device, Tensor
out = {}
for d in ("REMOTE:0", "REMOTE:1"):
  out[d] = [Device[d].runner.addr, (Tensor([1.0, 2.0], device=d) + 1).tolist()]
print(json.dumps({"devs": out, "via": os.environ.get("METAL_RUNNER_PEER_VIA", "")}))
"""

def env_for(home) -> dict:
  drop = ("METAL_RUNNER", "METAL_RUNNER_TOKEN_FILE", "METAL_RUNNER_PEER_VIA", "METAL_RUNNER_CONFIG", "DEV", "DEBUG", "PYTHONPATH")
  return {**{k: v for k, v in os.environ.items() if k not in drop}, "HOME": str(home)}

@pytest.fixture
def home(tmp_path):
  (h:=tmp_path / "home").mkdir()
  return h

def write_config(home, text:str, mode:int=0o600):
  (c:=home / ".metal_runner_config").write_text(text)
  c.chmod(mode)
  return c

def test_runners_by_name_with_a_token_each_and_addresses_in_the_same_list(home, tmp_path):
  (tf:=tmp_path / "studio1.token").write_bytes(TOKEN)
  tf.chmod(0o600)
  (tmp_path / "show.py").write_text(SHOW)
  with runner("--token-file", str(tf)) as a, runner() as b:
    write_config(home, f"# two machines\nrunner studio1\n  address {a.addr}\n  token-file {tf}\n  peer-via 127.0.0.1:{a.port}\n")
    p = subprocess.run([METAL_CLIENT, "run", "--runner", f"studio1,{b.addr}", "show.py"], cwd=tmp_path, env=env_for(home),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["devs"] == {"REMOTE:0": [a.addr, [2.0, 3.0]], "REMOTE:1": [b.addr, [2.0, 3.0]]}, out
    assert out["via"] == f"{a.addr}=127.0.0.1:{a.port}", out
    p = subprocess.run([METAL_CLIENT, "probe", "studio1", "--json", "--pings", "0"], env=env_for(home), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout)["addr"] == a.addr and json.loads(p.stdout)["authenticated"], (p.stdout, p.stderr)

@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_a_config_others_may_write_is_refused(home, tmp_path, mode):
  with runner() as a:
    c = write_config(home, f"runner studio1\n  address {a.addr}\n", mode)
    p = subprocess.run([METAL_CLIENT, "run", "--runner", "studio1", "-m", "json.tool"], env=env_for(home), capture_output=True, text=True, timeout=60)
  assert p.returncode == 1 and p.stdout == "", (p.stdout, p.stderr)
  assert p.stderr.strip() == f"metal_runner: {c} may be written by others (mode {mode:04o}): chmod go-w {c}", p.stderr

@pytest.mark.parametrize("text,says", [("address a:1\n", "'address' before any 'runner NAME' line"), ("runner x\n", "runner x has no 'address"),
                                       ("runner x\n  adress a:1\n", "unknown setting 'adress'"), ("runner x y\n", "'runner' takes one value")])
def test_a_config_line_it_cannot_read_is_named(home, text, says):
  c = write_config(home, text)
  p = subprocess.run([METAL_CLIENT, "run", "--runner", "x", "-m", "json.tool"], env=env_for(home), capture_output=True, text=True, timeout=60)
  assert p.returncode == 1 and says in p.stderr and str(c) in p.stderr, p.stderr

# ---- the settings as one value (client/settings.py), in this process: no runner, no subprocess

def test_settings_are_parsed_once_per_environment_and_name_what_the_user_typed(monkeypatch):
  from client import settings
  monkeypatch.setenv("METAL_RUNNER", " a, [::1]:7000 ")
  monkeypatch.setenv("METAL_RUNNER_TOKEN_FILE", "a.token,")   # "" for the second runner: none
  for var in (settings.RUN_OPTIONS, settings.CLIENT_RUN, "METAL_RUNNER_PEER_VIA"): monkeypatch.delenv(var, raising=False)
  s = settings.from_env()
  assert s is settings.from_env(), "parsed again for the same environment"
  assert s.runners == ("a:6667", "[::1]:7000") and not s.auto and s.token_files == ("a.token", "") and s.peer_via == ()
  assert s.token_file("a") == ("a.token", "METAL_RUNNER_TOKEN_FILE") and s.token_file("[::1]:7000") is None
  assert s.named("METAL_RUNNER", "a") == "METAL_RUNNER=a" and s.give("METAL_RUNNER_TOKEN_FILE", "FILE") == "set METAL_RUNNER_TOKEN_FILE=FILE"
  monkeypatch.setenv(settings.RUN_OPTIONS, "--runner --token-file")   # as python -m client run sets them
  monkeypatch.setenv(settings.CLIENT_RUN, "1")
  t = settings.from_env()
  assert t is not s and t.runners == s.runners and t.named("METAL_RUNNER", "a") == "--runner a"
  assert t.setting("METAL_RUNNER_TOKEN_FILE") == "--token-file" and t.token_file("a") == ("a.token", "--token-file")
  assert t.give("METAL_RUNNER_TOKEN_FILE", "FILE") == "pass --token-file FILE" and settings.named("METAL_RUNNER", "a") == "--runner a"
  monkeypatch.setenv("METAL_RUNNER", "a")
  with pytest.raises(settings.TokenFileError) as e: settings.token_file("a")
  assert str(e.value) == ("--token-file a.token, names 2 token files, one per runner, but --runner a names 1 runner address: give one file "
                          "per address, in the same order, or one file for all"), str(e.value)
  monkeypatch.setenv("METAL_RUNNER", "AUTO")
  monkeypatch.setenv("METAL_RUNNER_PEER_VIA", "a:1=b:2,junk,c:3=d:4")
  assert (u:=settings.from_env()).auto and u.runners == () and dict(u.peer_via) == {"a:1": "b:2", "c:3": "d:4"}

def test_client_run_options_go_into_the_environment_for_children():
  from client import settings
  env: dict[str, str] = {}
  settings.apply_options({"--runner": "a,b", "--token-file": "x, ~/y", "--listen": "0.0.0.0"}, env)
  assert env == {"METAL_RUNNER": "a,b", "METAL_RUNNER_TOKEN_FILE": f"{os.path.abspath('x')},{os.path.expanduser('~/y')}",
                 settings.RUN_OPTIONS: "--runner --token-file --listen"}, env
  assert settings.from_env(env).setting("METAL_RUNNER") == "--runner" and settings.from_env(env).runners == ("a:6667", "b:6667")

def test_the_settings_names_keep_their_old_homes():
  from client import config_file, connection, errors, settings
  moved = ("token_file", "read_token", "held_token", "named", "setting", "RUN_OPTIONS", "DEFAULT_TOKEN_FILE", "DEFAULT_SETTING")
  assert all(getattr(connection, n) is getattr(settings, n) for n in moved)
  assert settings.load is config_file.load and settings.Named is config_file.Named and settings.SettingsError is errors.SettingsError
