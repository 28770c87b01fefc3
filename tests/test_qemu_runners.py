"""arm64 and riscv64 runners under qemu-user EMULATION (a test harness: qemu translates the guest's instructions and system calls; nothing
here ran on an ARM or RISC-V board). The daemon is cross-built (make -C daemon cross, daemon/build/<arch>/metal_runner) and started as
`qemu-<cpu> -L /usr/<triple> metal_runner --port 0 --no-confine` on 127.0.0.1; the host compiles kernels for the CPU it reports.

--no-confine, and only for this reason: qemu-user refuses prctl(PR_SET_SECCOMP) with EINVAL (a guest filter would apply to qemu's own
host system calls), so a confined session cannot start under qemu; test_qemu_refuses_the_seccomp_filter records exactly that.

Run here: the REMOTE tinygrad tests minus the ones that never reach a kernel on the runner's CPU (QEMU_SKIP), a TinyJit MLP training
run (examples/train_mlp.py) compared with tinygrad's CPU device, crash isolation, and the CPU report (qemu's -cpu changes HWCAP)."""
import contextlib, functools, json, os, pathlib, re, shutil, struct, subprocess, sys, tempfile
import pytest
from conftest import ROOT
from runner_proc import RunnerProc
from client import protocol as P
from client.connection import Runner, RunnerError, RunnerConnectionError
from client.cpu_image import clang_arch, cpu_image

QEMU = {"arm64": ("qemu-aarch64", "/usr/aarch64-linux-gnu", "aarch64-linux-gnu-gcc"),
        "riscv64": ("qemu-riscv64", "/usr/riscv64-linux-gnu", "riscv64-linux-gnu-gcc")}
ARCHS = list(QEMU)
pytestmark = pytest.mark.slow   # emulated: run once, in the full suite (not again in test.sh's ASan pass, which could not use it anyway)

def missing(arch:str) -> str|None:
  qemu, sysroot, cc = QEMU[arch]
  if sys.platform != "linux": return "qemu-user runners are tested on Linux hosts"
  if (m:=[t for t in (qemu, cc, "clang") if shutil.which(t) is None] + ([sysroot] if not os.path.isdir(sysroot) else [])):
    return f"{', '.join(m)} missing (./setup.sh test installs qemu-user and the cross compilers)"
  return None

@functools.cache
def build_cross(arch:str) -> str|None:
  r = subprocess.run(["make", "-s", "-C", str(ROOT / "daemon"), "cross", f"ARCH={arch}"], capture_output=True, text=True, timeout=600)
  return None if r.returncode == 0 else f"make -C daemon cross ARCH={arch} failed: {(r.stdout + r.stderr)[-1500:]}"

def binary(arch:str): return ROOT / "daemon" / "build" / arch / "metal_runner"

def qemu_argv(arch:str, cpu:str|None=None, sysroot:str|None=None) -> list[str]:
  if (why:=missing(arch)) is not None: pytest.skip(why)
  if (why:=build_cross(arch)) is not None: pytest.fail(why)
  return [QEMU[arch][0], "-L", sysroot or QEMU[arch][1], *(["-cpu", cpu] if cpu else []), str(binary(arch))]

@contextlib.contextmanager
def qemu_runner(arch:str, *args:str, cpu:str|None=None, confine:bool=False, sysroot:str|None=None):
  """A runner under qemu-user on 127.0.0.1 with a free port; yields (address, Popen, log lines)."""
  *qemu, exe = qemu_argv(arch, cpu, sysroot)
  r = RunnerProc(*([] if confine else ["--no-confine"]), *args, binary=exe, prefix=qemu, stdin=subprocess.DEVNULL, group=True, start_timeout=60)
  try: yield r.addr, r.proc, r.log
  finally: r.stop()

@pytest.fixture(scope="module", params=ARCHS)
def qrunner(request):
  """One runner per CPU, shared by the tests that do not need options of their own: (arch, address)."""
  with qemu_runner(request.param) as (addr, _, _): yield request.param, addr

def wrapper(arch:str, d) -> str:
  """An executable that runs the cross-built daemon under qemu with the arguments it is given: METAL_RUNNER_BIN for tests that start runners."""
  p = d / f"metal_runner_qemu_{arch}"
  p.write_text("#!/bin/sh\n# qemu-user emulation (test harness); --no-confine: qemu refuses seccomp filters\nexec " +
               " ".join(qemu_argv(arch)) + ' "$@" --no-confine\n')
  p.chmod(0o755)
  return str(p)

def compile_c(src:str, arch:str, cc:str="clang") -> bytes:
  """Compiles like tinygrad's ClangCompiler for the clang_arch string arch (its flags), with compiler cc (tinygrad reads $CC only once)."""
  from tinygrad.runtime.support.compiler_cpu import ClangCompiler
  comp = ClangCompiler(arch.split(","))
  return subprocess.check_output([cc, "-c", "-x", "c", "-O2", "-fPIC", "-ffreestanding", "-fno-math-errno", "-nostdlib", "-fno-ident",
                                  f"--target={comp.arch}-none-unknown-elf", *comp.args, "-", "-o", "-"], input=src.encode())

def f32(*v): return struct.pack(f"<{len(v)}f", *v)

def run_c(addr:str, src:str, name:str, arrays:list[bytes], vals=(), arch:str|None=None, cc:str="clang") -> list[bytes]:
  """Compiles C kernel src for the CPU the runner reports (or arch, a clang_arch string), runs it once, returns the buffers."""
  with Runner(addr, timeout=120) as c:
    arch = arch or clang_arch(c.info.arch, c.info.cpu, c.info.features)
    code, img, entry = cpu_image(compile_c(src, arch, cc), name)
    hs = []
    for a in arrays:
      c.alloc(h:=c.new_handle(), len(a)); c.write(h, 0, a); hs.append(h)
    c.load(p:=c.new_handle(), P.PROG_CPU_IMAGE, name, img, len(hs), len(vals), entry=entry, arch=code)
    c.launch(p, [(h, 0) for h in hs], list(vals), wait=True)
    out = []
    for h, a in zip(hs, arrays):
      buf = bytearray(len(a)); c.read(h, 0, buf); out.append(bytes(buf))
    return out

def objdump(arch:str, src:str, clang_arch_str:str, cc:str="clang") -> str:
  with tempfile.NamedTemporaryFile(suffix=".o") as f:
    f.write(compile_c(src, clang_arch_str, cc)); f.flush()
    return subprocess.check_output([QEMU[arch][2].replace("gcc", "objdump"), "-d", f.name], text=True)

# *** the daemon under qemu

def test_qemu_refuses_the_seccomp_filter():
  # why every other runner here has --no-confine: qemu-user answers prctl(PR_SET_SECCOMP) with EINVAL, so a confined session cannot start
  with qemu_runner("arm64", confine=True) as (addr, _, log):
    with pytest.raises((RunnerError, RunnerConnectionError), match="cannot start a confined session"):
      with Runner(addr) as c: c.ping()
  assert any("cannot install the system call filter: Invalid argument" in l for l in log), log

def test_qemu_runner_serves_and_reports_its_arch(qrunner):
  arch, addr = qrunner
  out, = run_c(addr, "void add1(float* restrict o, long n) { for (long i = 0; i < n; i++) o[i] += 1.5f; }", "add1", [f32(1, 2, 3, 4)], [4])
  assert out == f32(2.5, 3.5, 4.5, 5.5)
  with Runner(addr) as c: assert c.info.arch == arch and c.info.backend == "cpu"

CRASH = "void crash(float* restrict out) { *(volatile int*)0 = 1; out[0] = 1; }"
ADD = "void add(float* restrict o, const float* restrict a, long n) { for (long i = 0; i < n; i++) o[i] = a[i] + o[i]; }"

def test_qemu_crash_kills_only_its_session(qrunner):
  arch, addr = qrunner
  with Runner(addr, timeout=120) as other:
    other.alloc(keep:=other.new_handle(), 16); other.write(keep, 0, f32(1, 2, 3, 4)); other.sync()
    c = Runner(addr, timeout=120)
    code, img, entry = cpu_image(compile_c(CRASH, clang_arch(c.info.arch, c.info.cpu, c.info.features)), "crash")
    c.alloc(h:=c.new_handle(), 16)
    c.load(p:=c.new_handle(), P.PROG_CPU_IMAGE, "crash", img, 1, 0, entry=entry, arch=code)
    with pytest.raises(RunnerError) as ei: c.launch(p, [(h, 0)], [], wait=True)
    assert ei.value.code_name == "ECRASH" and "SIGSEGV" in str(ei.value), ei.value
    c.close()
    buf = bytearray(16); other.read(keep, 0, buf)   # the session opened before the crash still has its buffer
    assert bytes(buf) == f32(1, 2, 3, 4)
  assert run_c(addr, ADD, "add", [f32(1, 1), f32(2, 3)], [2])[0] == f32(3, 4)   # and a new session works

# *** the CPU report: kernels use what the runner has, never what it lacks (qemu's -cpu changes what HWCAP says)

FP16 = "void h(_Float16* restrict o, const _Float16* restrict a) { for (int i = 0; i < 64; i++) o[i] = a[i] * a[i] + a[i]; }"
FP16_INSNS = r"\bf(?:mul|add|mla|fma)\s+(?:v\d+\.\d+h|h\d+)"

def info(arch:str, cpu:str|None):
  with qemu_runner(arch, cpu=cpu) as (addr, _, _), Runner(addr) as c: return c.info

def test_qemu_arm64_reports_hwcap():
  a53, mx = info("arm64", "cortex-a53"), info("arm64", "max")
  feats = lambda i: set(i.features.replace("+", "").split(",")) - {""}
  assert a53.cpu == mx.cpu == "generic"
  assert not feats(a53) & {"fp16", "dotprod", "sve", "i8mm", "bf16"}, a53.features   # ARMv8.0: none of these
  assert {"fp16", "dotprod", "sve", "i8mm", "bf16", "lse"} <= feats(mx), mx.features   # qemu's max CPU has all of them

def test_qemu_arm64_kernels_follow_the_reported_features():
  with qemu_runner("arm64", cpu="cortex-a53") as (addr, _, _):
    with Runner(addr) as c: small = clang_arch(c.info.arch, c.info.cpu, c.info.features)
    big = "arm64,generic,fp16,dotprod"
    # compiled for what the runner reports, the kernel has no half precision arithmetic, and runs
    assert not re.search(FP16_INSNS, objdump("arm64", FP16, small)) and re.search(FP16_INSNS, objdump("arm64", FP16, big))
    import numpy as np
    a = (np.arange(64) % 5 - 2).astype(np.float16)
    out, _ = run_c(addr, FP16, "h", [bytes(128), a.tobytes()])
    assert (np.frombuffer(out, np.float16) == a * a + a).all()
    # the same kernel compiled for a CPU with FEAT_FP16 is an illegal instruction on this one: the report is what keeps it safe
    with pytest.raises(RunnerError, match="SIGILL"): run_c(addr, FP16, "h", [bytes(128), a.tobytes()], arch=big)

@pytest.mark.parametrize("qrunner", ["riscv64"], indirect=True)
def test_qemu_riscv64_reports_its_isa(qrunner):
  arch, addr = qrunner
  with Runner(addr) as c: i = c.info
  # qemu 7.2's AT_HWCAP has IMAFDC and never V, and its /proc/cpuinfo is the host's (no isa line): V is not claimed, so never used
  assert i.cpu == "rv64imafdc" and i.features == "", (i.cpu, i.features)
  if shutil.which("clang-16") is None: pytest.skip("clang-16 is not installed: clang 14 never vectorizes for V, so it cannot show the difference")
  loop = "void s(float* restrict o, const float* restrict a) { for (int i = 0; i < 256; i++) o[i] = a[i] * 3.0f + o[i]; }"
  vec = r"\bv(?:setvli|le32\.v|se32\.v)"
  assert not re.search(vec, objdump("riscv64", loop, clang_arch(i.arch, i.cpu, i.features), "clang-16"))
  assert re.search(vec, objdump("riscv64", loop, "riscv64,rv64imafdcv", "clang-16"))
  assert run_c(addr, loop, "s", [f32(*[1.0] * 256), f32(*[2.0] * 256)], cc="clang-16")[0] == f32(*[7.0] * 256)
  # compiled for a CPU with V, the same kernel is an illegal instruction on this one (qemu's default riscv64 CPU has no V)
  with pytest.raises(RunnerError, match="SIGILL"): run_c(addr, loop, "s", [bytes(1024), bytes(1024)], arch="riscv64,rv64imafdcv", cc="clang-16")

def test_qemu_riscv64_reads_the_isa_line(tmp_path):
  # a board's kernel gives /proc/cpuinfo an isa line; qemu 7.2 passes the host's file through, so this test gives the guest one of its
  # own: qemu's -L prefix is searched first for every path the guest opens (a harness; it checks the parsing, not a CPU)
  (tmp_path / "proc").mkdir()
  (tmp_path / "lib").symlink_to(pathlib.Path(QEMU["riscv64"][1]) / "lib")
  (tmp_path / "proc" / "cpuinfo").write_text("processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdcv_zicsr_zifencei_zba_zbb_zfh_zkt\nmmu\t\t: sv39\n")
  with qemu_runner("riscv64", sysroot=str(tmp_path)) as (addr, _, _), Runner(addr) as c:
    assert (c.info.cpu, c.info.features, c.info.name) == ("rv64imafdcv", "+zba,+zbb,+zfh", "riscv64 CPU")   # zicsr, zkt: not for kernels
    assert clang_arch(c.info.arch, c.info.cpu, c.info.features) == "riscv64,rv64imafdcv,zba,zbb,zfh"

HELPER_FIRST = """__attribute__((noinline)) float helper(float x) { return x * 3.0f + 1.0f; }
static const float tbl[4] = {1.5f, 2.5f, 3.5f, 4.25f};
void kern(float* restrict out, const float* restrict in, long n) {
  for (long i = 0; i < n; i++) { if (in[i] > 5.0f) out[i] = tbl[i & 3]; else out[i] = helper(in[i]) + tbl[i & 3]; } }"""

@pytest.mark.parametrize("qrunner", ["riscv64"], indirect=True)
@pytest.mark.parametrize("cc", ["clang", "clang-16"])
def test_qemu_riscv64_relaxable_objects_run(qrunner, cc):
  # clang-16 emits R_RISCV_RELAX/ALIGN, branch and compressed-jump relocations (clang 14 does not): both relocate and run on the runner
  arch, addr = qrunner
  if shutil.which(cc) is None: pytest.skip(f"{cc} is not installed")
  from client.cpu_image import RV, rv_load
  types = {t for _, _, t, _ in rv_load(compile_c(HELPER_FIRST, "riscv64,rv64imafdc", cc), "kern")[2]}
  if cc == "clang-16": assert {RV.RELAX, RV.ALIGN, RV.BRANCH, RV.RVC_JUMP} <= types, types
  out, _ = run_c(addr, HELPER_FIRST, "kern", [bytes(32), f32(*range(8))], [8], cc=cc)
  assert struct.unpack("<8f", out) == (2.5, 6.5, 10.5, 14.25, 14.5, 18.5, 3.5, 4.25)

@pytest.mark.parametrize("qrunner", ["riscv64"], indirect=True)
def test_qemu_riscv64_tinygrad_kernels_from_clang16(qrunner):
  # tinygrad with CC=clang-16 (a fresh process, no compile cache): its kernels carry every relaxable relocation, and compute right
  if shutil.which("clang-16") is None: pytest.skip("clang-16 is not installed")
  code = """import json, numpy as np, client.remote_metal, client.cpu_image as ci
from tinygrad import Tensor
seen, relocate = set(), ci.rv_relocate
def spy(image, relocs, name): seen.update(t for _, _, t, _ in relocs); return relocate(image, relocs, name)
ci.rv_relocate = spy
x = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32); a = Tensor(x, device="REMOTE")
got = [(a @ a).relu().sum(axis=1).numpy(), a.softmax(-1).numpy(), a.exp().sin().numpy(), a.argmax(-1).numpy()]
e = np.exp(x - x.max(-1, keepdims=True))
want = [np.maximum(x @ x, 0).sum(1), e / e.sum(-1, keepdims=True), np.sin(np.exp(x)), x.argmax(-1)]
print(json.dumps({"ok": [bool(np.allclose(g, w, rtol=1e-4, atol=1e-4)) for g, w in zip(got, want)], "types": sorted(seen)}))"""
  r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT), "METAL_RUNNER": qrunner[1], "CC": "clang-16",
                     "CACHELEVEL": "0"}, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
  assert r.returncode == 0, r.stderr[-3000:]
  from client.cpu_image import RV
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["ok"] == [True] * 4 and {RV.RELAX, RV.ALIGN, RV.BRANCH, RV.PCREL_HI20} <= set(out["types"]), out

# *** tinygrad on the emulated runners

# Left out under emulation: tests that never run a kernel on the runner's CPU (they check the client and daemon logic that the native
# runs of the same file cover) and cost the most emulated time: a runner killed mid-run, BEAM's handle budget, sharding over two runners,
# a local runner started by the client (native by design), the fake Metal runner, device naming, a rejected load, the allocation retry.
QEMU_SKIP = ["test_runner_dies_mid_run", "test_beam_search_fits_in_few_runner_handles", "test_shard_across_two_runners",
             "test_local_runner_by_default", "test_metal_sends_metal_source", "test_device_names_and_mismatch", "test_rejected_load_is_not_unloaded",
             "test_allocation_over_the_runner_limit_frees_the_cache_and_retries"]
# riscv64 under qemu 7.2 reports no Zfh (its AT_HWCAP has single letters only), and without Zfh clang turns half conversions into calls to
# libgcc's __extendhfsf2/__truncsfhf2, which a self-contained runner image cannot have: tinygrad's renderer still offers half, so the
# float16 case fails with that ImageError (a clear error, not wrong numbers) and is left out there.
QEMU_SKIP_ARCH = {"riscv64": ["test_elementwise_dtypes[float16]"], "arm64": []}

@pytest.mark.parametrize("arch", ARCHS)
def test_qemu_tinygrad_remote_tests(arch, tmp_path):
  """tests/test_tinygrad_remote.py against this CPU's runner: METAL_RUNNER_BIN (conftest.py) names a wrapper that starts it under qemu."""
  env = {k: v for k, v in os.environ.items() if k not in ("METAL_RUNNER", "DEV", "DEBUG", "BEAM", "PYTEST_ADDOPTS")}
  env.update({"METAL_RUNNER_BIN": wrapper(arch, tmp_path), "PYTHONPATH": str(ROOT)})
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_tinygrad_remote.py",
                      "-k", " and ".join(f"not {t}" for t in QEMU_SKIP)] +
                     [f"--deselect=tests/test_tinygrad_remote.py::{t}" for t in QEMU_SKIP_ARCH[arch]],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  tail = r.stdout[-4000:] + r.stderr[-2000:]
  assert r.returncode == 0, tail
  m = re.search(r"(\d+) passed(?:, (\d+) skipped)?(?:, (\d+) deselected)?", r.stdout)
  assert m and int(m.group(1)) >= 25, tail
  print(f"{arch} under qemu: {m.group(0)}")
  # the only skips allowed are dtypes: one the renderer does not offer for this CPU (riscv64: bfloat16), or one this host's clang cannot
  # compile for tinygrad's own CPU device, the reference (clang 14: bfloat16 on x86-64)
  for line in re.findall(r"SKIPPED .*", r.stdout): assert re.search(r"is not supported by the CPU renderer|own CPU device either", line), line

def train(env:dict, *args) -> list[tuple[int, float]]:
  r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_mlp.py"), *args], env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                     capture_output=True, text=True, timeout=600, cwd=str(ROOT))
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  return [(int(s), float(l)) for s, l in re.findall(r"step\s+(\d+)\s+loss (\S+)", r.stdout)]

def test_qemu_tinyjit_mlp_training(qrunner):
  arch, addr = qrunner
  args = ["--steps", "20", "--batch", "64", "--hidden", "32", "--lr", "3e-2"]   # small: every step is emulated
  remote, local = train({"METAL_RUNNER": addr}, *args), train({}, "--local", *args)
  assert [s for s, _ in remote] == [1, 20] and [s for s, _ in local] == [1, 20]
  for (_, r), (_, l) in zip(remote, local): assert abs(r - l) <= 1e-3 * max(1.0, abs(l)), (remote, local)
  assert remote[-1][1] < 0.95 * remote[0][1], remote   # the loss falls (2.10 -> 1.92 on tinygrad's CPU device)
