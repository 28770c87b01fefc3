"""Authentication: daemon/sha256.c against the published test vectors, the client library's token, what is logged, and who may
listen where without a token. The token exchange itself (protocol.md, Tauth and Authentication) is a conformance case
(tests/conformance/test_handshake.py).

sha256.c is compiled with cffi into tests/.build (like tests/cproto.py does with proto.c); its prototypes are read from the
"sha256.c" section of metal_runner.h, so the header stays the only declaration. The end-to-end tests compute the MACs the
way protocol.md says, with Python's hmac: a client that follows the spec must get in, anything else must not.
"""
import hashlib, hmac, os, socket, subprocess, threading
import pytest
from client import protocol as P
from client import connection as conn
from runner_proc import runner, build, ROOT
from wire import Raw
from cproto import cffi_module

pytestmark = pytest.mark.cpu_only

DAEMON = ROOT / "daemon"
TOKEN = b"s3cret token for the tests"
AUTH_CLIENT, AUTH_SERVER = b"metal_runner-auth-v1 client", b"metal_runner-auth-v1 server"

# ---- SHA-256 and HMAC-SHA256 in C

def sha_lib():
  """(ffi, lib) for daemon/sha256.c; its prototypes are the "sha256.c" section of metal_runner.h."""
  cdef = (DAEMON / "metal_runner.h").read_text().split("/* sha256.c */", 1)[1].split("#endif", 1)[0]
  return cffi_module("_sha256_cffi", cdef, "metal_runner.h", ["sha256.c", "sha256_hw.c"], ["-D_GNU_SOURCE"])

def c_sha256(msg:bytes) -> str:
  ffi, lib = sha_lib()
  out = ffi.new("uint8_t[32]")
  lib.sha256(msg, len(msg), out)
  return bytes(out).hex()

def c_hmac(key:bytes, msg:bytes) -> str:
  ffi, lib = sha_lib()
  out = ffi.new("uint8_t[32]")
  lib.hmac_sha256(key, len(key), msg, len(msg), out)
  return bytes(out).hex()

# FIPS 180-4 examples (NIST CSRC "SHA256.pdf", "SHA2_Additional.pdf")
SHA256_VECTORS = [
  (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
  (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
  (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
  (b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
   "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"),
  (b"a" * 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
]

@pytest.mark.parametrize("msg,digest", SHA256_VECTORS, ids=["empty", "abc", "448-bit", "896-bit", "million-a"])
def test_sha256_fips_180_4_vectors(msg, digest):
  assert c_sha256(msg) == digest

def test_sha256_every_length_around_the_padding_boundaries():
  """Lengths 0..200 cover 55/56/63/64-byte tails, where padding spills into a second block."""
  data = bytes(range(256))
  for n in range(201): assert c_sha256(data[:n]) == hashlib.sha256(data[:n]).hexdigest(), n

# RFC 4231 section 4: (key, data, HMAC-SHA-256); test case 5 is specified truncated to 128 bits
RFC4231 = [
  (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
  (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
  (b"\xaa" * 20, b"\xdd" * 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
  (bytes(range(1, 26)), b"\xcd" * 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
  (b"\x0c" * 20, b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
  (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
   "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
  (b"\xaa" * 131, b"This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed "
                  b"before being used by the HMAC algorithm.", "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
]

@pytest.mark.parametrize("key,data,mac", RFC4231, ids=[f"case{i}" for i in range(1, 8)])
def test_hmac_sha256_rfc4231(key, data, mac):
  assert c_hmac(key, data).startswith(mac) and len(mac) in (32, 64)

def test_hmac_keys_around_the_block_size():
  """64-byte keys are used as they are, 65-byte keys are hashed first."""
  for n in (0, 1, 32, 63, 64, 65, 200):
    key = bytes(range(n))
    assert c_hmac(key, b"metal_runner") == hmac.new(key, b"metal_runner", hashlib.sha256).hexdigest(), n

# ---- the token exchange, end to end

def client_mac(token:bytes, snonce:bytes, cnonce:bytes) -> bytes: return hmac.new(token, AUTH_CLIENT + snonce + cnonce, hashlib.sha256).digest()

def send_auth(c:Raw, token:bytes, cnonce:bytes|None=None, mac:bytes|None=None) -> tuple[int, bytes]:
  cnonce = os.urandom(32) if cnonce is None else cnonce
  return c.req(P.TAUTH, cnonce=cnonce, mac=client_mac(token, c.info["nonce"], cnonce) if mac is None else mac), cnonce

@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
  p = tmp_path_factory.mktemp("auth") / "token"
  p.write_bytes(TOKEN + b"\n")  # an editor's trailing newline is not part of the secret
  p.chmod(0o600)   # the runner and the client refuse a token others can read
  return p

@pytest.fixture(scope="module", params=["process", "thread"])
def ar(request, token_file):
  with runner("--isolation", request.param, "--token-file", str(token_file), "-v") as r: yield r

def test_a_failed_authentication_is_logged_with_the_peer(ar):
  """The exchange itself (EAUTH, the wait, replay, ESTATE before Tauth) is checked by tests/conformance (Authentication)."""
  c = Raw(ar.addr)
  tag, _ = send_auth(c, b"guess")
  assert c.error()[:2] == (P.EAUTH, tag)
  log = ar.log_text()
  assert "authentication failed from 127.0.0.1" in log and f"session {c.info['session']}" in log
  assert TOKEN.decode() not in log and c.info["nonce"].hex() not in log

def test_runner_client_with_a_token(ar, monkeypatch):
  monkeypatch.delenv("METAL_RUNNER_TOKEN_FILE", raising=False)
  with conn.Runner(ar.addr, token=TOKEN, timeout=10) as r:
    h = r.new_handle()
    r.alloc(h, 8); r.write(h, 0, b"12345678")
    out = bytearray(8); r.read(h, 0, memoryview(out))
    assert out == b"12345678"
  with pytest.raises(conn.RunnerError) as e: conn.Runner(ar.addr, token=b"guess", timeout=10)
  assert e.value.code == P.EAUTH
  with pytest.raises(conn.RunnerError) as e: conn.Runner(ar.addr, timeout=10)
  assert e.value.code == P.EAUTH and "requires a token" in str(e.value)

# ---- who may listen where without a token (these daemons exit before they bind, or fail to bind)

def run_daemon(*args, timeout:float=10) -> subprocess.CompletedProcess:
  """Run the daemon expecting it to exit by itself; subprocess.run kills it (by pid) if it does not."""
  return subprocess.run([str(build()), "--port", "0", *args], capture_output=True, text=True, timeout=timeout)

@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_refuses_a_non_loopback_address_without_a_token(host):
  p = run_daemon("--host", host)
  assert p.returncode != 0
  assert f"refusing to listen on {host} without --token-file" in p.stderr and "listening" not in p.stdout

def unassigned_address() -> str:
  """192.0.2.1 (TEST-NET-1, RFC 5737): not loopback, and not an address of this machine, so nothing can bind it."""
  try:
    with socket.socket() as s: s.bind(("192.0.2.1", 0))
  except OSError: return "192.0.2.1"
  pytest.skip("192.0.2.1 is assigned to this machine")

def test_allow_unauthenticated_warns_on_a_non_loopback_address():
  host = unassigned_address()
  p = run_daemon("--host", host, "--allow-unauthenticated")
  assert f"WARNING: listening on {host} with no authentication" in p.stderr
  assert "refusing" not in p.stderr and "cannot listen" in p.stderr and p.returncode != 0

def test_a_token_allows_a_non_loopback_address(token_file):
  host = unassigned_address()
  p = run_daemon("--host", host, "--token-file", str(token_file))
  assert "refusing" not in p.stderr and "WARNING" not in p.stderr and "cannot listen" in p.stderr

def test_other_loopback_addresses_need_no_token():
  with runner("--host", "127.0.0.2") as r:
    c = Raw(f"127.0.0.2:{r.port}")
    assert c.ping(b"lo") == b"lo"

@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_token_file_others_can_read_stops_the_runner_with_the_chmod_that_fixes_it(tmp_path, mode):
  """As ssh refuses such a key: a token that group or others can read may be theirs too."""
  (tf := tmp_path / "token").write_bytes(TOKEN)
  tf.chmod(mode)
  p = run_daemon("--token-file", str(tf))
  lines = p.stderr.splitlines()
  assert p.returncode != 0 and p.stdout == "" and len(lines) == 1, (p.returncode, p.stdout, p.stderr)
  assert " error: " in lines[0] and str(tf) in lines[0] and f"(mode {mode:04o})" in lines[0] and lines[0].endswith(f"chmod 600 {tf}"), lines[0]

def test_an_empty_or_missing_token_file_is_an_error(tmp_path):
  (tmp_path / "empty").write_bytes(b"\n")
  (tmp_path / "empty").chmod(0o600)
  p = run_daemon("--token-file", str(tmp_path / "empty"))
  assert p.returncode != 0 and "the token file is empty" in p.stderr
  p = run_daemon("--token-file", str(tmp_path / "missing"))
  assert p.returncode != 0 and "missing" in p.stderr

# ---- a client that holds a token and the runner it reaches (mutual authentication: protocol.md, Authentication)

class FakeRunner:
  """Answers Thello with an Rhello of the given caps (no CAP_AUTH: it asks for no token) and records every byte it receives after
  the Thello until the client closes: a client that holds a token must send nothing more. With answer, it sends those bytes once the
  client sends its next request."""
  def __init__(self, caps:int=P.CAP_UNIFIED | P.CAP_CPU_IMAGE, answer:bytes=b""):
    self.answer = answer
    self.ls = socket.socket()
    self.ls.bind(("127.0.0.1", 0))
    self.ls.listen(1)
    self.addr, self.caps, self.after, self.done = f"127.0.0.1:{self.ls.getsockname()[1]}", caps, b"", threading.Event()
    threading.Thread(target=self.serve, daemon=True).start()

  def serve(self):
    c, _ = self.ls.accept()
    with c:
      c.settimeout(10)
      hello = c.recv(P.MSGS[P.THELLO].size, socket.MSG_WAITALL)
      t, f = P.unpack(hello)
      assert t == P.THELLO
      c.sendall(P.pack(P.RHELLO, f["tag"], magic=P.MAGIC, version=P.VERSION, maxmsg=P.DEFAULT_MAXMSG, backend=P.BACKEND_CPU,
                       caps=self.caps, ncores=1, memory=1 << 30, maxbuf=1 << 30, maxhandles=65536, session=1, name=b"impostor",
                       arch=b"x86_64", cpu=b"x86-64"))
      while (b := c.recv(4096)):
        if not self.after and self.answer: c.sendall(self.answer)
        self.after += b
    self.done.set()

  def close(self): self.ls.close()

@pytest.mark.parametrize("given", ["token=", "METAL_RUNNER_TOKEN_FILE"])
def test_a_client_with_a_token_refuses_a_runner_that_asks_for_none(given, token_file, monkeypatch):
  """An impostor need only not ask: a client that holds a token closes after Rhello without CAP_AUTH, having sent nothing more."""
  fake = FakeRunner()
  monkeypatch.delenv("METAL_RUNNER_TOKEN_FILE", raising=False)
  if given != "token=": monkeypatch.setenv("METAL_RUNNER_TOKEN_FILE", str(token_file))
  try:
    with pytest.raises(conn.RunnerError) as e: conn.Runner(fake.addr, token=TOKEN if given == "token=" else None, connect_timeout=5)
    assert fake.done.wait(5), "the client did not close the connection"
  finally: fake.close()
  assert e.value.code == P.EAUTH and "did not authenticate" in str(e.value) and "--token-file" in str(e.value), str(e.value)
  assert (str(token_file) if given != "token=" else "token=") in str(e.value)
  assert fake.after == b"", f"the client sent {fake.after[:64]!r} to a runner that did not authenticate"

def test_a_malformed_reply_is_reported_as_such(monkeypatch):
  """What a broken runner (or another program) sends after the handshake ends the connection with a message that says what came."""
  monkeypatch.delenv("METAL_RUNNER_TOKEN_FILE", raising=False)
  fake = FakeRunner(answer=b"\xff" * 64)
  try:
    r = conn.Runner(fake.addr, timeout=5)
    with pytest.raises(conn.RunnerConnectionError) as e: r.ping()
  finally: fake.close()
  assert "malformed frame from the runner" in str(e.value) and "malformed frame" in e.value.reason(), repr(e.value.args)
  with pytest.raises(conn.RunnerConnectionError, match="the connection is unusable: malformed frame"): r.ping()

def test_a_client_with_a_token_refuses_a_real_runner_started_without_one(token_file, monkeypatch):
  monkeypatch.setenv("METAL_RUNNER_TOKEN_FILE", str(token_file))
  with runner("-v") as r:
    with pytest.raises(conn.RunnerError, match="did not authenticate"): conn.Runner(r.addr)
    assert "1 requests" in r.wait_log(" requests, "), "the client sent more than its Thello"
    monkeypatch.delenv("METAL_RUNNER_TOKEN_FILE")
    with conn.Runner(r.addr) as c: assert c.ping(b"no token, no auth") == b"no token, no auth"

def test_a_wrong_token_names_the_file_it_came_from(ar, tmp_path, monkeypatch):
  (bad := tmp_path / "old.token").write_bytes(b"last year's token\n")
  bad.chmod(0o600)
  monkeypatch.setenv("METAL_RUNNER_TOKEN_FILE", str(bad))
  with pytest.raises(conn.RunnerError) as e: conn.Runner(ar.addr, timeout=10)
  assert e.value.code == P.EAUTH and "wrong token" in str(e.value)
  assert f"the runner refused the token from METAL_RUNNER_TOKEN_FILE={bad}" in str(e.value), str(e.value)

def test_no_token_where_one_is_needed_names_both_ways_to_give_it(ar, monkeypatch):
  monkeypatch.delenv("METAL_RUNNER_TOKEN_FILE", raising=False)
  with pytest.raises(conn.RunnerError) as e: conn.Runner(ar.addr, timeout=10)
  assert e.value.code == P.EAUTH and "token=" in str(e.value) and "METAL_RUNNER_TOKEN_FILE" in str(e.value), str(e.value)

@pytest.mark.parametrize("bad", ["missing", "empty", "a directory"])
def test_an_unusable_token_file_is_one_clear_error_naming_it_and_the_setting(bad, tmp_path, monkeypatch):
  path = tmp_path / "token"
  if bad == "empty": path.write_bytes(b"\r\n"); path.chmod(0o600)
  if bad == "a directory": path.mkdir()
  monkeypatch.setenv("METAL_RUNNER_TOKEN_FILE", str(path))
  with pytest.raises(conn.TokenFileError) as e: conn.Runner("127.0.0.1:1")   # before any connection: nothing listens there
  msg = str(e.value)
  assert f"the token file {path} (METAL_RUNNER_TOKEN_FILE)" in msg and "\n" not in msg, msg
  assert {"missing": "No such file", "empty": "is empty", "a directory": "Is a directory"}[bad] in msg, msg
  assert isinstance(e.value, conn.RunnerError) and e.value.code == P.EAUTH

def test_the_client_refuses_a_token_file_others_can_read(tmp_path, monkeypatch):
  (tf := tmp_path / "token").write_bytes(TOKEN)
  tf.chmod(0o644)
  monkeypatch.setenv("METAL_RUNNER_TOKEN_FILE", str(tf))
  with pytest.raises(conn.TokenFileError) as e: conn.Runner("127.0.0.1:1")   # before any connection
  assert str(e.value) == (f"the token file {tf} (METAL_RUNNER_TOKEN_FILE) is open to group or others (mode 0644), as a secret "
                          f"must not be: chmod 600 {tf}"), str(e.value)
  tf.chmod(0o600)
  with pytest.raises(conn.RunnerConnectionError, match="cannot connect"): conn.Runner("127.0.0.1:1")   # read, then nothing listens

def test_the_local_runner_a_client_starts_gets_its_token(token_file):
  """With no METAL_RUNNER the devices start a runner of their own: a client that holds a token must be able to use it."""
  from conftest import run_python
  r = run_python("import client.remote_metal\nfrom tinygrad import Tensor\nprint((Tensor([1.0, 2.0], device='REMOTE') + 1).tolist())",
                 {"METAL_RUNNER_TOKEN_FILE": str(token_file)}, unset=("METAL_RUNNER",), timeout=300)
  assert r.returncode == 0 and r.stdout.strip() == "[2.0, 3.0]", r.stderr[-3000:]

def test_a_resume_sends_nothing_to_a_runner_that_asks_for_no_token(ar, monkeypatch):
  """The link drops and the address now answers without CAP_AUTH (another runner, an impostor): no Tresume, no replayed request."""
  monkeypatch.delenv("METAL_RUNNER_TOKEN_FILE", raising=False)
  c = conn.Runner(ar.addr, token=TOKEN, timeout=10)
  assert c._rs is not None and c._rs.key is not None, "the runner does not resume sessions"
  fake = FakeRunner(P.CAP_UNIFIED | P.CAP_CPU_IMAGE | P.CAP_RESUME)
  try:
    c.addr = fake.addr   # where the client reconnects to
    c.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(conn.RunnerConnectionError, match="asks for no token"): c.ping(b"to whom?")
    assert fake.done.wait(5)
  finally: fake.close()
  assert fake.after == b"", f"the client sent {fake.after[:64]!r} to a runner that did not authenticate"

# ---- a token file of another owner (a service's, root's): readable by its group is allowed, by others never

def others_file(tmp_path, mode:int):
  """A token file owned by nobody with mode, that this test (root) still reads; skips where it cannot chown."""
  import pwd
  if os.geteuid() != 0: pytest.skip("gives a file to another user: needs root")
  try: nobody = pwd.getpwnam("nobody")
  except KeyError: pytest.skip("no user nobody")
  (tf := tmp_path / "token").write_bytes(TOKEN)
  os.chown(tf, nobody.pw_uid, nobody.pw_gid)
  tf.chmod(mode)
  return tf

@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644], ids=lambda m: f"{m:04o}")
def test_a_token_file_of_another_owner_may_be_group_readable_never_other_readable(tmp_path, mode, monkeypatch):
  """Both the runner and the client: with the chmod o-rwx that fixes it when others can read it."""
  tf = others_file(tmp_path, mode)
  monkeypatch.setenv("METAL_RUNNER_TOKEN_FILE", str(tf))
  if mode & 0o007:
    p = run_daemon("--token-file", str(tf))
    lines = p.stderr.splitlines()
    assert p.returncode != 0 and p.stdout == "" and len(lines) == 1, (p.returncode, p.stdout, p.stderr)
    assert lines[0].endswith(f"{tf}: the token file is open to others (mode {mode:04o}), as a secret must not be: chmod o-rwx {tf}"), lines[0]
    with pytest.raises(conn.TokenFileError) as e: conn.Runner("127.0.0.1:1")   # before any connection
    assert str(e.value) == (f"the token file {tf} (METAL_RUNNER_TOKEN_FILE) is open to others (mode {mode:04o}), as a secret must not be: "
                            f"chmod o-rwx {tf}"), str(e.value)
    return
  with runner("--token-file", str(tf)) as r, conn.Runner(r.addr, timeout=10) as c:   # both read it: the client proves the runner's token
    assert c.ping(b"group") == b"group"
