# Host-side production of CPU images (client/cpu_image.py), no daemon: compile with tinygrad's ClangRenderer, relocate, find the entry.
import array, ctypes, mmap, pathlib, platform, re, shutil, subprocess, tempfile
import numpy as np
import pytest
from tinygrad import Tensor
from tinygrad.codegen import to_program
from tinygrad.helpers import NUM_CPU_THREADS, Target, mv_address
from tinygrad.renderer.cstyle import ClangRenderer
from tinygrad.runtime.support.compiler_cpu import ClangCompiler
from client.cpu_image import RV, ImageError, clang_arch, cpu_image, rv_load
from client.protocol import ARCH_ARM64, ARCH_RISCV64, ARCH_X86_64

pytestmark = pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed")
X86 = platform.machine().lower() in ("x86_64", "amd64")
BASE_X86 = "x86_64,x86-64"

def kernel(t:Tensor, arch:str):
  (call,) = t.schedule_linear().src
  return to_program(call.src[0], ClangRenderer(Target("REMOTE", arch=arch)))

def run_image(image:bytes, entry:int, args:list[int]):
  """Maps the image at a fresh address (not the base it was relocated at) and calls the entry like the runner: every argument 64-bit."""
  mem = mmap.mmap(-1, len(image), mmap.MAP_ANON | mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
  mem.write(image)
  ctypes.CFUNCTYPE(None)(mv_address(mem) + entry)(*[ctypes.c_uint64(a) for a in args])

@pytest.mark.skipif(not X86, reason="runs x86-64 machine code")
@pytest.mark.parametrize("make,ref,threaded", [(lambda x: x * 3 + 1, lambda a: a * 3 + 1, False),
                                               (lambda x: (x.reshape(64, 64) @ x.reshape(64, 64)).sum(axis=1), lambda a: (a @ a).sum(axis=1), True)])
def test_tinygrad_kernel_runs_from_image(make, ref, threaded):
  prg = kernel(make(Tensor.empty(4096, device="CPU")), BASE_X86)
  elf = prg.to_elf()
  code, image, entry = cpu_image(elf.lib, elf.name)
  assert code == ARCH_X86_64 and 0 <= entry < len(image) and image[:4] != b"\x7fELF"
  src = (np.arange(4096, dtype=np.float32) % 7 - 3).reshape(64, 64) if threaded else np.arange(4096, dtype=np.float32) % 7
  out = np.zeros(ref(src).shape, dtype=np.float32)
  args = [out.ctypes.data, src.ctypes.data] + [0] * (len(elf.signature) - 2)
  core = next((i for i, (nm, *_) in enumerate(elf.signature) if nm == "core_id"), None)
  if threaded and NUM_CPU_THREADS.value > 1: assert core is not None, "expected a kernel split over core_id"
  for tid in range(prg.arg.global_size[0] if core is not None else 1):  # as the runner calls it: once per core_id
    if core is not None: args[core] = tid
    run_image(image, entry, args)
  np.testing.assert_allclose(out, ref(src), rtol=1e-5)

HELPER_FIRST = """__attribute__((noinline)) float helper(float x) { return x * 3.0f + 1.0f; }
static const float tbl[4] = {1.5f, 2.5f, 3.5f, 4.25f};
void kern(float* restrict out, const float* restrict in, long n) { for (long i = 0; i < n; i++) out[i] = helper(in[i]) + tbl[i & 3]; }"""

def test_entry_is_the_named_function_not_offset_zero():
  code, image, entry = cpu_image(ClangCompiler(BASE_X86.split(",")).compile(HELPER_FIRST), "kern")
  assert code == ARCH_X86_64 and entry > 0
  if X86:  # the call to helper and the load from .rodata were relocated correctly
    src, out = array.array("f", range(8)), array.array("f", [0.0] * 8)
    run_image(image, entry, [out.buffer_info()[0], src.buffer_info()[0], 8])
    assert list(out) == [2.5, 6.5, 10.5, 14.25, 14.5, 18.5, 22.5, 26.25]

def test_cross_compiled_arm64_image():
  elf = kernel(Tensor.empty(64, device="CPU").reshape(8, 8).sum(axis=1), "arm64,generic").to_elf()
  code, image, entry = cpu_image(elf.lib, elf.name)
  assert code == ARCH_ARM64 and 0 <= entry < len(image) and len(image) % 4 == 0
  with pytest.raises(ImageError, match="no function named nope"): cpu_image(elf.lib, "nope")

def test_undefined_symbol_is_a_clear_error():
  obj = ClangCompiler(BASE_X86.split(",")).compile("float sinf(float); void kern(float* o) { o[0] = sinf(o[0]); }")
  with pytest.raises(ImageError, match="kernel kern: .*undefined symbol sinf"): cpu_image(obj, "kern")

def test_not_an_elf_object():
  with pytest.raises(ImageError, match="not a 64-bit ELF"): cpu_image(b"kernel void k() {}", "k")

def test_clang_arch_follows_the_runner():
  assert clang_arch("x86_64", "x86-64-v3", "+avx2,-avx512f") == "x86_64,x86-64-v3,avx2,-avx512f"
  assert clang_arch("aarch64", "apple-m1", "") == "arm64,apple-m1"
  # "native" would compile for this host, which need not be the runner: use the arch baseline plus the reported features
  assert clang_arch("x86_64", "native", "+fma") == "x86_64,x86-64,fma" and clang_arch("arm64", "", "") == "arm64,generic"
  with pytest.raises(ImageError, match="sparc"): clang_arch("sparc", "v9", "")
  assert ClangCompiler(clang_arch("x86_64", "x86-64-v3", "+avx2,-avx512f").split(",")).args == ["-march=x86-64-v3", "-mavx2", "-mno-avx512f"]
  # the string works for a real compile, with clang as installed here
  elf = kernel(Tensor.empty(16, device="CPU") + 1, clang_arch("x86_64", "x86-64-v2", "+sse4.2")).to_elf()
  assert cpu_image(elf.lib, elf.name)[0] == ARCH_X86_64

# *** riscv64: tinygrad's jit_loader has no RISC-V relocations; client/cpu_image.py applies them. Checked against GNU ld (binutils-riscv64-
# linux-gnu) linking the same object at the same addresses, and the branch targets against GNU objdump's decoding; running the images is
# in tests/test_qemu_runners.py (a riscv64 runner under qemu).

RV_TOOLS = all(shutil.which(t) for t in ("riscv64-linux-gnu-ld", "riscv64-linux-gnu-objcopy", "riscv64-linux-gnu-objdump"))
needs_rv_tools = pytest.mark.skipif(not RV_TOOLS, reason="binutils-riscv64-linux-gnu is not installed (setup.sh test installs it)")

def rv_obj(src:str, cc:str="clang", *flags:str) -> bytes:
  if shutil.which(cc) is None: pytest.skip(f"{cc} is not installed")
  comp = ClangCompiler(["riscv64", "rv64imafdc"])
  return subprocess.check_output([cc, "-c", "-x", "c", "-O2", "-fPIC", "-ffreestanding", "-fno-math-errno", "-nostdlib", "-fno-ident",
                                  "--target=riscv64-none-unknown-elf", *comp.args, *flags, "-", "-o", "-"], input=src.encode())

def ld_image(obj:bytes) -> bytes:
  """GNU ld's link of obj with every section at the address rv_load gave it, as flat bytes."""
  secs, _, _ = rv_load(obj, "k")
  d = pathlib.Path(tempfile.mkdtemp())
  (d / "k.o").write_bytes(obj)
  (d / "k.ld").write_text("SECTIONS {\n" + "".join(f"  {s.name} {s.header.sh_addr:#x} : {{ *({s.name}) }}\n" for s in secs
                          if s.header.sh_type == 1 and s.header.sh_size and s.header.sh_flags & 2) + "  /DISCARD/ : { *(*) }\n}\n")
  subprocess.check_call(["riscv64-linux-gnu-ld", "--no-relax", "-T", str(d / "k.ld"), "-o", str(d / "k.elf"), str(d / "k.o")])
  subprocess.check_call(["riscv64-linux-gnu-objcopy", "-O", "binary", str(d / "k.elf"), str(d / "k.bin")])
  return (d / "k.bin").read_bytes()

def riscv_tinygrad_objs() -> list[tuple[str, bytes]]:
  x = Tensor.empty(64, 64, device="CPU")
  out = []
  for t in [x.exp().sin() * 3 + 1, (x @ x).relu().sum(axis=1), x.softmax(-1), x.reshape(1, 1, 64, 64).conv2d(Tensor.empty(4, 1, 3, 3, device="CPU"))]:
    for call in t.schedule_linear().src:
      elf = to_program(call.src[0], ClangRenderer(Target("REMOTE", arch="riscv64,rv64imafdc"))).to_elf()
      out.append((elf.name, elf.lib))
  return out

@needs_rv_tools
def test_riscv64_tinygrad_kernels_relocate_as_gnu_ld_links_them():
  # clang 14 emits R_RISCV_PCREL_HI20/LO12_I for every constant tinygrad's kernels load
  objs = riscv_tinygrad_objs()
  assert any(t == RV.PCREL_HI20 for _, o in objs for _, _, t, _ in rv_load(o, "k")[2]), "no relocations: the test checks nothing"
  for name, obj in objs:
    code, image, entry = cpu_image(obj, name)
    assert code == ARCH_RISCV64 and 0 <= entry < len(image)
    ref = ld_image(obj)
    assert image[:len(ref)] == ref and not any(image[len(ref):]), name

@needs_rv_tools
@pytest.mark.parametrize("cc,flags", [("clang", ()), ("clang-16", ("-mno-relax",))])
def test_riscv64_calls_and_rodata_relocate_as_gnu_ld_links_them(cc, flags):
  obj = rv_obj(HELPER_FIRST, cc, *flags)
  types = {t for _, _, t, _ in rv_load(obj, "kern")[2]}
  assert {RV.CALL_PLT, RV.PCREL_HI20, RV.PCREL_LO12_I} <= types, types
  code, image, entry = cpu_image(obj, "kern")
  assert code == ARCH_RISCV64 and entry > 0 and image[:len(ref:=ld_image(obj))] == ref

BRANCHY = HELPER_FIRST + "\nvoid kern2(float* restrict out, const float* restrict in, long n) { for (long i = 0; i < n; i++) { if (in[i] > 2.0f) " \
  "out[i] = tbl[i & 3]; else out[i] = helper(in[i]); } }"

@needs_rv_tools
def test_riscv64_relaxable_object_branch_targets():
  # clang 16 emits R_RISCV_RELAX/ALIGN and leaves branches to the linker (BRANCH, RVC_BRANCH, RVC_JUMP); GNU ld would delete ALIGN padding,
  # we keep it, so compare each relocated instruction's target as GNU objdump decodes it with the relocation's symbol + addend
  obj = rv_obj(BRANCHY, "clang-16")
  relocs = rv_load(obj, "kern")[2]
  want = {p: s + a for p, s, t, a in relocs if t in (RV.BRANCH, RV.JAL, RV.RVC_BRANCH, RV.RVC_JUMP)}
  calls = {p + 4: s + a for p, s, t, a in relocs if t == RV.CALL_PLT}   # objdump prints the auipc+jalr target on the jalr
  assert {RV.RELAX, RV.ALIGN, RV.BRANCH, RV.RVC_BRANCH, RV.RVC_JUMP} <= {t for _, _, t, _ in relocs}, "clang-16 no longer emits these"
  _, image, _ = cpu_image(obj, "kern")
  with tempfile.NamedTemporaryFile(suffix=".bin") as f:
    f.write(image); f.flush()
    dis = subprocess.check_output(["riscv64-linux-gnu-objdump", "-D", "-b", "binary", "-m", "riscv:rv64", f.name], text=True)
  got = {int(a, 16): int(t, 16) for a, t in re.findall(r"^\s*([0-9a-f]+):\s+[0-9a-f]+\s+\S+\s+(?:.*?[,\s])?0x([0-9a-f]+)\s*(?:<.*>)?$", dis, re.M)}
  assert want and calls and {p: got.get(p) for p in want} == want and {p: got.get(p) for p in calls} == calls, dis

def test_riscv64_undefined_symbol_and_absolute_address_are_clear_errors():
  with pytest.raises(ImageError, match="kernel kern: undefined symbol sinf"):
    cpu_image(rv_obj("float sinf(float); void kern(float* o) { o[0] = sinf(o[0]); }"), "kern")
  with pytest.raises(ImageError, match="absolute address|GOT"):  # a table of addresses needs the base the runner maps it at
    cpu_image(rv_obj("static float a, b; static float* const t[2] = {&a, &b}; void kern(float* o, long i) { o[0] = *t[i & 1]; }"), "kern")

# *** x86-64: the runner reports, beyond its -march=x86-64-vN level, the extensions the CPU has that the level leaves out (backend_cpu.c)

X86_FLAGS = {"avx": "avx", "f16c": "f16c", "fma": "fma", "avx2": "avx2", "avx512f": "avx512f", "avx512bf16": "avx512_bf16",
             "avx512fp16": "avx512_fp16", "avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "avx512ifma": "avx512ifma",
             "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2", "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
             "gfni": "gfni"}
LEVEL_HAS = {"x86-64": set(), "x86-64-v2": set(), "x86-64-v3": {"avx", "f16c", "fma", "avx2"}, "x86-64-v4": {"avx", "f16c", "fma", "avx2", "avx512f"}}

@pytest.mark.skipif(not X86 or not pathlib.Path("/proc/cpuinfo").exists(), reason="x86-64 Linux: compares with /proc/cpuinfo")
def test_x86_64_runner_reports_the_features_its_level_leaves_out(own_runner):
  from client.connection import Runner
  with Runner(own_runner[0]) as c: info = c.info
  flags = set(next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split(":")[1].split())
  feats = [f.removeprefix("+") for f in info.features.split(",") if f]
  assert all(f in X86_FLAGS and X86_FLAGS[f] in flags for f in feats), (feats, "a feature this CPU does not have")
  # every one this CPU has and its level does not imply is reported (the kernel's flags can only be fewer: it hides what the OS cannot save)
  assert {f for f, fl in X86_FLAGS.items() if fl in flags} - LEVEL_HAS[info.cpu] == set(feats), (info.cpu, feats)
  # and clang takes the string as it is, without a warning about an unknown feature
  args = ClangCompiler(clang_arch(info.arch, info.cpu, info.features).split(",")).args
  r = subprocess.run(["clang", "-c", "-x", "c", "--target=x86_64-none-unknown-elf", *args, "-", "-o", "/dev/null"],
                     input="void k(float* a) { a[0] += 1; }", capture_output=True, text=True)
  assert r.returncode == 0 and not r.stderr, r.stderr
