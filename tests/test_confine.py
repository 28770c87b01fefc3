"""Confined session processes (daemon/confine.c): a kernel may make only the system calls a session needs.

Each kernel here makes one system call with inline asm, as any client could send. Under confinement the call is never made:
the session ends with Rerror ECRASH naming SIGSYS and the call, and the runner and other sessions carry on. The same kernel on a
runner started with --no-confine does open and read the file, which shows these tests can fail.
"""
import json, os, pathlib, struct, subprocess, sys
import numpy as np
import pytest
from client import protocol as P
from conftest import run_python
from runner_proc import children, runner, session_pids
from wire import Raw, compile_kernel, still_serving, CORES, SPIN

pytestmark = [pytest.mark.cpu_only,
              pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
                                 reason="seccomp is Linux only; the kernels' inline asm is x86-64")]

# syscall(n, a..f) from a freestanding kernel: the x86-64 Linux convention
SYSCALL = r"""
static inline long sys6(long n, long a, long b, long c, long d, long e, long f) {
  register long r10 __asm__("r10") = d; register long r8 __asm__("r8") = e; register long r9 __asm__("r9") = f;
  long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9) : "rcx", "r11", "memory");
  return r;
}
"""
BUF = 1024          # out[0]: the call's result; bytes 64..: a path the test writes; bytes 512..: what the kernel reads
PATH_OFF, DATA_OFF = 64, 512

def kernel(body:str) -> tuple[int, bytes, int]:
  return compile_kernel(SYSCALL + "void call(long* restrict out) {" + body + "}", "call")

def call_kernel(nr:int, *args:str) -> tuple[int, bytes, int]:
  """A kernel that makes system call nr with C expressions args (out is the buffer) and stores the result in out[0]."""
  a = list(args) + ["0"] * (6 - len(args))
  return kernel(f"out[0] = sys6({nr}, {', '.join(a)});")

# openat(AT_FDCWD, path, O_RDONLY), then read(fd, out + 512, 256): out[0] the fd, out[1] the bytes read
READ_FILE = kernel(f"long fd = sys6(257, -100, (long)(out + {PATH_OFF // 8}), 0, 0, 0, 0); out[0] = fd;"
                   f"if (fd >= 0) {{ out[1] = sys6(0, fd, (long)(out + {DATA_OFF // 8}), 256, 0, 0, 0); sys6(3, fd, 0, 0, 0, 0, 0); }}")

@pytest.fixture(scope="module")
def confined():
  with runner("--kernel-timeout", "2") as r: yield r

@pytest.fixture
def secret(tmp_path) -> tuple[bytes, bytes]:
  """A file only this test knows: (its path as a C string, its contents)."""
  f = tmp_path / "secret"
  f.write_bytes(b"the runner's secret %d\n" % os.getpid())
  return str(f).encode() + b"\0", f.read_bytes()

def run(r, k, path:bytes=b"", wait:bool=True) -> tuple[Raw, int]:
  """Load and launch kernel k in a new session on runner r with one BUF-byte buffer; returns (session, launch tag)."""
  _, img, entry = k
  c = Raw(r.addr)
  c.alloc(1, BUF)
  if path: c.write(1, PATH_OFF, path)
  c.load(1, img, "call", entry=entry)
  return c, c.launch(1, [(1, 0)], wait=wait)

def expect_sigsys(r, c:Raw, tag:int, nr:int):
  code, etag, text = c.error()
  assert (code, etag) == (P.ECRASH, tag), (code, etag, text)
  assert text == f"kernel call crashed: SIGSYS (system call {nr} is not allowed: the session is confined)", text
  assert c.closed()
  still_serving(r)

def test_a_kernel_that_opens_a_file_ends_its_session_with_sigsys(confined, secret):
  path, _ = secret
  other = Raw(confined.addr)
  other.alloc(1, 4096); other.write(1, 0, b"kept" * 1024)
  c, tag = run(confined, READ_FILE, path)
  expect_sigsys(confined, c, tag, 257)
  assert other.read(1, 0, 4096) == b"kept" * 1024, "another session lost its data"
  confined.wait_log("a kernel crashed", "a confined session made system call 257")

def test_the_same_kernel_reads_the_file_without_confinement(secret):
  path, data = secret
  with runner("--no-confine") as r:
    assert "sessions are not confined (--no-confine)" in r.log_text()
    c, tag = run(r, READ_FILE, path)
    t, f, _ = c.frame()
    assert (t, f["tag"]) == (P.RLAUNCH, tag), (t, f)
    fd, n = struct.unpack("<qq", c.read(1, 0, 16))
    assert fd >= 0 and n == len(data) and c.read(1, DATA_OFF, n) == data

# (name, system call number, C arguments): each is trapped, never made
DENIED = [
  ("execve", 59, [f"(long)(out + {PATH_OFF // 8})", "0", "0"]),
  ("socket", 41, ["2", "1", "0"]),                                        # AF_INET, SOCK_STREAM
  ("fork", 57, []),
  ("clone_process", 56, ["17", "0", "0", "0", "0"]),                      # SIGCHLD: a new process, as fork does
  ("clone_thread_in_new_netns", 56, [str(0x10000 | 0x100 | 0x800 | 0x40000000), "0", "0", "0", "0"]),
  ("kill_init", 62, ["1", "0"]),
  ("tgkill_other_process", 234, ["1", "1", "0"]),
  ("ptrace", 101, ["16", "1", "0", "0"]),                                 # PTRACE_ATTACH to pid 1
  ("getuid", 102, []),                                                    # harmless, but not a call a session makes
  ("x32_openat", 257 | 0x40000000, ["-100", f"(long)(out + {PATH_OFF // 8})", "0"]),
]

@pytest.mark.parametrize("name,nr,args", DENIED, ids=[d[0] for d in DENIED])
def test_other_calls_outside_the_session_s_work_are_caught(confined, name, nr, args):
  c, tag = run(confined, call_kernel(nr, *args), b"/bin/sh\0")
  expect_sigsys(confined, c, tag, nr)

def test_a_call_through_the_i386_abi_is_caught(confined):
  # int 0x80 with eax=5 is i386's open: another ABI's numbers, refused by the architecture check
  k = kernel(f"long r; __asm__ volatile(\"int $0x80\" : \"=a\"(r) : \"a\"(5L), \"b\"((long)(out + {PATH_OFF // 8})), \"c\"(0L), \"d\"(0L)"
             " : \"memory\"); out[0] = r;")
  c, tag = run(confined, k, b"/etc/hostname\0")
  expect_sigsys(confined, c, tag, 5)

def test_clone3_fails_with_enosys_and_the_session_goes_on(confined):
  # clone3's flags are out of the filter's sight: it fails, so that glibc falls back to clone, whose flags are checked
  c, tag = run(confined, call_kernel(435, "(long)(out + 8)", "88"))
  t, f, _ = c.frame()
  assert (t, f["tag"]) == (P.RLAUNCH, tag)
  assert struct.unpack("<q", c.read(1, 0, 8))[0] == -38
  assert c.ping(b"alive") == b"alive"

def test_the_core_pool_and_the_time_limit_work_confined(confined):
  _, img, entry = compile_kernel(CORES, "cores")
  c = Raw(confined.addr)
  c.alloc(1, 4 * 64)
  c.load(1, img, "cores", nbufs=1, nvals=1, entry=entry, corearg=1)
  for _ in range(3):           # the pool's threads start on the first launch (clone with CLONE_THREAD), then are reused
    c.launch(1, [(1, 0)], [0], global_size=(64, 1, 1))
    assert struct.unpack("<64i", c.read(1, 0, 256)) == tuple(10 * i for i in range(64))
  _, img, entry = compile_kernel(SPIN, "spin")
  c.load(2, img, "spin", entry=entry)
  tag = c.launch(2, [(1, 0)])
  code, etag, text = c.error()
  assert (code, etag) == (P.ETIMEOUT, tag) and "ran past the runner's kernel time limit" in text
  assert c.closed()
  still_serving(confined)

def test_an_authenticated_session_is_confined_from_its_handshake(tmp_path, secret):
  # the handshake's nonce comes from getrandom(), not /dev/urandom: no file is opened once confined
  from client.connection import Runner
  tok = tmp_path / "token"; tok.write_bytes(b"s3cret"); tok.chmod(0o600)
  path, _ = secret
  with runner("--token-file", str(tok)) as r:
    with Runner(r.addr, token=b"s3cret") as conn: assert conn.info.backend == "cpu"
    assert "system call" not in r.log_text()

def status(pid:int) -> dict[str, str]:
  return dict(line.split(":\t", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)

def test_a_session_process_is_filtered_and_cannot_gain_privileges():
  with runner() as r:
    c = Raw(r.addr)
    (pid,) = session_pids(r)
    st = status(pid)
    assert st["Seccomp"].strip() == "2" and st["NoNewPrivs"].strip() == "1", st
    assert status(r.proc.pid)["Seccomp"].strip() == "0", "the runner itself is not filtered"
    c.close()

@pytest.mark.skipif(os.geteuid() != 0, reason="--user needs a runner started as root")
def test_user_switches_session_processes_to_that_user():
  import pwd
  nobody = pwd.getpwnam("nobody")
  with runner("--user", "nobody") as r:
    log = r.log_text()
    assert "sessions run as root" not in log
    c = Raw(r.addr)
    (pid,) = session_pids(r)
    st = status(pid)
    uid, gid = str(nobody.pw_uid), str(nobody.pw_gid)
    assert st["Uid"].split() == [uid] * 4 and st["Gid"].split() == [gid] * 4 and st["Groups"].split() == [gid], st
    assert st["Seccomp"].strip() == "2"
    assert status(r.proc.pid)["Uid"].split()[0] == "0", "the runner itself keeps its user"
    (broker,) = set(children(r)) - set(session_pids(r))   # it makes connections: that user, not confined
    assert status(broker)["Uid"].split() == [uid] * 4 and status(broker)["Seccomp"].strip() == "0"
    c.alloc(1, 8); c.write(1, 0, b"as nobod"); assert c.read(1, 0, 8) == b"as nobod"
    still_serving(r)
  with runner("--user", "nobody", "--no-confine") as r:
    # unconfined, the kernel may call getuid: the session's user, and root's files are out of reach
    c, tag = run(r, call_kernel(102))
    assert c.frame()[0] == P.RLAUNCH and struct.unpack("<q", c.read(1, 0, 8))[0] == nobody.pw_uid
    c, tag = run(r, READ_FILE, b"/etc/shadow\0")
    assert c.frame()[0] == P.RLAUNCH and struct.unpack("<q", c.read(1, 0, 8))[0] == -13   # EACCES

def start_fails(*args:str, user:str|None=None) -> subprocess.CompletedProcess:
  from conftest import DAEMON
  return subprocess.run([str(DAEMON), "--host", "127.0.0.1", "--port", "0", *args], capture_output=True, text=True, timeout=20,
                        user=user)

def test_user_errors_at_start():
  p = start_fails("--user", "no-such-user-here")
  assert p.returncode == 1 and "--user no-such-user-here: no such user" in p.stderr, p.stderr
  p = start_fails("--user", "nobody", "--isolation", "thread")
  assert p.returncode == 1 and "--user applies to session processes" in p.stderr, p.stderr
  if os.geteuid() == 0:
    p = start_fails("--user", "nobody", user="nobody")      # a runner that is not root cannot switch users
  else:
    p = start_fails("--user", "nobody")
  assert p.returncode == 1 and "--user needs a runner started as root" in p.stderr, p.stderr

def test_the_start_says_what_is_not_confined():
  with runner("--isolation", "thread") as r:
    log = r.log_text()
    assert "sessions are not confined: with thread isolation" in log
    # and indeed a thread session is not: the kernel runs in the runner's own process (it only calls getpid here)
    c, tag = run(r, call_kernel(39))
    assert c.frame()[0] == P.RLAUNCH and struct.unpack("<q", c.read(1, 0, 8))[0] == r.proc.pid
  with runner() as r:
    log = r.log_text()
    assert "not confined" not in log
    assert ("sessions run as root" in log) == (os.geteuid() == 0)

def test_tinygrad_runs_confined(confined):
  before = confined.log_text().count("system call")
  r = run_python("""
import json, numpy as np, client.remote_metal
from client import protocol as P
from tinygrad import Device, Tensor, TinyJit
runner, corearg = Device["REMOTE"].runner, []
def load(*a, _f=runner.load, **kw):
  corearg.append(kw.get("corearg", a[6] if len(a) > 6 else P.NO_CORE))
  return _f(*a, **kw)
runner.load = load
a, b = np.random.default_rng(3).normal(size=(2, 256, 256)).astype(np.float32)
x, w = Tensor(a, device="REMOTE"), Tensor(b, device="REMOTE")
mm = (x @ w).numpy()
red = (x.relu() * 2).sum(axis=1).numpy()
@TinyJit
def step(t): return (t @ w).relu().sum()
jit = [step(Tensor(a + i, device="REMOTE")).item() for i in range(4)]
print(json.dumps({"mm": float(np.abs(mm - a @ b).max()), "red": float(np.abs(red - (np.maximum(a, 0) * 2).sum(axis=1)).max()),
                  "jit": float(max(abs(j - np.maximum((a + i) @ b, 0).sum()) / abs(j) for i, j in enumerate(jit))),
                  "core_kernels": sum(c != P.NO_CORE for c in corearg)}))
""", {"METAL_RUNNER": confined.addr})
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.splitlines()[-1])
  assert out["mm"] < 1e-3 and out["red"] < 1e-3 and out["jit"] < 1e-4, out
  assert out["core_kernels"] > 0, "no kernel ran on the session's core pool"
  assert confined.log_text().count("system call") == before, "a session of tinygrad's made a call the filter traps"
