# Macs without unified memory (issue 26, item 5): on an Intel Mac's discrete GPU the runner's buffers are Managed, a CPU
# copy and a GPU copy, kept in step by the runner (didModifyRange: after every host write, a blit synchronizeResource:
# before every host read after GPU work), and Rhello has no CAP_UNIFIED. On Linux these run on the Metal emulator
# (tests/metal_emulator, a test harness) with METAL_EMU_UNIFIED=0, under which a Managed buffer's two copies are separate
# and only those two calls move bytes between them: a write, read, kernel, copy, graph, peer copy or cache load that
# misses one gives stale bytes here. Not seen on a real non-unified Mac: none was at hand.
import json, struct
import pytest
from conftest import metal_runner_proc, needs_own_metal_runner, run_python
from client import protocol as P
from wire import Raw

pytestmark = pytest.mark.metal

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"
IDS = "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]"
ADD1 = HEAD + f"kernel void add1(device float* out, device float* a, {IDS}) {{ out[gid.x] = a[gid.x] + 1.0f; }}\n"

def managed(*args:str, **env):
  """A runner of this test's own on the emulator, its GPU without unified memory."""
  needs_own_metal_runner()
  r = metal_runner_proc(*args, env={"METAL_EMU_UNIFIED": "0", **{k: str(v) for k, v in env.items()}})
  if "emulator" not in P.cstr(Raw(r.addr).info["name"]):
    r.stop()
    pytest.skip("uses the Metal emulator's METAL_EMU_UNIFIED (tests/metal_emulator/README.md)")
  return r

def add1(c:Raw, prog:int, out:int, a:int, n:int):
  tag = c.launch(prog, [(out, 0), (a, 0)], global_size=(n, 1, 1), wait=True)
  t, f, p = c.frame()
  assert t == P.RLAUNCH and f["tag"] == tag, (P.TYPE_NAMES.get(t), f, p)

def copy(c:Raw, dst:int, dstoff:int, src:int, srcoff:int, count:int):
  c.req(P.TCOPY, dst=dst, src=src, dstoff=dstoff, srcoff=srcoff, count=count)

def floats(c:Raw, h:int, n:int, off:int=0) -> list[float]: return list(struct.unpack(f"<{n}f", c.read(h, off, 4 * n)))

def test_buffers_are_managed_and_cap_unified_is_off():
  r = managed(METAL_EMU_TRACE=1)
  try:
    c = Raw(r.addr)
    assert not c.info["caps"] & P.CAP_UNIFIED, c.info["caps"]
    c.alloc(1, 64)
    assert c.until_pong() == []
    c.close()
    assert "newBufferWithLength: 64 bytes, storage managed (a CPU and a GPU copy)" in r.wait_log("newBufferWithLength: 64")
  finally:
    r.stop()

def test_writes_kernels_reads_and_copies_see_each_other():
  r = managed()
  try:
    c = Raw(r.addr)
    for h in (1, 2, 3, 4): c.alloc(h, 64)
    c.load(1, ADD1.encode(), "add1", nbufs=2, nvals=0, arch=0, kind=P.PROG_METAL_SOURCE)
    c.write(2, 0, struct.pack("<16f", *range(16)))                  # the kernel reads what the host wrote (didModifyRange)
    add1(c, 1, 1, 2, 16)
    assert floats(c, 1, 16) == [i + 1.0 for i in range(16)]          # the host reads what the kernel wrote (synchronizeResource)
    c.write(1, 8, struct.pack("<2f", 100.0, 200.0))                  # part of a buffer the GPU wrote: only that range changes
    add1(c, 1, 3, 1, 16)
    assert floats(c, 3, 16) == [1.0 + i + 1.0 for i in range(2)] + [101.0, 201.0] + [i + 2.0 for i in range(4, 16)]
    copy(c, 4, 0, 3, 0, 64)                                           # a blit: GPU copy to GPU copy
    assert floats(c, 4, 16) == floats(c, 3, 16)
    before = floats(c, 4, 16)
    copy(c, 4, 4, 4, 0, 32)                                           # overlapping: on the CPU, from the GPU's latest bytes
    add1(c, 1, 2, 4, 16)                                             # and the GPU sees what the CPU moved
    want = before[:1] + before[:8] + before[9:]
    assert floats(c, 4, 16) == want
    assert floats(c, 2, 16) == [x + 1.0 for x in want]
    c.close()
  finally:
    r.stop()

def test_a_part_written_after_the_gpu_keeps_the_gpus_bytes_around_it():
  # Metal may carry more of the CPU's copy to the GPU than the range marked (the emulator carries all of it): the runner brings the
  # GPU's writes into the CPU's copy before it writes a part of it, by Twrite, a copy on the CPU, a peer's or a link's data
  r = managed()
  try:
    c = Raw(r.addr)
    for h in (1, 2, 3): c.alloc(h, 64)
    c.load(1, ADD1.encode(), "add1", nbufs=2, nvals=0, arch=0, kind=P.PROG_METAL_SOURCE)
    c.write(2, 0, struct.pack("<16f", *range(16)))
    add1(c, 1, 1, 2, 16)                                              # the GPU writes all of 1, the host has not read it
    c.write(1, 8, struct.pack("<2f", 100.0, 200.0))
    assert floats(c, 1, 16) == [1.0, 2.0, 100.0, 200.0] + [i + 1.0 for i in range(4, 16)]
    add1(c, 1, 3, 2, 16)                                              # the GPU writes all of 3; a copy on the CPU into part of it
    copy(c, 3, 2, 2, 2, 4)                                            # not a multiple of 4: a memmove on the CPU
    assert floats(c, 3, 16) == [0.0, 2.0] + [i + 1.0 for i in range(2, 16)]
    c.close()
  finally:
    r.stop()

def kernel_wrote(c:Raw):
  """Buffer 1 (16 floats, i + 1.0) written by a kernel, all of it, and not read by the host since: its CPU copy is stale."""
  for h in (1, 2): c.alloc(h, 64)
  c.load(1, ADD1.encode(), "add1", nbufs=2, nvals=0, arch=0, kind=P.PROG_METAL_SOURCE)
  c.write(2, 0, struct.pack("<16f", *range(16)))
  add1(c, 1, 1, 2, 16)

def reply(c:Raw, tag:int, want:int) -> dict:
  t, f, p = c.frame()
  assert (t, f["tag"]) == (want, tag), (P.TYPE_NAMES.get(t, t), f, p[:300])
  return f

# a peer's or a link's data into part of such a buffer: the runner reads the GPU's bytes into the CPU's copy first (9a1c9af), or
# the emulator's didModifyRange:, which carries all of the CPU's copy as Metal may, puts the stale bytes around the part on the GPU
PART = [1.0, 2.0, 100.0, 200.0] + [i + 1.0 for i in range(4, 16)]

def test_a_peer_copy_into_part_of_a_buffer_the_gpu_wrote_keeps_the_gpus_bytes_around_it():
  r = managed()
  try:
    src, dst = Raw(r.addr), Raw(r.addr)   # two sessions of one runner: a peer copy between them goes over a peer connection
    kernel_wrote(dst)
    g = reply(dst, dst.req(P.TGRANT, handle=1, offset=8, count=8, ttl=60), P.RGRANT)
    src.alloc(9, 8); src.write(9, 0, struct.pack("<2f", 100.0, 200.0))
    host, port = r.addr.rsplit(":", 1)
    reply(src, src.req(P.TPEERSEND, host.encode(), handle=9, offset=0, count=8, grant=g["grant"], secret=g["secret"], port=int(port),
                       hostlen=len(host)), P.RPEERSEND)
    assert floats(dst, 1, 16) == PART
    add1(dst, 1, 2, 1, 16)                                             # and a kernel sees the same
    assert floats(dst, 2, 16) == [x + 1.0 for x in PART]
    src.close(); dst.close()
  finally:
    r.stop()

def test_a_link_receive_into_part_of_a_buffer_the_gpu_wrote_keeps_the_gpus_bytes_around_it():
  r = managed()
  try:
    snd, rcv = Raw(r.addr), Raw(r.addr)   # two sessions of one runner, a link from one to the other
    kernel_wrote(rcv)
    g = reply(rcv, rcv.req(P.TLISTEN, link=7, ttl=60), P.RLISTEN)
    host, port = r.addr.rsplit(":", 1)
    reply(snd, snd.req(P.TDIAL, host.encode(), link=7, port=int(port), hostlen=len(host), grant=g["grant"], secret=g["secret"]), P.RDIAL)
    snd.load(5, b"", "send", nbufs=1, nvals=2, arch=P.ARCH_NONE, entry=7, kind=P.PROG_LINK_SEND)
    rcv.load(5, b"", "recv", nbufs=1, nvals=2, arch=P.ARCH_NONE, entry=7, kind=P.PROG_LINK_RECV)
    snd.alloc(9, 8); snd.write(9, 0, struct.pack("<2f", 100.0, 200.0))
    reply(snd, snd.launch(5, [(9, 0)], [8, 1], wait=True), P.RLAUNCH)   # 8 bytes on channel 1
    reply(rcv, rcv.launch(5, [(1, 8)], [8, 1], wait=True), P.RLAUNCH)   # into floats 2 and 3 of buffer 1
    assert floats(rcv, 1, 16) == PART
    add1(rcv, 1, 2, 1, 16)
    assert floats(rcv, 2, 16) == [x + 1.0 for x in PART]
    snd.close(); rcv.close()
  finally:
    r.stop()

# tinygrad end to end: TinyJit's graph (Tgraph), uploads and reads
JIT = """
import json, numpy as np, client.remote_metal
from tinygrad import Tensor, TinyJit
rng = np.random.default_rng(1)
w = rng.standard_normal((64, 64)).astype(np.float32)
W = Tensor(w, device="METAL").realize()
@TinyJit
def step(x): return (x @ W).relu().sum(axis=1)
outs, want = [], []
for i in range(5):
  x = rng.standard_normal((8, 64)).astype(np.float32)
  outs.append(step(Tensor(x, device="METAL")).numpy().tolist())
  want.append(np.maximum(x @ w, 0).sum(axis=1).tolist())
print(json.dumps({"ok": bool(np.allclose(outs, want, rtol=1e-4, atol=1e-4)), "outs": outs[-1], "want": want[-1]}))
"""

def test_tinygrad_graphs_uploads_and_reads():
  r = managed("-v")
  try:
    p = run_python(JIT, {"METAL_RUNNER": r.addr})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["ok"], out
  finally:
    r.stop()

# a peer copy between two such runners: the sender's bytes were written by a kernel (synchronized before they leave), the
# receiver's land in the CPU copy and a kernel there reads them (didModifyRange), then the host reads its result
PEER = """
import json, numpy as np, client.remote_metal
from tinygrad import Tensor
x = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float32)   # 4 MiB: a peer copy (METAL_RUNNER_PEER_MIN is 1 MiB)
t = (Tensor(x, device="METAL:0") * 2).realize()
u = (t.to("METAL:1") + 1).realize()
print(json.dumps({"equal": bool((u.numpy() == x * 2 + 1).all())}))
"""

def test_peer_copies():
  ra, rb = managed("-v"), managed("-v")
  try:
    p = run_python(PEER, {"METAL_RUNNER": f"{ra.addr},{rb.addr}"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.splitlines()[-1])["equal"]
    assert "received 4194304 bytes from a peer" in rb.log_text(), rb.log_text()
  finally:
    ra.stop(); rb.stop()

# cache loads (Twritehash): a second session's weights come from the runner's cache into the CPU copy, which the kernels read
MODEL = """
import json, numpy as np, client.remote_metal
from tinygrad import Tensor, Device
rng = np.random.default_rng(0)
w1, w2 = rng.normal(size=(1024, 512)).astype(np.float32), rng.normal(size=(512, 10)).astype(np.float32)   # 2 MiB + 20 KiB
x = rng.normal(size=(4, 1024)).astype(np.float32)
out = (Tensor(x, device="METAL") @ Tensor(w1, device="METAL")).relu() @ Tensor(w2, device="METAL")
ok = bool(np.allclose(out.numpy(), np.maximum(x @ w1, 0) @ w2, rtol=1e-3, atol=1e-3))
print(json.dumps({"ok": ok, **Device["METAL"].runner.stats()}))
"""

def test_cache_loads(tmp_path):
  r = managed("-v", "--cache-dir", str(tmp_path / "cache"))
  try:
    runs = []
    for _ in range(2):
      p = run_python(MODEL, {"METAL_RUNNER": r.addr})
      assert p.returncode == 0, p.stderr[-3000:]
      runs.append(json.loads(p.stdout.splitlines()[-1]))
    assert runs[0]["ok"] and runs[1]["ok"], runs
    assert runs[1]["bytes_sent"] < runs[0]["bytes_sent"] - (2 << 20) + (64 << 10), runs   # the second one's w1 came from the cache
  finally:
    r.stop()

# links (a graph's copies runner to runner, tests/test_multigraph.py): a link sends what a kernel wrote and a kernel reads
# what a link received
@pytest.mark.parametrize("mode", ["tp", "split"])
def test_graphs_over_two_runners_with_links(mode):
  from test_multigraph import check_one_graph_per_runner, measure
  r0, r1 = managed(), managed()
  try: check_one_graph_per_runner(measure("METAL", mode, [r0.addr, r1.addr], steps=8), 8)
  finally: r0.stop(), r1.stop()
