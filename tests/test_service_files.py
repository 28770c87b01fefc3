"""The service files (packaging/): make install lays them out with the installed binary's path written in; the systemd unit passes
`systemd-analyze verify` and its sysusers.d entry `systemd-sysusers --dry-run`; the launchd plist parses with plistlib and names the
binary and the token; the options both pass are accepted by the runner (it is started with them, on loopback); the log is plain lines.
The plist is only parsed here: launchd itself is not run (no Mac)."""
import plistlib, re, shlex, shutil, subprocess
import pytest
from client.connection import Runner
from runner_proc import RunnerProc, build, ROOT

pytestmark = pytest.mark.cpu_only
PKG = ROOT / "packaging"
TOKEN_PATH = "/etc/metal_runner/token"

def make_install(*args:str) -> subprocess.CompletedProcess:
  build()
  r = subprocess.run(["make", "-s", "-C", str(ROOT / "daemon"), "install", *args], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  return r

def unit_value(text:str, key:str) -> str:
  return re.search(rf"^{key}=(.*)$", text, re.M).group(1)

def daemon_options() -> set[str]:
  out = subprocess.run([str(build()), "--help"], capture_output=True, text=True).stdout
  return set(re.findall(r"--[a-z-]+", out))

def runs_with(argv:list[str], tmp_path):
  """Start the runner with a service file's arguments, moved to loopback, a free port and a token file of the test's own."""
  (tf := tmp_path / "token").write_bytes(b"service token\n")
  tf.chmod(0o600)
  args, i = [], 1
  while i < len(argv):
    a, v = argv[i], argv[i + 1] if i + 1 < len(argv) else None
    if a in ("--host", "--port"): i += 2; continue   # RunnerProc puts 127.0.0.1 and port 0 first; a later --port would win
    if a == "--token-file": args += [a, str(tf)]; i += 2; continue
    args.append(a); i += 1
  assert set(a for a in args if a.startswith("--")) <= daemon_options(), args
  r = RunnerProc(*args)
  try:
    with Runner(r.addr, token=b"service token") as c: assert c.ping(b"up") == b"up"
  finally: r.stop()

def test_make_install_lays_out_the_files(tmp_path):
  make_install(f"DESTDIR={tmp_path}")
  files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
  assert files == ["usr/local/bin/metal_runner", "usr/local/lib/systemd/system/metal_runner.service", "usr/local/lib/sysusers.d/metal_runner.conf"]
  assert (tmp_path / "usr/local/bin/metal_runner").stat().st_mode & 0o111
  unit = (tmp_path / "usr/local/lib/systemd/system/metal_runner.service").read_text()
  assert unit_value(unit, "ExecStart").startswith("/usr/local/bin/metal_runner ") and "@BINDIR@" not in unit
  # PREFIX moves everything, and the unit follows
  make_install(f"DESTDIR={tmp_path}/2", "PREFIX=/opt/mr")
  assert unit_value((tmp_path / "2/opt/mr/lib/systemd/system/metal_runner.service").read_text(), "ExecStart").startswith("/opt/mr/bin/metal_runner ")

def test_systemd_unit_is_sandboxed_and_reloads_with_sighup():
  unit = (PKG / "metal_runner.service.in").read_text()
  want = {"User": "metal_runner", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
          "ExecReload": "/bin/kill -HUP $MAINPID", "CapabilityBoundingSet": ""}
  assert {k: unit_value(unit, k) for k in want} == want
  assert f"--token-file {TOKEN_PATH}" in unit_value(unit, "ExecStart")
  assert not re.search(r"^(StateDirectory|MemoryDenyWriteExecute)=", unit, re.M)   # nothing written to disk; code is mapped executable

@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (setup.sh test installs systemd)")
def test_systemd_analyze_verify(tmp_path):
  make_install(f"PREFIX={tmp_path}")   # installed for real under tmp_path: verify checks that ExecStart's binary exists
  unit = tmp_path / "lib/systemd/system/metal_runner.service"
  r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and str(unit) not in r.stdout + r.stderr and "metal_runner" not in r.stdout + r.stderr, r.stdout + r.stderr
  # verify has teeth: a misspelt key and a bad value are reported
  bad = tmp_path / "bad.service"
  bad.write_text(unit.read_text().replace("NoNewPrivileges=", "NoNewPrivilegez=").replace("ProtectSystem=strict", "ProtectSystem=bogus"))
  r = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=60)
  assert "Unknown key 'NoNewPrivilegez'" in r.stderr and "bogus" in r.stderr, r.stderr
  r = subprocess.run(["systemd-sysusers", "--dry-run", f"--root={tmp_path}", str(tmp_path / "lib/sysusers.d/metal_runner.conf")],
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and "Creating user 'metal_runner'" in r.stdout + r.stderr, r.stdout + r.stderr

def test_systemd_unit_options_start_a_runner(tmp_path):
  make_install(f"PREFIX={tmp_path}")
  argv = shlex.split(unit_value((tmp_path / "lib/systemd/system/metal_runner.service").read_text(), "ExecStart"))
  assert argv[0] == str(tmp_path / "bin/metal_runner")
  runs_with(argv, tmp_path)

def test_launchd_plist(tmp_path):
  text = (PKG / "org.metal-runner.metal_runner.plist.in").read_text()
  p = plistlib.loads(text.replace("@BINDIR@", "/usr/local/bin").encode())   # what make install writes on macOS
  assert p["Label"] == "org.metal-runner.metal_runner" and p["RunAtLoad"] is True and p["KeepAlive"] == {"SuccessfulExit": False}
  argv = p["ProgramArguments"]
  assert argv[0] == "/usr/local/bin/metal_runner" and argv[argv.index("--token-file") + 1] == TOKEN_PATH
  assert p["UserName"] == "_metal_runner" and p["StandardErrorPath"].startswith("/var/log/")
  assert set(p) <= {"Label", "ProgramArguments", "UserName", "EnvironmentVariables", "RunAtLoad", "KeepAlive", "ProcessType",
                    "StandardErrorPath"}
  runs_with([str(build())] + argv[1:], tmp_path)

def test_the_service_user_has_a_writable_cache_and_home():
  # issue 35 item 2: macOS keeps a per-application Metal shader cache under the user's cache directory, which makes later compiles
  # (every spawned session compiles its kernels again) fast only where that directory is writable. The role account had
  # /var/empty as its home and the systemd unit a read-only file system: both services now give the user a writable directory of
  # its own as HOME, and docs/service.md creates it (macOS) and says why. Whether macOS then caches a daemon's compiles is what
  # tests/mac_report.py's session starts measure on a Mac
  unit = (PKG / "metal_runner.service.in").read_text()
  cache = unit_value(unit, "CacheDirectory")
  assert cache == "metal_runner" and unit_value(unit, "Environment") == f"HOME=/var/cache/{cache}"
  p = plistlib.loads((PKG / "org.metal-runner.metal_runner.plist.in").read_text().replace("@BINDIR@", "/usr/local/bin").encode())
  home = p["EnvironmentVariables"]["HOME"]
  assert home == "/var/db/metal_runner", p
  doc = (ROOT / "docs" / "service.md").read_text()
  assert f"NFSHomeDirectory {home}" in doc and "NFSHomeDirectory /var/empty" not in doc
  assert f"sudo install -d -m 700 -o _metal_runner -g _metal_runner {home}" in doc
  assert "shader cache" in doc and "CacheDirectory=metal_runner" in doc

def test_log_is_plain_lines(tmp_path):
  """What the journal and a log file get: no terminal escapes, every line a whole event."""
  r = RunnerProc("-vv")
  try:
    with Runner(r.addr) as c: c.ping(b"x")
    log = r.log_text()
  finally: r.stop()
  assert "\x1b" not in log and "session 1: client connected from 127.0.0.1" in log
  assert all(l.startswith("metal_runner") or re.match(r"\d\d:\d\d:\d\d ", l) for l in log.splitlines()), log

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed (setup.sh test installs it)")
def test_cmake_install(tmp_path):
  b, prefix = tmp_path / "build", tmp_path / "prefix"
  for cmd in (["cmake", "-S", str(ROOT), "-B", str(b), f"-DCMAKE_INSTALL_PREFIX={prefix}"],
              ["cmake", "--build", str(b), "-j2", "--target", "metal_runner"], ["cmake", "--install", str(b)]):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  assert (prefix / "bin/metal_runner").exists() and (prefix / "lib/sysusers.d/metal_runner.conf").exists()
  unit = (prefix / "lib/systemd/system/metal_runner.service").read_text()
  assert unit_value(unit, "ExecStart").startswith(f"{prefix}/bin/metal_runner ")
