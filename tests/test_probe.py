"""python -m client probe (client/__main__.py) against real runners: what it prints, --json, and the exit code and message for a
runner that refuses the token or wants one, a port where nothing listens, and a peer that is not a metal_runner."""
import http.server, json, os, socket, subprocess, sys, threading
import pytest
from runner_proc import RunnerProc, ROOT

pytestmark = pytest.mark.cpu_only
TOKEN = b"probe test token"

def probe(*args:str, env:dict|None=None) -> subprocess.CompletedProcess:
  """No token unless args or env name one (set and empty, METAL_RUNNER_TOKEN_FILE means not even ~/.metal_runner_token); in env a value
  of None unsets the variable."""
  e = {**os.environ, "PYTHONPATH": str(ROOT), "METAL_RUNNER_TOKEN_FILE": "", **(env or {})}
  return subprocess.run([sys.executable, "-m", "client", "probe", *args], capture_output=True, text=True, timeout=60,
                        env={k: v for k, v in e.items() if v is not None})

@pytest.fixture(scope="module")
def plain():
  r = RunnerProc()
  yield r
  r.stop()

@pytest.fixture(scope="module")
def authed(tmp_path_factory):
  tf = tmp_path_factory.mktemp("probe") / "token"
  tf.write_bytes(TOKEN + b"\n")
  tf.chmod(0o600)   # the runner and the client refuse a token others can read
  r = RunnerProc("--token-file", str(tf))
  r.token_file = tf
  yield r
  r.stop()

def test_probe_prints_what_the_runner_is(plain):
  p = probe(plain.addr, "--size", "1M")
  assert p.returncode == 0, p.stderr
  rows = dict(l.split(None, 1) for l in p.stdout.splitlines() if " " in l)
  assert rows["runner"] == plain.addr and rows["backend"] == "cpu" and rows["protocol"].startswith("version 1")
  assert rows["arch"] in ("x86_64", "arm64", "riscv64") and rows["auth"] == "none required" and "cpu_image" in rows["caps"]
  assert rows["rtt"].endswith("(20 pings)") and "GB/s (1 MiB, median of 3)" in rows["write"] and "GB/s" in rows["read"]

def test_probe_json(plain):
  p = probe(plain.addr, "--json", "--pings", "5", "--size", "256K", "--repeat", "2")
  assert p.returncode == 0, p.stderr
  d = json.loads(p.stdout)
  assert d["addr"] == plain.addr and d["backend"] == "cpu" and d["protocol_version"] == 1 and d["caps"] == ["unified", "cpu_image"]
  assert d["limits"]["maxhandles"] == 65536 and d["limits"]["ncores"] >= 1 and d["limits"]["memory"] > 0 and d["cpu"]
  assert d["rtt_us"]["pings"] == 5 and 0 < d["rtt_us"]["min"] <= d["rtt_us"]["median"]
  assert d["size"] == 256 << 10 and d["write_GBps"] > 0 and d["read_GBps"] > 0

def test_probe_without_measurements(plain):
  d = json.loads(probe(plain.addr, "--json", "--pings", "0").stdout)
  assert d["backend"] == "cpu" and "rtt_us" not in d and "write_GBps" not in d

def test_probe_with_the_token(authed):
  p = probe(authed.addr, "--token-file", str(authed.token_file), "--json", "--pings", "3", "--size", "64K")
  assert p.returncode == 0, p.stderr
  d = json.loads(p.stdout)
  assert d["authenticated"] and "auth" in d["caps"]
  # the environment variable the library reads works too
  p = probe(authed.addr, "--pings", "0", env={"METAL_RUNNER_TOKEN_FILE": str(authed.token_file)})
  assert p.returncode == 0 and "token accepted" in p.stdout, p.stderr

def test_probe_with_a_wrong_token_names_the_file_and_the_setting(authed, tmp_path):
  (bad := tmp_path / "bad").write_bytes(b"not the token")
  bad.chmod(0o600)
  p = probe(authed.addr, "--token-file", str(bad), "--json")
  assert p.returncode == 4, (p.stdout, p.stderr)
  assert f"refused the token from --token-file {bad}" in p.stderr and "wrong token" in p.stderr, p.stderr
  assert json.loads(p.stdout)["exit"] == 4
  p = probe(authed.addr, env={"METAL_RUNNER_TOKEN_FILE": str(bad)})
  assert p.returncode == 4 and f"refused the token from METAL_RUNNER_TOKEN_FILE={bad}" in p.stderr, p.stderr

def test_probe_takes_the_token_in_home_when_none_is_named(authed, tmp_path):
  (tmp_path / ".metal_runner_token").write_bytes(authed.token_file.read_bytes())
  (tmp_path / ".metal_runner_token").chmod(0o600)
  p = probe(authed.addr, "--pings", "0", env={"HOME": str(tmp_path), "METAL_RUNNER_TOKEN_FILE": None})
  assert p.returncode == 0 and "token accepted" in p.stdout, p.stderr
  p = probe(authed.addr, "--pings", "0", env={"HOME": str(tmp_path)})   # set and empty: no token at all
  assert p.returncode == 4 and "the runner requires a token" in p.stderr and "~/.metal_runner_token" in p.stderr, p.stderr

def test_probe_refuses_a_token_file_others_can_read(authed, tmp_path):
  (tf := tmp_path / "token").write_bytes(TOKEN)
  tf.chmod(0o640)
  p = probe(authed.addr, "--token-file", str(tf))
  assert p.returncode == 4 and f"the token file {tf} (--token-file) is open to group or others (mode 0640)" in p.stderr, p.stderr
  assert p.stderr.rstrip().endswith(f"chmod 600 {tf}"), p.stderr

def test_probe_without_a_token_where_one_is_needed_names_its_option(authed):
  p = probe(authed.addr)
  assert p.returncode == 4 and "requires a token: pass --token-file FILE" in p.stderr, (p.stdout, p.stderr)
  assert "token=" not in p.stderr   # the library's way, not the command line's

def test_probe_with_a_token_refuses_a_runner_that_asks_for_none(plain, authed):
  p = probe(plain.addr, "--token-file", str(authed.token_file))
  assert p.returncode == 4 and "did not authenticate" in p.stderr and "auth" not in p.stdout, (p.stdout, p.stderr)
  assert f"--token-file {authed.token_file}" in p.stderr and "impostor" in p.stderr, p.stderr

@pytest.mark.parametrize("bad", ["missing", "empty"])
def test_probe_with_an_unusable_token_file(bad, tmp_path, authed):
  tf = tmp_path / "token"
  if bad == "empty": tf.write_bytes(b"\n"); tf.chmod(0o600)
  for args, env, named in [(("--token-file", str(tf)), None, "--token-file"), ((), {"METAL_RUNNER_TOKEN_FILE": str(tf)}, "METAL_RUNNER_TOKEN_FILE")]:
    p = probe(authed.addr, *args, env=env)
    assert p.returncode == 4 and f"the token file {tf} ({named})" in p.stderr, (p.stdout, p.stderr)
    assert len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr

def test_probe_unreachable():
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
  s.close()   # nothing listens there now
  p = probe(f"127.0.0.1:{port}", "--json")
  assert p.returncode == 3 and "unreachable" in p.stderr and "nothing listens on that port" in p.stderr, (p.stdout, p.stderr)
  assert json.loads(p.stdout)["error"].startswith(f"127.0.0.1:{port} is unreachable")

def test_probe_not_a_metal_runner():
  """A server that answers something else (here an HTTP-like reply) is named as not a metal_runner."""
  srv = socket.socket()
  srv.bind(("127.0.0.1", 0))
  srv.listen(1)
  def serve():
    c, _ = srv.accept()
    c.recv(100)
    c.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
    c.close()
  t = threading.Thread(target=serve, daemon=True)
  t.start()
  try: p = probe(f"127.0.0.1:{srv.getsockname()[1]}", "--timeout", "5")
  finally: srv.close()
  assert p.returncode == 5 and "is not a metal_runner (it answered 'HTTP/1.0 400 Bad Request')" in p.stderr, (p.stdout, p.stderr)

def test_probe_an_http_server_at_once():
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  try: p = probe(f"127.0.0.1:{srv.server_address[1]}", "--json")   # --timeout 10
  finally: srv.shutdown(); srv.server_close()
  assert p.returncode == 5 and "is not a metal_runner (it answered '<!DOCTYPE HTML>')" in p.stderr, (p.stdout, p.stderr)
  assert json.loads(p.stdout)["exit"] == 5

def test_probe_a_server_that_never_answers():
  ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)   # the kernel accepts; nobody reads or answers
  try: p = probe(f"127.0.0.1:{ls.getsockname()[1]}", "--timeout", "1")
  finally: ls.close()
  assert p.returncode == 5 and "accepted the connection but never answered the handshake" in p.stderr, (p.stdout, p.stderr)

def test_probe_bad_arguments():
  p = probe("127.0.0.1:http")
  assert p.returncode == 2 and "is not HOST:PORT" in p.stderr, p.stderr
  p = probe("::1")
  assert p.returncode == 2 and "goes in brackets" in p.stderr, p.stderr
  p = probe("127.0.0.1:66677")
  assert p.returncode == 2 and "port 66677 out of range 1-65535" in p.stderr, p.stderr
  assert probe("127.0.0.1:1", "--size", "lots").returncode == 2

def test_probe_a_host_alone_at_the_default_port():
  p = probe("macbok.invalid")   # .invalid never resolves (RFC 6761): unreachable, at port 6667, not a usage error
  assert p.returncode == 3 and "macbok.invalid:6667 is unreachable" in p.stderr, p.stderr
  assert "the host name macbok.invalid does not resolve" in p.stderr, p.stderr   # as run says it
