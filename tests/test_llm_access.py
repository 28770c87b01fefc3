"""tinygrad.llm's server under `metal-client run -m tinygrad.llm --serve PORT` (client/llm_access.py): it listens on 127.0.0.1 unless
--listen names another address (tinygrad 0.14's own listens on every interface while it prints 127.0.0.1), says where, and with
--api-key-file answers only requests that carry the key as `Authorization: Bearer` (the openai client's api_key=). Every address used
here is a loopback one: 127.0.0.2 stands for "another interface" (a socket bound to 127.0.0.1 does not answer there, one bound to
every interface does). The runner and the servers are stopped by pid."""
import contextlib, json, os, signal, socket, subprocess, sys, time, urllib.error, urllib.request
import pytest
from ggufgen import write
from llm_app import env_for, free_port
from runner_proc import runner

pytestmark = pytest.mark.cpu_only
METAL_CLIENT = os.path.join(os.path.dirname(sys.executable), "metal-client")

@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str: return write(str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))

@pytest.fixture(scope="module")
def shared():
  with runner() as r: yield r

@contextlib.contextmanager
def serving(r, model:str, log, *opts:str, host:str="127.0.0.1", key:str|None=None):
  """metal-client run --runner R OPTS -m tinygrad.llm --model M --serve PORT, once /v1/models answers at host; yields (port, log text)."""
  port = free_port()
  with open(log, "w") as out:
    p = subprocess.Popen([METAL_CLIENT, "run", "--runner", r.addr, *opts, "-m", "tinygrad.llm", "--model", model, "--max_context", "64",
                          "--serve", str(port)], env=env_for({}), stdout=out, stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 300
    while True:
      assert p.poll() is None, f"the server exited {p.returncode}: {log.read_text()[-3000:]}"
      assert time.monotonic() < deadline, "the server did not answer in 300 s"
      with contextlib.suppress(OSError):
        if get(host, port, "/v1/models", key)[0] == 200: break
      time.sleep(0.2)
    yield port, log.read_text()
  finally:
    os.kill(p.pid, signal.SIGTERM)   # as systemctl stop: it ends as the signal ends it, and leaves nothing behind to warn about
    try: assert p.wait(20) == -signal.SIGTERM
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()
  assert "resource_tracker" not in log.read_text(), log.read_text()[-2000:]

def get(host:str, port:int, path:str, key:str|None=None, body:dict|None=None) -> tuple[int, dict]:
  req = urllib.request.Request(f"http://{host}:{port}{path}", data=json.dumps(body).encode() if body else None,
                               headers={**({"Authorization": f"Bearer {key}"} if key else {}), "Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=60) as resp: return resp.status, json.loads(resp.read())
  except urllib.error.HTTPError as e: return e.code, json.loads(e.read())

def answers(host:str, port:int) -> bool:
  try: socket.create_connection((host, port), timeout=2).close()
  except OSError: return False
  return True

def test_the_server_listens_on_loopback_unless_told_and_says_so(shared, model, tmp_path):
  with serving(shared, model, tmp_path / "a.log") as (port, log):
    assert answers("127.0.0.1", port) and not answers("127.0.0.2", port), "the server answers beyond the address it says"
    assert f"the server listens on http://127.0.0.1:{port}/v1 (this machine only" in log and "no API key" in log, log
    assert get("127.0.0.1", port, "/v1/models")[0] == 200
  with serving(shared, model, tmp_path / "b.log", "--listen", "127.0.0.2", host="127.0.0.2") as (port, log):
    assert answers("127.0.0.2", port) and not answers("127.0.0.1", port)
    assert f"the server listens on http://127.0.0.2:{port}/v1" in log, log

def test_an_api_key_is_required_of_every_request(shared, model, tmp_path):
  (kf:=tmp_path / "api.key").write_text("sk-a-key-for-the-tests\n")
  kf.chmod(0o600)
  with serving(shared, model, tmp_path / "s.log", "--api-key-file", str(kf), key="sk-a-key-for-the-tests") as (port, log):
    assert "requests need the API key" in log, log
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    for key in (None, "sk-wrong"):
      code, err = get("127.0.0.1", port, "/v1/models", key)
      assert code == 401 and err["error"]["code"] == "invalid_api_key", (code, err)
      assert get("127.0.0.1", port, "/v1/chat/completions", key, chat)[0] == 401
    import openai
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-a-key-for-the-tests")
    assert c.chat.completions.create(**chat).choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.AuthenticationError):
      openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-wrong").chat.completions.create(**chat)

def test_a_key_file_others_may_read_is_refused_and_the_options_need_the_server(shared, model, tmp_path):
  (kf:=tmp_path / "api.key").write_text("sk-k\n")
  kf.chmod(0o644)
  p = subprocess.run([METAL_CLIENT, "run", "--runner", shared.addr, "--api-key-file", str(kf), "-m", "tinygrad.llm", "--model", model,
                      "--serve", str(free_port())], env=env_for({}), capture_output=True, text=True, timeout=120)
  assert p.returncode == 1 and f"chmod 600 {kf}" in p.stderr, p.stderr[-2000:]
  p = subprocess.run([METAL_CLIENT, "run", "--runner", shared.addr, "--listen", "0.0.0.0", "-m", "json.tool"], env=env_for({}),
                     capture_output=True, text=True, timeout=60)
  assert p.returncode == 2 and "--listen applies to -m tinygrad.llm --serve only" in p.stderr, p.stderr
