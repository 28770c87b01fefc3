"""The Metal emulator's <metal_stdlib> (tests/metal_emulator/include) against what tinygrad 0.14.0's MetalRenderer renders.

TEST HARNESS: the Metal emulator compiles Metal Shading Language as C++ with clang++-16 and runs each GPU thread on the CPU. Here,
on Linux and with no device, tinygrad's MetalRenderer (arch Apple7, so with tensor cores) renders a corpus of kernels; each must
compile with the emulator's command, plus the METAL_EMU_KERNEL descriptor line the emulator appends per kernel. Then a small C++
driver (a stand-in for the emulator's runtime: one OS thread per GPU thread, a real barrier and simdgroup exchange) runs a handful
of them and the results are compared with numpy: elementwise float, half, bfloat and int64, a matmul without tensor cores, a
reduction through threadgroup memory and barriers, and tensor-core (simdgroup_multiply_accumulate) matmuls, which check Apple's
lane layout together with tinygrad's swizzle. What this cannot show: that Apple's compiler and GPU give the same bits.
"""
import ctypes, functools, math, os, re, shutil, subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "tests" / "metal_emulator" / "include"
CLANG = shutil.which("clang++-16")

pytestmark = pytest.mark.skipif(CLANG is None, reason="clang++-16 is not installed; the Metal emulator compiles Metal source with it "
                                "(Debian: apt-get install clang-16)")

# the emulator's compile command, as the emulator runs it
# (tests/metal_emulator/library.c: run_compiler)
COMPILE = [CLANG or "clang++-16", "-x", "c++", "-std=c++17", "-O2", "-fPIC", "-shared", "-fno-fast-math", "-fwrapv", "-fno-strict-aliasing",
           "-Xclang", "-ffloat16-excess-precision=none", "-w", "-I", str(INCLUDE), "-D__METAL_VERSION__=310"]

# *** the emulator's source step: the kernel descriptors, and "threadgroup" out of casts

# [[attribute]] -> enum metal_emu_builtin (tests/metal_emulator/include/metal_emu_abi.h)
BUILTINS = {"threadgroup_position_in_grid": 1, "thread_position_in_threadgroup": 2, "thread_position_in_grid": 3,
            "threads_per_threadgroup": 4, "threadgroups_per_grid": 5, "threads_per_grid": 6, "thread_index_in_threadgroup": 7,
            "thread_index_in_simdgroup": 8, "simdgroup_index_in_threadgroup": 9}

def kernel_lines(src:str) -> list[str]:
  """One METAL_EMU_KERNEL line per kernel: a parameter without an attribute takes the next argument table index."""
  lines = []
  for name, params in re.findall(r"\bkernel\s+void\s+(\w+)\s*\(([^)]*)\)\s*\{", src):
    descs, index = [], 0
    for p in params.split(","):
      if (m:=re.search(r"\[\[\s*(\w+)", p)): descs.append(f"{{0,{BUILTINS[m.group(1)]},-1,0}}")
      else: descs, index = descs + [f"{{0,0,{index},0}}"], index + 1
    lines.append(f"METAL_EMU_KERNEL({name}, {', '.join(descs)})")
  return lines

def emulator_source(src:str) -> str:
  # A storage class cannot appear in a cast: tinygrad casts threadgroup memory as "(threadgroup __attribute__((aligned(16))) float4*)",
  # and <metal_stdlib> defines threadgroup as static for the declarations.
  return re.sub(r"\(\s*threadgroup\b", "(", src) + "\n" + "\n".join(kernel_lines(src)) + "\n"

def compile_metal(src:str, out:Path) -> subprocess.CompletedProcess:
  (cpp:=out.with_suffix(".cpp")).write_text(emulator_source(src))
  return subprocess.run([*COMPILE, str(cpp), "-o", str(out)], capture_output=True, text=True, timeout=120)

# *** rendering with tinygrad's MetalRenderer on Linux, without a device

@functools.cache
def renderer(arch:str="Apple7"):
  # client.remote_metal installs the tinygrad.runtime.ops_metal shim whose MetalCompiler (a no-op here) the renderer imports
  from client.remote_metal import MetalRenderer
  from tinygrad.helpers import Target
  return MetalRenderer(Target("METAL", "", arch))

def programs(*ts, arch="Apple7"):
  """[(ProgramInfo, source, arguments)] for the kernels that realize ts: arguments are the kernel's buffer UOps, in slot order."""
  from tinygrad.codegen import to_program
  from tinygrad.engine.realize import get_call_arg_uops
  from tinygrad.uop.ops import Ops
  lin, _ = ts[0].linear_with_vars(*ts[1:])
  out = []
  for call in lin.src:
    if call.src[0].op is not Ops.SINK: continue
    prg = to_program(call.src[0], renderer(arch))
    out.append((prg.arg, next(s.arg for s in prg.src if s.op is Ops.SOURCE), get_call_arg_uops(call)))
  return out

def E(*shape, dt=None):
  from tinygrad import Tensor, dtypes
  return Tensor.empty(*shape, device="CPU", dtype=dt or dtypes.float)

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "bfloat16"]

def corpus() -> dict[str, list]:
  from tinygrad import Variable, dtypes
  cases: dict[str, list] = {}
  for label in DTYPES:
    dt = getattr(dtypes, label)
    # few kernels, many ops: every program costs a compile
    a, b, f = E(64, dt=dt), E(64, dt=dt), E(64)
    if dtypes.is_int(dt):
      alu = (a + b * a - b).maximum(b) + (a < b).where(a, b) + (a == b).cast(dt) + (a // b) + (a % b) + (a << 2) + (a >> 1) + ((a & b) | (a ^ b))
      alu = alu if dtypes.is_unsigned(dt) else alu - a
    else:
      alu = (a + b * a - b).maximum(b) + (a < b).where(a, b) + (a == b).cast(dt) + a.sqrt() + a.exp2() + a.log2() + a.sin() + a.reciprocal() \
        - a / b + a.trunc() + a.floor() + a.ceil() + a.round() + a.exp() + a.log() + a.cos() + a.pow(b) + a.abs() + a.relu() \
        + a.isinf().where(a.isnan().cast(dt), a)
    cases[f"elementwise_{label}"] = [alu, a.cast(dtypes.float) + f.cast(dt).cast(dtypes.float), a.sum(), a.max()]
  b1, b2 = E(64, dt=dtypes.bool), E(64, dt=dtypes.bool)
  cases["elementwise_bool"] = [(b1 & b2) | (b1 ^ b2), (b1 != b2).where(1, 2).cast(dtypes.int32), b1.cast(dtypes.float)]
  cases["cast"] = [E(16, dt=s).cast(d) for s, d in [(dtypes.float, dtypes.int32), (dtypes.int32, dtypes.float16), (dtypes.float16, dtypes.bfloat16),
    (dtypes.bfloat16, dtypes.float16), (dtypes.uint8, dtypes.float), (dtypes.int64, dtypes.float16), (dtypes.float, dtypes.bool),
    (dtypes.bool, dtypes.float), (dtypes.uint64, dtypes.int8), (dtypes.int32, dtypes.bfloat16), (dtypes.bfloat16, dtypes.int32)]]
  cases["bitcast"] = [(E(16, dt=s) + 1).bitcast(d) for s, d in [(dtypes.float, dtypes.int32), (dtypes.float, dtypes.uint32), (dtypes.int32, dtypes.float),
    (dtypes.float16, dtypes.int16), (dtypes.float16, dtypes.uint16), (dtypes.int64, dtypes.uint64), (dtypes.bfloat16, dtypes.uint16),
    (dtypes.uint8, dtypes.int8)]]
  a = E(32, 48)
  cases["reduce"] = [a.sum(axis=1), a.argmax(axis=1), a.cumsum(axis=1), a.softmax(axis=1), E(4096).sum(), E(1024, dt=dtypes.half).sum(),
                     E(256, 256).sum(axis=0)]
  cases["matmul"] = [E(16, 16) @ E(16, 16), E(16, 16, dt=dtypes.half) @ E(16, 16, dt=dtypes.half), E(33, 65) @ E(65, 17),
                     E(64, 64, dt=dtypes.bfloat16) @ E(64, 64, dt=dtypes.bfloat16), (E(32, 32, dt=dtypes.half) @ E(32, 32, dt=dtypes.half)).float(),
                     E(16, 16, dt=dtypes.int) @ E(16, 16, dt=dtypes.int), E(1, 4096) @ E(4096, 512)]
  cases["conv2d"] = [E(1, 3, 16, 16).conv2d(E(8, 3, 3, 3)), E(2, 4, 9, 9).conv2d(E(4, 4, 3, 3), stride=2, padding=1),
                     E(1, 4, 8, 8).max_pool2d(), E(1, 4, 8, 8).avg_pool2d()]
  n = Variable("n", 1, 128).bind(37)
  cases["symbolic"] = [E(128)[:n].contiguous() * 2, E(128)[:n].sum()]
  # a Variable whose range passes int32: MetalRenderer declares it "constant long&"
  cases["symbolic_long"] = [(E(4, dt=dtypes.int64) * Variable("big", 1, 2**33).bind(5)).contiguous()]
  cases["misc"] = [(E(64) > 0).where(E(64), 0.0), (E(64) == float("inf")).where(float("nan"), E(64)), E(8, 8).gelu(), E(8, 8).sigmoid(), E(16).tanh()]
  return {k: [src for t in ts for _, src, _ in programs(t)] for k, ts in cases.items()}

@pytest.fixture(scope="module")
def rendered() -> dict[str, list[str]]: return corpus()

@pytest.fixture(scope="module")
def compiled(rendered, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
  """Every distinct rendered program compiled once, in parallel."""
  d = tmp_path_factory.mktemp("msl")
  srcs = sorted({s for v in rendered.values() for s in v})
  with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
    return dict(zip(srcs, pool.map(lambda i: compile_metal(srcs[i], d / f"k{i}.so"), range(len(srcs)))))

CORPUS_KEYS = [f"elementwise_{d}" for d in DTYPES] + ["elementwise_bool", "cast", "bitcast", "reduce", "matmul", "conv2d", "symbolic",
                                                      "symbolic_long", "misc"]

@pytest.mark.parametrize("key", CORPUS_KEYS)
def test_corpus_compiles(rendered, compiled, key):
  assert rendered[key], f"{key}: tinygrad rendered no kernel"
  for src in rendered[key]:
    r = compiled[src]
    assert r.returncode == 0, f"{key}: the emulator's compile failed:\n{r.stderr[-3000:]}\n--- source ---\n{emulator_source(src)}"

def test_corpus_covers_what_the_header_is_for(rendered):
  """The corpus must reach the constructs <metal_stdlib> exists for, or the compile test above proves less than it claims."""
  src = "\n".join(s for v in rendered.values() for s in v)
  for needle in ["simdgroup_multiply_accumulate(", "simdgroup_float8x8", "simdgroup_half8x8", "simdgroup_bfloat8x8",
                 "threadgroup_barrier(mem_flags::mem_threadgroup)", "(threadgroup __attribute__((aligned(16)))", "constant long&",
                 "constant int&", "as_type<", "precise::sin(", "INFINITY", "NAN", "bfloat", "half4", "float4("]:
    assert needle in src, f"no rendered kernel contains {needle!r}"

def test_kernel_lines():
  src = ("kernel void E_4(device float* data0_4, constant long& data1_, uint3 gid [[threadgroup_position_in_grid]], "
         "uint3 lid [[thread_position_in_threadgroup]]) {\n}")
  assert kernel_lines(src) == ["METAL_EMU_KERNEL(E_4, {0,0,0,0}, {0,0,1,0}, {0,1,-1,0}, {0,2,-1,0})"]

# *** running kernels: a stand-in for the emulator's runtime

DRIVER = r"""
#include <metal_emu_abi.h>
#include <dlfcn.h>
#include <string.h>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

/* A reusable barrier for count threads. */
struct barrier_t {
	std::mutex m;
	std::condition_variable cv;
	unsigned count = 0, waiting = 0, gen = 0;
	void wait() {
		std::unique_lock<std::mutex> l(m);
		unsigned g = gen;
		if (++waiting == count) { waiting = 0; gen++; cv.notify_all(); return; }
		cv.wait(l, [&] { return gen != g; });
	}
};

struct simdgroup_t { barrier_t bar; std::vector<unsigned char> buf; };
struct group_t { barrier_t bar; std::vector<simdgroup_t> simd; };

static thread_local group_t *my_group;
static thread_local unsigned my_index;	/* thread_index_in_threadgroup */

static void rt_barrier(void) { my_group->bar.wait(); }
static unsigned rt_simd_lane(void) { return my_index % METAL_EMU_SIMD_WIDTH; }
static void rt_simd_exchange(const void *mine, void *all, size_t n)
{
	simdgroup_t &s = my_group->simd[my_index / METAL_EMU_SIMD_WIDTH];
	s.bar.wait();	/* everyone has read the last exchange */
	if (rt_simd_lane() == 0) s.buf.assign(n * METAL_EMU_SIMD_WIDTH, 0);
	s.bar.wait();
	if (n) memcpy(s.buf.data() + rt_simd_lane() * n, mine, n);
	s.bar.wait();
	if (n) memcpy(all, s.buf.data(), n * METAL_EMU_SIMD_WIDTH);
}
static const struct metal_emu_rt table = { rt_barrier, rt_simd_exchange, rt_simd_lane };

/* Runs kernel name of library so over grid threadgroups of local threads, each on its own OS thread. Returns 0, or -1 with err. */
extern "C" int emu_run(const char *so, const char *name, void *const *args, const unsigned *grid, const unsigned *local, char *err)
{
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	if (!h) { strcpy(err, dlerror()); return -1; }
	std::string sym = std::string("metal_emu_kernel_") + name;
	const struct metal_emu_kernel *k = (const struct metal_emu_kernel *)dlsym(h, sym.c_str());
	const struct metal_emu_rt **rtp = (const struct metal_emu_rt **)dlsym(h, "metal_emu_rt");
	if (!k || !rtp) { strcpy(err, "missing symbol"); dlclose(h); return -1; }
	*rtp = &table;
	unsigned nthreads = local[0] * local[1] * local[2];
	for (unsigned gz = 0; gz < grid[2]; gz++) for (unsigned gy = 0; gy < grid[1]; gy++) for (unsigned gx = 0; gx < grid[0]; gx++) {
		group_t g;
		g.bar.count = nthreads;
		g.simd = std::vector<simdgroup_t>((nthreads + METAL_EMU_SIMD_WIDTH - 1) / METAL_EMU_SIMD_WIDTH);
		for (unsigned i = 0; i < g.simd.size(); i++)
			g.simd[i].bar.count = std::min<unsigned>(METAL_EMU_SIMD_WIDTH, nthreads - i * METAL_EMU_SIMD_WIDTH);
		std::vector<std::thread> ts;
		for (unsigned i = 0; i < nthreads; i++) ts.emplace_back([&, i] {
			my_group = &g; my_index = i;
			struct metal_emu_ids ids;
			memset(&ids, 0, sizeof(ids));
			unsigned l[3] = { i % local[0], i / local[0] % local[1], i / (local[0] * local[1]) }, gg[3] = { gx, gy, gz };
			for (int d = 0; d < 3; d++) {
				ids.v[METAL_EMU_THREADGROUP_POSITION_IN_GRID][d] = gg[d];
				ids.v[METAL_EMU_THREAD_POSITION_IN_THREADGROUP][d] = l[d];
				ids.v[METAL_EMU_THREAD_POSITION_IN_GRID][d] = gg[d] * local[d] + l[d];
				ids.v[METAL_EMU_THREADS_PER_THREADGROUP][d] = local[d];
				ids.v[METAL_EMU_THREADGROUPS_PER_GRID][d] = grid[d];
				ids.v[METAL_EMU_THREADS_PER_GRID][d] = grid[d] * local[d];
			}
			ids.v[METAL_EMU_THREAD_INDEX_IN_THREADGROUP][0] = i;
			ids.v[METAL_EMU_THREAD_INDEX_IN_SIMDGROUP][0] = i % METAL_EMU_SIMD_WIDTH;
			ids.v[METAL_EMU_SIMDGROUP_INDEX_IN_THREADGROUP][0] = i / METAL_EMU_SIMD_WIDTH;
			k->thunk(args, &ids);
		});
		for (auto &t : ts) t.join();
	}
	dlclose(h);
	return 0;
}
"""

@pytest.fixture(scope="module")
def driver(tmp_path_factory):
  d = tmp_path_factory.mktemp("driver")
  (d / "driver.cpp").write_text(DRIVER)
  r = subprocess.run([CLANG, "-std=c++17", "-O1", "-fPIC", "-shared", "-pthread", "-I", str(INCLUDE), str(d / "driver.cpp"), "-o",
                      str(d / "driver.so"), "-ldl"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  lib = ctypes.CDLL(str(d / "driver.so"))
  lib.emu_run.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint),
                          ctypes.POINTER(ctypes.c_uint), ctypes.c_char_p]
  return lib, d

def np_dtype(dt): return np.dtype(np.uint16) if dt.fmt is None else np.dtype(dt.fmt)   # bfloat16 as its bits

def run(driver, out, inputs:dict, arch="Apple7", vals=()) -> tuple[np.ndarray, list[str]]:
  """Realizes out on the emulator, kernel by kernel: inputs maps Tensors to numpy arrays (bfloat16 as their uint16 bits). Returns out's
  contents and the sources run."""
  lib, d = driver
  progs = programs(out, arch=arch)
  mem = {t.uop.buf_uop: np.ascontiguousarray(v) for t, v in inputs.items()}
  for i, (info, src, args) in enumerate(progs):
    r = compile_metal(src, so:=d / f"run{abs(hash(src))}_{i}.so")
    assert r.returncode == 0, r.stderr
    for b in args:
      if b not in mem: mem[b] = np.zeros(math.prod(b.max_shape), dtype=np_dtype(b.dtype))
    bufs = [mem[b] for b in args] + [np.array([v], dtype=np.int64 if "constant long&" in src else np.int32) for v in vals]
    argv = (ctypes.c_void_p * len(bufs))(*[b.ctypes.data for b in bufs])
    gs, ls = info.launch_dims({})
    name = re.search(r"kernel\s+void\s+(\w+)", src).group(1)
    err = ctypes.create_string_buffer(512)
    assert lib.emu_run(str(so).encode(), name.encode(), argv, (ctypes.c_uint * 3)(*gs), (ctypes.c_uint * 3)(*(ls or (1, 1, 1))), err) == 0, \
      err.value.decode()
  return mem[out.uop.buf_uop], [src for _, src, _ in progs]

rng = np.random.default_rng(0)

def test_elementwise_float(driver):
  from tinygrad import dtypes
  a, b = E(256), E(256)
  x, y = rng.standard_normal(256).astype(np.float32), rng.uniform(0.5, 2, 256).astype(np.float32)
  got, _ = run(driver, (a * float(y.mean()) + b.sqrt() * a.exp2() - b.log2() + a.sin()).contiguous(), {a: x, b: y})
  want = x * np.float32(y.mean()) + np.sqrt(y) * np.exp2(x) - np.log2(y) + np.sin(x)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  got, _ = run(driver, (a < b).where(a, -b).maximum(a * 0.5).cast(dtypes.int32).contiguous(), {a: x * 10, b: y})
  np.testing.assert_array_equal(got, np.maximum(np.where(x * 10 < y, x * 10, -y), x * 5).astype(np.int32))

def test_elementwise_half(driver):
  from tinygrad import dtypes
  a, b = E(128, dt=dtypes.half), E(128, dt=dtypes.half)
  x, y = rng.uniform(-4, 4, 128).astype(np.float16), rng.uniform(0.5, 2, 128).astype(np.float16)
  got, srcs = run(driver, (a * b + b.sqrt()).contiguous(), {a: x, b: y})
  assert any("half" in s for s in srcs)
  np.testing.assert_allclose(got.astype(np.float32), (x * y + np.sqrt(y)).astype(np.float32), rtol=2e-3, atol=2e-3)

def test_elementwise_int64(driver):
  from tinygrad import dtypes
  a, b = E(64, dt=dtypes.int64), E(64, dt=dtypes.int64)
  x, y = rng.integers(-2**40, 2**40, 64), rng.integers(1, 2**20, 64)
  got, _ = run(driver, (a * b + (a.abs() // b) - (a.abs() % b) + (a >> 3)).contiguous(), {a: x, b: y})
  np.testing.assert_array_equal(got, x * y + np.abs(x) // y - np.abs(x) % y + (x >> 3))

def test_elementwise_bfloat16(driver):
  from tinygrad import dtypes
  a = E(64, dt=dtypes.bfloat16)
  x = rng.standard_normal(64).astype(np.float32)
  bits = bf16_bits(x)
  xf = bf16_float(bits)
  got, _ = run(driver, (a * a + 1).contiguous(), {a: bits})
  got = bf16_float(got)
  np.testing.assert_allclose(got, xf * xf + 1, rtol=2**-7)

def test_symbolic_long(driver):
  from tinygrad import Variable, dtypes
  a = E(4, dt=dtypes.int64)
  got, srcs = run(driver, (a * Variable("big", 1, 2**33).bind(3_000_000_000)).contiguous(), {a: np.arange(1, 5)}, vals=(3_000_000_000,))
  assert "constant long&" in srcs[0]
  np.testing.assert_array_equal(got, np.arange(1, 5) * 3_000_000_000)

def test_matmul_without_tensor_cores(driver):
  a, b = E(33, 65), E(65, 17)
  x, y = rng.standard_normal((33, 65)).astype(np.float32), rng.standard_normal((65, 17)).astype(np.float32)
  got, srcs = run(driver, a @ b, {a: x, b: y}, arch="Apple6")
  assert not any("simdgroup" in s for s in srcs)
  np.testing.assert_allclose(got.reshape(33, 17), x @ y, rtol=1e-4, atol=1e-4)

def test_reduction_through_threadgroup_memory(driver):
  a = E(64, 1024)
  x = rng.standard_normal((64, 1024)).astype(np.float32)
  got, srcs = run(driver, a.sum(axis=1), {a: x})
  assert any("threadgroup_barrier" in s for s in srcs), "tinygrad chose no local-memory reduction: the test proves nothing"
  np.testing.assert_allclose(got, x.sum(axis=1), rtol=1e-4, atol=1e-3)

def test_simd_layout_covers_the_matrix(driver):
  """Apple's lane -> element layout: the 32 lanes x 2 elements cover the 8x8 matrix once (read from the header itself)."""
  lib, d = driver
  (d / "layout.cpp").write_text("#include <metal_stdlib>\nextern \"C\" void layout(unsigned *rc) {\n"
                                "  for (unsigned l = 0; l < 32; l++) metal_emu::simd_layout(l, &rc[2 * l], &rc[2 * l + 1]);\n}\n")
  subprocess.run([*COMPILE, str(d / "layout.cpp"), "-o", str(d / "layout.so")], check=True, timeout=120)
  rc = (ctypes.c_uint * 64)()
  ctypes.CDLL(str(d / "layout.so")).layout(rc)
  cells = sorted((rc[2 * l], rc[2 * l + 1] + j) for l in range(32) for j in range(2))
  assert cells == [(r, c) for r in range(8) for c in range(8)]
  # lanes 0..3 hold rows 0, 0, 1, 1 at columns 0, 2, 0, 2 (metal-flash-attention's morton_order)
  assert [(rc[2 * l], rc[2 * l + 1]) for l in range(4)] == [(0, 0), (0, 2), (1, 0), (1, 2)]

def bf16_bits(x): return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)   # truncated: exact bfloat16 values
def bf16_float(b): return (b.astype(np.uint32) << 16).view(np.float32)

@pytest.mark.parametrize("dt", ["float", "half", "bfloat16"])
def test_tensor_core_matmul(driver, dt):
  """tinygrad's tensor-core kernel on 32 emulated lanes: right only if the header's lane layout is the one tinygrad's swizzle assumes."""
  from tinygrad import dtypes
  t = getattr(dtypes, dt)
  a, b = E(16, 16, dt=t), E(16, 16, dt=t)
  x, y = rng.standard_normal((16, 16)), rng.standard_normal((16, 16))
  x, y = (bf16_bits(x), bf16_bits(y)) if dt == "bfloat16" else (x.astype(np_dtype(t)), y.astype(np_dtype(t)))
  got, srcs = run(driver, a @ b, {a: x, b: y})
  assert any("simdgroup_multiply_accumulate" in s for s in srcs), "no tensor-core kernel rendered: the test proves nothing"
  f = bf16_float if dt == "bfloat16" else lambda v: v.astype(np.float32)
  tol = {"float": 1e-5, "half": 2e-2, "bfloat16": 1e-1}[dt]
  np.testing.assert_allclose(f(got.reshape(16, 16)), f(x) @ f(y), rtol=tol, atol=tol)

HEADER_CHECKS = r"""
#include <metal_stdlib>
using namespace metal;
#define CHECK(c) do { if (!(c)) return __LINE__; } while (0)
extern "C" int check(void) {
  float2 p = float2(1.0f, 2.0f);
  float4 v = float4(p, float2(3, 4)), w = float4(0.5f), u = float4(int4(1, -2, 3, -4));
  CHECK(v.x == 1 && v.y == 2 && v.z == 3 && v.w == 4 && w.z == 0.5f && u.y == -2.0f && u.w == -4.0f);
  half4 h = half4(v);
  CHECK(h.w == (half)4 && sizeof(h) == 8);
  CHECK(as_type<uint>(1.0f) == 0x3f800000u && as_type<float>(0x40000000u) == 2.0f);
  CHECK(as_type<uint>(half2((half)1.0f, (half)-2.0f)) == 0xc0003c00u && as_type<ushort2>(1.0f).y == 0x3f80);
  CHECK(select(1.0f, 2.0f, true) == 2.0f && select(1.0f, 2.0f, false) == 1.0f);
  float4 s = select(float4(0.0f), v, bool4(true, false, true, false));
  CHECK(s.x == 1 && s.y == 0 && s.z == 3 && s.w == 0);
  CHECK(max(3, 5) == 5 && min(3u, 5u) == 3u && max(1.0f, NAN) == 1.0f && fmin(NAN, 2.0f) == 2.0f && abs(-3) == 3 && fabs(-2.5f) == 2.5f);
  CHECK(clamp(7.0f, 0.0f, 5.0f) == 5.0f && clamp(-1, 0, 5) == 0);
  CHECK(round(2.5f) == 3.0f && rint(2.5f) == 2.0f && trunc(-1.5f) == -1.0f && floor(-1.5f) == -2.0f && ceil(1.2f) == 2.0f);
  CHECK(isinf(INFINITY) && isinf(-INFINITY) && isnan(NAN) && !isnan(1.0f) && isinf((half)INFINITY));
  bool4 b = isnan(float4(NAN, 1.0f, NAN, 0.0f));
  CHECK(b.x && !b.y && b.z && !b.w && sizeof(bool4) == 4);
  CHECK(exp2(3.0f) == 8.0f && log2(8.0f) == 3.0f && sqrt(16.0f) == 4.0f && rsqrt(4.0f) == 0.5f && pow(2.0f, 10.0f) == 1024.0f);
  CHECK(precise::sin(0.0f) == 0.0f && cos(0.0f) == 1.0f && fma(2.0f, 3.0f, 1.0f) == 7.0f && mad(2.0f, 3.0f, 1.0f) == 7.0f);
  CHECK((float)exp2((half)3.0f) == 8.0f && (float)sqrt(bfloat(9.0f)) == 3.0f);
  bfloat x = bfloat(1.0f), y = as_type<bfloat>((ushort)0x3f81);
  CHECK((float)(x + y) == 2.0f && as_type<ushort>(bfloat(1.00390625f)) == 0x3f80 && as_type<ushort>(bfloat(1.01171875f)) == 0x3f82);
  CHECK((int)(y * bfloat(2.0f)) == 2 && (x < y) && -x == bfloat(-1.0f) && sizeof(bfloat2) == 4);
  bfloat2 bv = bfloat2(1.0f, 2.0f);
  CHECK(bv.y == bfloat(2.0f) && bv[0] == bfloat(1.0f));
  long4 l = long4(1l << 40);
  CHECK(l.w == 1l << 40 && sizeof(long) == 8 && (char)-1 < 0);
  return 0;
}
"""

def test_header_functions(tmp_path):
  """What the brief of <metal_stdlib> promises beyond what the corpus reaches: constructors, as_type, select, the math functions."""
  (tmp_path / "check.cpp").write_text(HEADER_CHECKS)
  r = subprocess.run([*COMPILE, str(tmp_path / "check.cpp"), "-o", str(tmp_path / "check.so")], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert (line:=ctypes.CDLL(str(tmp_path / "check.so")).check()) == 0, f"check failed at line {line} of HEADER_CHECKS"
