"""client/connection.py against a real runner (and, for timeouts, a silent fake): what a tinygrad user ends up seeing."""
import http.server, os, signal, socket, struct, subprocess, sys, threading, time
import pytest
from client import protocol as P
from client.connection import Runner, RunnerError, RunnerConnectionError, NotARunnerError, parse_addr, full_addr
from runner_proc import runner, ROOT
from wire import compile_kernel, ADD1, CRASH

pytestmark = pytest.mark.cpu_only

@pytest.fixture(scope="module")
def rp():
  with runner("--max-msg", "65536") as r: yield r   # the smallest maxmsg: every large transfer is split

def f32(*v): return struct.pack(f"<{len(v)}f", *v)

def test_roundtrip_split_into_many_frames(rp):
  with Runner(rp.addr) as c:
    assert c.info.backend == "cpu" and c.maxmsg == 65536
    data = os.urandom(1 << 20)   # 16+ frames each way
    c.alloc(h := c.new_handle(), len(data)); c.write(h, 0, data)
    out = bytearray(len(data)); c.read(h, 0, out)
    assert bytes(out) == data
    c.copy(h, 0, h, 4096, 4096)
    part = bytearray(4096); c.read(h, 0, part)
    assert bytes(part) == data[4096:8192]

SLOW = "void slow(long* restrict out, long n) { long s = 0; for (long i = 0; i < n; i++) { s += i; __asm__ volatile(\"\" : \"+r\"(s)); } out[0] = s; }"

def test_connect_timeout_does_not_bound_replies(rp):
  # connect_timeout covers the connect and the hello; a reply after that may take up to the (much longer) reply timeout
  arch, img, entry = compile_kernel(SLOW, "slow")
  with Runner(rp.addr, timeout=60, connect_timeout=0.2) as c:
    c.alloc(h := c.new_handle(), 8)
    c.load(p := c.new_handle(), P.PROG_CPU_IMAGE, "slow", img, 1, 1, entry=entry, arch=arch)
    assert c.launch(p, [(h, 0)], [4_000_000_000], wait=True) > 0.3, "the kernel ran too fast to show anything: raise n"

def test_launch_graph_and_timing(rp):
  arch, img, entry = compile_kernel(ADD1, "add1")
  with Runner(rp.addr) as c:
    a, b = c.new_handle(), c.new_handle()
    c.alloc(a, 16); c.alloc(b, 16); c.write(b, 0, f32(1, 2, 3, 4))
    c.load(p := c.new_handle(), P.PROG_CPU_IMAGE, "add1", img, 2, 1, entry=entry, arch=arch)
    secs = c.launch(p, [(a, 0), (b, 0)], [4], wait=True)
    assert 0 < secs < 1
    c.graph(g := c.new_handle(), [(p, [(b, 0), (a, 0)], [4], (1, 1, 1), (1, 1, 1))])
    c.graph_run(g, [(0, P.PATCH_VAL, 0, 0, 2)])
    out = bytearray(16); c.read(b, 0, out)
    assert bytes(out) == f32(3, 4, 3, 4)

def test_errors_of_pipelined_requests_are_raised_at_the_next_wait_with_what_failed(rp):
  with Runner(rp.addr) as c:
    c.free(12345)            # no reply: nothing raised yet
    c.alloc(h := c.new_handle(), 8)
    c.write(h, 4, b"12345678")
    with pytest.raises(RunnerError) as ei: c.sync()
    e = ei.value
    assert (e.code_name, e.request) == ("EHANDLE", "Tfree handle=12345") and rp.addr in str(e)
    assert [x.code_name for x in e.others] == ["ERANGE"] and "Twrite handle=1 offset=4 count=8" in str(e)
    assert c.ping(b"still usable") == b"still usable"

def test_a_crash_makes_the_runner_unusable_with_the_reason(rp):
  arch, img, entry = compile_kernel(CRASH, "crash")
  c = Runner(rp.addr)
  c.alloc(h := c.new_handle(), 16)
  c.load(p := c.new_handle(), P.PROG_CPU_IMAGE, "crash", img, 1, 0, entry=entry, arch=arch)
  with pytest.raises(RunnerError) as ei: c.launch(p, [(h, 0)], [], wait=True)
  assert ei.value.code_name == "ECRASH" and "kernel crashed" in str(ei.value) and "SIGSEGV" in str(ei.value)
  with pytest.raises(RunnerConnectionError, match="unusable"): c.ping()

def test_a_runner_that_dies_gives_a_clear_error_naming_it_and_the_request():
  with runner() as r:
    c = Runner(r.addr)
    c.alloc(h := c.new_handle(), 16); c.sync()
    kids = [int(k) for k in open(f"/proc/{r.proc.pid}/task/{r.proc.pid}/children").read().split()]
    assert kids, "no session process"
    os.kill(r.proc.pid, signal.SIGKILL)   # the session process dies with it (PR_SET_PDEATHSIG), no orphan keeps serving
    r.proc.wait(10)                       # its death signal comes once the runner has fully exited (slow under ASan)
    def alive(k): return os.path.exists(f"/proc/{k}") and open(f"/proc/{k}/stat").read().split()[2] != "Z"
    deadline = time.monotonic() + 5
    while any(alive(k) for k in kids) and time.monotonic() < deadline: time.sleep(0.05)
    assert not any(alive(k) for k in kids), "a session process outlived its runner"
    t0 = time.monotonic()
    with pytest.raises(RunnerConnectionError) as ei:
      for _ in range(3): c.write(h, 0, b"x" * 16); c.sync()
    assert time.monotonic() - t0 < 5 and r.addr in str(ei.value)
    assert "Tsync" in str(ei.value) or "Twrite" in str(ei.value)

def test_unreachable_runner():
  s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()   # nothing listens there
  with pytest.raises(RunnerConnectionError, match=f"127.0.0.1:{port}: cannot connect"): Runner(f"127.0.0.1:{port}")

def test_a_silent_server_is_named_as_probably_not_a_runner_instead_of_hanging():
  ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
  addr = f"127.0.0.1:{ls.getsockname()[1]}"
  held = []
  threading.Thread(target=lambda: held.append(ls.accept()), daemon=True).start()   # accepts, never answers
  t0 = time.monotonic()
  with pytest.raises(NotARunnerError) as ei: Runner(addr, connect_timeout=1)
  assert time.monotonic() - t0 < 5
  assert str(ei.value) == f"{addr} accepted the connection but never answered the handshake within 1 s (connect_timeout): probably not a metal_runner"
  ls.close()

def test_an_http_server_is_named_as_not_a_runner_at_once():
  """A line-based server (HTTP here, the standard library's) answers the Thello at once: its tag ends a line (protocol.md, Thello)."""
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  addr = f"127.0.0.1:{srv.server_address[1]}"
  try:
    t0 = time.monotonic()
    with pytest.raises(NotARunnerError) as ei: Runner(addr, connect_timeout=5)
    took = time.monotonic() - t0
  finally:
    srv.shutdown(); srv.server_close()
  # an HTTP/0.9-style answer (no status line) to a request line without a version: the page itself
  assert str(ei.value) == f"{addr} is not a metal_runner (it answered '<!DOCTYPE HTML>')", str(ei.value)
  assert took < 2, f"{took:.1f} s: waited for the connect timeout instead of reading the answer"

def test_a_server_that_closes_without_a_word_is_named_as_probably_not_a_runner():
  ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
  threading.Thread(target=lambda: ls.accept()[0].close(), daemon=True).start()
  addr = f"127.0.0.1:{ls.getsockname()[1]}"
  with pytest.raises(NotARunnerError, match="closed the connection without answering the handshake: probably not a metal_runner"): Runner(addr)
  ls.close()

@pytest.mark.parametrize("addr,why", [("127.0.0.1:66677", "port 66677 out of range 1-65535"), ("127.0.0.1:0", "port 0 out of range 1-65535"),
                                      ("127.0.0.1:http", "is not HOST:PORT \\(the port 'http' is not a number"),
                                      ("127.0.0.1:", "is not HOST:PORT \\(no port after the colon"),
                                      ("[::1]x", "is not HOST:PORT \\(text after the IPv6 address's \\]"), ("::1", r"an IPv6 address goes in brackets, as in \[::1\]:6667"),
                                      ("http://127.0.0.1:7001", "is not HOST:PORT \\(a URL: the runner speaks its own protocol, not http; give 127.0.0.1:7001"),
                                      ("127.0.0.1:7001:9", "is not HOST:PORT \\(more than one colon")])
def test_a_bad_address_is_refused_before_connecting(addr, why):
  with pytest.raises(ValueError, match=why): parse_addr(addr)
  with pytest.raises(ValueError, match=why): Runner(addr)

@pytest.mark.parametrize("addr,hostport,full", [("mac.local", ("mac.local", 6667), "mac.local:6667"), ("10.0.0.2:7000", ("10.0.0.2", 7000), "10.0.0.2:7000"),
                                                ("[::1]", ("::1", 6667), "[::1]:6667"), ("[::1]:7000", ("::1", 7000), "[::1]:7000"),
                                                (":7000", ("localhost", 7000), "localhost:7000")])
def test_a_host_alone_means_the_runners_default_port(addr, hostport, full):
  assert parse_addr(addr) == hostport and full_addr(addr) == full

def test_messages_name_the_address_with_its_port():
  with pytest.raises(RunnerConnectionError, match="runner macbok.invalid:6667: cannot connect"): Runner("macbok.invalid")

def test_a_program_without_stderr_connects_and_writes(rp):
  """Started with 2>&- (or by pythonw) a program has sys.stderr None: the client shows no upload progress and raises nothing (ab697fd)."""
  code = ("import os, sys\nfrom client.connection import Runner\nassert sys.stderr is None\n"
          f"with Runner({rp.addr!r}) as c:\n  data = os.urandom(1 << 20)\n  c.alloc(h := c.new_handle(), len(data)); c.write(h, 0, data)\n"
          "  out = bytearray(len(data)); c.read(h, 0, out)\n  print(c.progress is None, out == data)\n")
  p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT), "METAL_RUNNER_PROGRESS": "0.1"}, cwd=str(ROOT),
                     stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2), text=True, timeout=60)   # fd 2 closed in the child only
  assert (p.returncode, p.stdout) == (0, "True True\n"), p
