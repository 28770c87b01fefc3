"""DNS-SD discovery (client/discovery.py, METAL_RUNNER=auto) and the runner's --advertise (daemon/advertise_*.c).

The client side runs against real multicast DNS on the loopback interface: a python-zeroconf publisher in another process announces
a real runner on 127.0.0.1, and the client browses there (METAL_RUNNER_DISCOVER_INTERFACES=127.0.0.1). The runner side on Linux
(Avahi) runs against a private avahi-daemon on a private D-Bus bus, restricted to loopback, when both are installed (setup.sh test);
macOS's dns_sd path (advertise_dnssd.c) is not run anywhere: there is no Mac here."""
import os, pathlib, shutil, signal, socket, subprocess, sys, tempfile, textwrap, time, uuid
import pytest
from client import discovery
from client.connection import Runner
from runner_proc import RunnerProc, ROOT

pytestmark = pytest.mark.cpu_only
zeroconf = pytest.importorskip("zeroconf", reason="python-zeroconf is a test dependency (pip install -e '.[test]')")

def info(name, addrs, port=6667, **txt):
  return zeroconf.ServiceInfo(discovery.SERVICE, f"{name}.{discovery.SERVICE}", port=port, properties=txt,
                              parsed_addresses=addrs, server="h.local.")

# ---- the resolution logic, on ServiceInfo records built here (no network)

def test_from_info_prefers_ipv4_and_reads_the_txt_record():
  a = discovery.from_info(info("box", ["fd00::5", "192.0.2.7"], 7000, backend="metal", auth="1", proto="1"))
  assert (a.name, a.addr, a.addrs, a.backend, a.auth, a.proto) == ("box", "192.0.2.7:7000", ("192.0.2.7", "fd00::5"), "metal", True, 1)
  b = discovery.from_info(info("v6 only", ["fd00::5"], 7001))
  assert b.addr == "[fd00::5]:7001" and b.backend is None and b.auth is None and b.proto is None
  assert discovery.from_info(info("no address", [])) is None

def test_usable_filters_protocol_and_backend_and_sorts_by_name():
  rs = [discovery.from_info(i) for i in (info("c", ["192.0.2.3"], backend="cpu", proto="1"), info("a", ["192.0.2.1"], backend="metal", proto="1"),
                                         info("b", ["192.0.2.2"], backend="cpu", proto="2"), info("d", ["192.0.2.4"]))]
  assert [a.name for a in discovery.usable(rs)] == ["a", "c", "d"]           # protocol 2 is not for this client
  assert [a.name for a in discovery.usable(rs, "cpu")] == ["c", "d"]          # an unstated backend is kept; Rhello will tell
  assert [a.name for a in discovery.usable(rs, "metal")] == ["a", "d"]

def test_reachable_picks_the_address_that_accepts():
  srv = socket.socket()
  srv.bind(("127.0.0.1", 0))
  srv.listen(4)
  try:
    a = discovery.from_info(info("x", ["192.0.2.200", "127.0.0.1"], srv.getsockname()[1]))   # 192.0.2.0/24: TEST-NET, unreachable
    assert a.addr.startswith("192.0.2.200:") and discovery.reachable(a, 0.3).addr == f"127.0.0.1:{srv.getsockname()[1]}"
  finally: srv.close()

def test_plain_addresses_do_not_need_zeroconf(monkeypatch):
  monkeypatch.setenv("METAL_RUNNER", " a:1, b:2 ")
  assert discovery.runner_addrs("cpu") == ["a:1", "b:2"]
  monkeypatch.setenv("METAL_RUNNER", "a,[::1],[::1]:7000")   # a host alone is at the runner's default port
  assert discovery.runner_addrs("cpu") == ["a:6667", "[::1]:6667", "[::1]:7000"]
  monkeypatch.delenv("METAL_RUNNER")
  assert discovery.runner_addrs() == []
  # and the tinygrad devices import no zeroconf unless asked to discover
  code = "import sys, client.remote_metal; assert 'zeroconf' not in sys.modules, 'zeroconf imported'"
  r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr

def test_auto_without_zeroconf_says_what_to_install(monkeypatch):
  monkeypatch.setenv("METAL_RUNNER", "auto")
  monkeypatch.setattr(discovery, "_auto", {})
  monkeypatch.setitem(sys.modules, "zeroconf", None)   # import zeroconf now raises ImportError
  with pytest.raises(RuntimeError, match=r"needs python-zeroconf: pip install 'metal-runner-client\[discovery\]'"):
    discovery.runner_addrs("cpu")

# ---- over multicast DNS on loopback: a publisher process, a real runner, the client browsing

PUBLISH = textwrap.dedent("""
  import socket, sys, time, zeroconf
  name, port, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
  T = "_metal-runner._tcp.local."
  zc = zeroconf.Zeroconf(interfaces=["127.0.0.1"], ip_version=zeroconf.IPVersion.V4Only)
  zc.register_service(zeroconf.ServiceInfo(T, name + "." + T, port=port, addresses=[socket.inet_aton("127.0.0.1")],
                      properties={"txtvers": "1", "proto": "1", "backend": backend, "auth": "0"}, server="mr-test.local."))
  print("registered", flush=True)
  sys.stdin.read()   # until the test closes our stdin
  zc.close()
""")

def publish(name:str, port:int, backend:str="cpu") -> subprocess.Popen:
  p = subprocess.Popen([sys.executable, "-c", PUBLISH, name, str(port), backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  assert p.stdout.readline().strip() == "registered"
  return p

def unpublish(p:subprocess.Popen):
  p.stdin.close()
  try: p.wait(10)
  except subprocess.TimeoutExpired:
    p.kill()
    p.wait()

def test_auto_finds_a_runner_published_on_loopback(monkeypatch):
  name, other = f"mr-test-{uuid.uuid4().hex[:8]}", f"mr-test-metal-{uuid.uuid4().hex[:8]}"
  r = RunnerProc()
  pubs = [publish(name, r.port, "cpu"), publish(other, 9, "metal")]
  try:
    found = discovery.discover(timeout=1.5, interfaces=["127.0.0.1"])
    mine = [a for a in found if a.name in (name, other)]
    assert [(a.name, a.addr, a.backend, a.auth) for a in mine] == [(name, r.addr, "cpu", False), (other, "127.0.0.1:9", "metal", False)]
    monkeypatch.setenv("METAL_RUNNER", "auto")
    monkeypatch.setenv("METAL_RUNNER_DISCOVER_TIMEOUT", "3")
    monkeypatch.setenv("METAL_RUNNER_DISCOVER_INTERFACES", "127.0.0.1")
    monkeypatch.setattr(discovery, "_auto", {})
    addrs = discovery.runner_addrs("cpu")
    assert r.addr in addrs and "127.0.0.1:9" not in addrs
    assert discovery.runner_addrs("cpu") is addrs   # REMOTE:1 does not listen again
    with Runner(r.addr) as c: assert c.ping(b"found") == b"found"
    # the probe takes "auto" too
    p = subprocess.run([sys.executable, "-m", "client", "probe", "auto", "--pings", "0"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 0 and "backend     cpu" in p.stdout, p.stdout + p.stderr
  finally:
    for p in pubs: unpublish(p)
    r.stop()

def test_auto_with_nothing_advertised(monkeypatch):
  monkeypatch.setenv("METAL_RUNNER", "auto")
  monkeypatch.setenv("METAL_RUNNER_DISCOVER_TIMEOUT", "0.5")
  monkeypatch.setenv("METAL_RUNNER_DISCOVER_INTERFACES", "127.0.0.1")
  monkeypatch.setattr(discovery, "_auto", {})
  with pytest.raises(RuntimeError, match="no zz-none runner advertised itself"): discovery.runner_addrs("zz-none")

# ---- the runner's --advertise

def test_advertise_refused_without_a_token_beyond_loopback(daemon_bin):
  r = subprocess.run([str(daemon_bin), "--host", "0.0.0.0", "--port", "0", "--advertise", "--allow-unauthenticated"],
                     capture_output=True, text=True, timeout=20)
  assert r.returncode == 1 and "refusing to --advertise a runner on 0.0.0.0 without --token-file" in r.stderr, r.stderr

def built_with_avahi(daemon_bin) -> bool:
  return "avahi_client_new" in subprocess.run(["nm", "-u", str(daemon_bin)], capture_output=True, text=True).stdout

def test_advertise_needs_dns_sd(daemon_bin, tmp_path):
  """Without DNS-SD in the build the option is an error at start; with Avahi but no avahi-daemon, an error once listening."""
  env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus"}
  r = subprocess.run([str(daemon_bin), "--port", "0", "--advertise"], capture_output=True, text=True, timeout=20, env=env)
  assert r.returncode == 1
  if built_with_avahi(daemon_bin): assert "cannot advertise with Avahi: avahi-daemon is not running" in r.stderr, r.stderr
  else: assert "built without DNS-SD support" in r.stderr, r.stderr

AVAHI_CONF = """[server]
host-name=metal-runner-test
use-ipv4=yes
use-ipv6=no
allow-interfaces=lo
enable-dbus=yes
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[publish]
publish-hinfo=no
publish-workstation=no
"""

@pytest.fixture
def avahi_bin() -> pathlib.Path:
  """daemon/metal_runner_avahi: the runner built with Avahi (make metal_runner_avahi; setup.sh test builds it)."""
  if not (b:=ROOT / "daemon" / "metal_runner_avahi").exists(): pytest.skip("daemon/metal_runner_avahi is not built (setup.sh test)")
  if not built_with_avahi(b): pytest.skip(f"{b} is not linked with Avahi")
  return b

@pytest.fixture
def avahi(tmp_path, avahi_bin):
  """A private avahi-daemon (loopback only) on a private system bus; yields the bus address."""
  if not (shutil.which("dbus-daemon") and shutil.which("avahi-daemon")): pytest.skip("dbus-daemon or avahi-daemon is not installed (setup.sh test)")
  if os.geteuid() != 0: pytest.skip("avahi-daemon must start as root (it then drops to its own user)")
  # avahi-daemon drops to its own user before it connects: the bus lives where that user can reach it (tmp_path's parents are 0700)
  busdir = pathlib.Path(tempfile.mkdtemp(prefix="mr-avahi-bus-"))
  busdir.chmod(0o755)
  bus = f"unix:path={busdir}/bus"
  d = subprocess.Popen(["dbus-daemon", "--system", "--nofork", "--nopidfile", f"--address={bus}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  (tmp_path / "avahi.conf").write_text(AVAHI_CONF)
  a = None
  try:
    for _ in range(100):
      if (busdir / "bus").exists(): break
      time.sleep(0.05)
    a = subprocess.Popen(["avahi-daemon", "-f", str(tmp_path / "avahi.conf"), "--no-rlimits"], env={**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": bus},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and a.poll() is None:
      log.append(a.stdout.readline())
      if "Server startup complete" in log[-1]: break
    if a.poll() is not None and any("already running" in l for l in log):
      pytest.skip("another avahi-daemon is running on this machine (its pid file is fixed): " + "".join(log)[-300:])
    assert "Server startup complete" in log[-1], "".join(log)
    yield bus
  finally:
    for p in (a, d):
      if p is not None and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try: p.wait(5)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
    shutil.rmtree(busdir, ignore_errors=True)

def test_advertise_with_avahi_is_found_by_the_client(avahi, avahi_bin, tmp_path):
  """The Linux runner side end to end: metal_runner --advertise registers through avahi-daemon, the client finds it over mDNS on
  loopback, with the TXT record the runner wrote; a second runner with the same name gets Avahi's alternative; stopping withdraws."""
  name = f"mr-avahi-{uuid.uuid4().hex[:8]}"
  (tf := tmp_path / "token").write_bytes(b"t0ken")
  tf.chmod(0o600)
  env = {"DBUS_SYSTEM_BUS_ADDRESS": avahi}
  r1 = RunnerProc(f"--advertise={name}", "--token-file", str(tf), binary=avahi_bin, env=env)
  r2 = RunnerProc(f"--advertise={name}", "--isolation", "thread", binary=avahi_bin, env=env)
  try:
    assert f'advertising "{name}"' in r1.log_text(0.3) and f'advertising "{name} #2"' in r2.log_text(0), (r1.log, r2.log)
    found = {a.name: a for a in discovery.discover(timeout=2, interfaces=["127.0.0.1"])}
    assert found[name].addr == r1.addr and found[name].backend == "cpu" and found[name].auth is True and found[name].proto == 1
    assert found[name + " #2"].addr == r2.addr and found[name + " #2"].auth is False
    r2.stop()
    time.sleep(1.5)   # the advertiser died with its runner; avahi-daemon sends the goodbye
    found = {a.name for a in discovery.discover(timeout=1.5, interfaces=["127.0.0.1"])}
    assert name in found and name + " #2" not in found
  finally:
    r1.stop()
    r2.stop()

def test_dnssd_source_compiles_against_a_dns_sd_header(tmp_path, daemon_bin):
  """advertise_dnssd.c (macOS) cannot be built here against Apple's SDK; Avahi's Bonjour compatibility library ships a dns_sd.h that
  declares the same API, so the file is compiled with every warning as an error and linked into a runner against it. This checks the
  calls and types, not mDNSResponder's behaviour (the loopback-only registration, kDNSServiceInterfaceIndexLocalOnly, is not
  supported by Avahi's layer)."""
  pc = subprocess.run(["pkg-config", "--cflags", "--libs", "avahi-compat-libdns_sd"], capture_output=True, text=True)
  if pc.returncode != 0: pytest.skip("Avahi's dns_sd compatibility library is not installed (Debian: libavahi-compat-libdnssd-dev; setup.sh test)")
  flags = pc.stdout.split()
  d = ROOT / "daemon"
  r = subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes", "-Werror",
                      *[f for f in flags if not f.startswith("-l")], "-o", str(tmp_path / "mr_dnssd"), str(d / "main.c"),
                      str(d / "advertise_dnssd.c"),
                      str(d / "libmetal_runner.a"), "-lpthread", *[f for f in flags if f.startswith("-l")]], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr

def test_tinygrad_remote_with_metal_runner_auto():
  """The tinygrad device opens the advertised runner: METAL_RUNNER=auto, DEV=REMOTE, a kernel runs there (its session is logged)."""
  r = RunnerProc("-v")
  pub = publish(f"000 mr-test-tg-{uuid.uuid4().hex[:8]}", r.port, "cpu")   # sorts before any other name: REMOTE:0 is this one
  try:
    code = "import client.remote_metal; from tinygrad import Tensor, Device; print((Tensor([1, 2, 3]) * 2).tolist(), Device['REMOTE'].runner.addr)"
    env = {**{k: v for k, v in os.environ.items() if k not in ("DEBUG", "BEAM")}, "PYTHONPATH": str(ROOT), "METAL_RUNNER": "auto",
           "DEV": "REMOTE", "METAL_RUNNER_DISCOVER_TIMEOUT": "3", "METAL_RUNNER_DISCOVER_INTERFACES": "127.0.0.1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["[2,", "4,", "6]", r.addr], p.stdout
    assert "connected from 127.0.0.1" in r.log_text()
  finally:
    unpublish(pub)
    r.stop()
