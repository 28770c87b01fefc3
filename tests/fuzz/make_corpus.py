#!/usr/bin/env python3
"""Write the fuzzers' seed corpus: valid sessions and frames built with client/protocol.py.

  corpus/session/NAME  for fuzz_session: one options byte (fuzz_session.c OPT_*), then what a client sends
  corpus/proto/NAME    for fuzz_proto: one frame each

The files are small and deterministic (same bytes on every run), so they are committed; rerun this after a protocol change.
A program image is a few arbitrary bytes: the fuzzer's backend validates programs but never runs them.
"""
from __future__ import annotations
import pathlib, sys, zlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
from client import protocol as P  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent / "corpus"
OPT_TOKEN, OPT_SESSION_MEM, OPT_FEW_HANDLES, OPT_SMALL_MSG, OPT_PROCESS = 1, 2, 4, 8, 16
FAIL_LAUNCH, FAIL_SYNC = 7777, 7778  # backend_null.h: global[2] values that inject device failures
IMAGE = bytes.fromhex("f30f1efa31c0c3")  # endbr64; xor eax, eax; ret

class Session:
  """Builds the byte stream of one client session, tags counting up from 1."""
  def __init__(self, hello:bool=True, maxmsg:int=P.DEFAULT_MAXMSG):
    self.b, self.tag = bytearray(), 0
    if hello: self.req(P.THELLO, magic=P.MAGIC, version=P.VERSION, maxmsg=maxmsg)
  def req(self, type:int, payload:bytes=b"", flags:int=0, **fields) -> "Session":
    self.tag += 1
    self.b += P.pack(type, self.tag, flags, payload_len=len(payload), **fields) + payload
    return self
  def ping(self, data:bytes=b""): return self.req(P.TPING, data, count=len(data))
  def sync(self): return self.req(P.TSYNC)
  def alloc(self, h:int, size:int): return self.req(P.TALLOC, handle=h, bufsize=size)
  def free(self, h:int): return self.req(P.TFREE, handle=h)
  def write(self, h:int, off:int, data:bytes): return self.req(P.TWRITE, data, handle=h, offset=off, count=len(data))
  def read(self, h:int, off:int, n:int): return self.req(P.TREAD, handle=h, offset=off, count=n)
  def copy(self, dst:int, src:int, dstoff:int, srcoff:int, n:int):
    return self.req(P.TCOPY, dst=dst, src=src, dstoff=dstoff, srcoff=srcoff, count=n)
  def load(self, prog:int, nbufs:int=2, nvals:int=1, name:bytes=b"add1", image:bytes=IMAGE, corearg:int=P.NO_CORE,
           kind:int=P.PROG_CPU_IMAGE, arch:int=P.ARCH_X86_64, entry:int=0, crc:int|None=None):
    return self.req(P.TLOAD, name + image, prog=prog, kind=kind, arch=arch, nbufs=nbufs, nvals=nvals, corearg=corearg, entry=entry,
                    crc=zlib.crc32(image) if crc is None else crc, namelen=len(name), datalen=len(image))
  def unload(self, prog:int): return self.req(P.TUNLOAD, prog=prog)
  def launch(self, prog:int, bufs, vals, g=(4, 1, 1), l=(1, 1, 1), wait:bool=False):
    return self.req(P.TLAUNCH, P.launch_args(bufs, vals), P.FWAIT if wait else 0, **P.launch_fields(prog, bufs, vals, g, l))
  def graph(self, gid:int, records:list[bytes]):
    return self.req(P.TGRAPH, b"".join(records), graph=gid, count=len(records))
  def graphrun(self, gid:int, patches:list[bytes], wait:bool=False):
    return self.req(P.TGRAPHRUN, b"".join(patches), P.FWAIT if wait else 0, graph=gid, count=len(patches))
  def graphfree(self, gid:int): return self.req(P.TGRAPHFREE, graph=gid)
  def auth(self, cnonce:bytes=bytes(32), mac:bytes=bytes(32)): return self.req(P.TAUTH, cnonce=cnonce, mac=mac)
  def clock(self): return self.req(P.TCLOCK)
  def profile(self, mode:int=P.PROFILE_ON, count:int=0xffffffff): return self.req(P.TPROFILE, mode=mode, count=count)
  def bytes(self, opt:int=0) -> bytes: return bytes([opt]) + bytes(self.b)

def many_errors(s:Session, n:int=70) -> Session:
  """More failed requests than the 64 errors the runner queues: the rest become one EMORE."""
  for _ in range(n): s.free(1)
  return s

def sessions() -> dict[str, bytes]:
  S, rec, patch = Session, P.launch_record, P.patch
  return {
    "ping": S().ping(b"hello").ping().bytes(),
    "alloc_write_read": S().alloc(1, 64).write(1, 8, bytes(range(32))).read(1, 0, 64).free(1).sync().bytes(),
    "copy_overlap": S().alloc(1, 64).alloc(2, 64).write(1, 0, bytes(range(64))).copy(2, 1, 16, 8, 32).copy(1, 1, 9, 8, 31)
                    .read(2, 0, 64).read(1, 0, 64).bytes(),
    "big_read": S().alloc(1, 8192).write(1, 4000, b"x" * 200).read(1, 0, 8192).bytes(),
    "load_launch": S().alloc(1, 16).alloc(2, 16).load(7).launch(7, [(1, 0), (2, 0)], [4]).launch(7, [(1, 4), (2, 8)], [2], wait=True)
                   .read(1, 0, 16).unload(7).sync().bytes(),
    "process_isolation": S().alloc(1, 16).load(1).free(5).launch(1, [(1, 0), (1, 0)], [1], wait=True)
                         .graph(2, [rec(1, [(1, 0), (1, 0)], [1])]).free(5).graphrun(2, [], wait=True).bytes(OPT_PROCESS),
    # a frame larger than the 64 KiB input buffer, after the hello: the buffer is compacted, then grown
    "large_frame": S().ping(b"x" * 66000).ping().bytes(),
    "core_arg": S().alloc(1, 64).load(3, nbufs=1, nvals=1, name=b"cores", corearg=1).launch(3, [(1, 0)], [0], g=(2, 1, 1), wait=True)
                .bytes(),
    "graph": S().alloc(1, 16).alloc(2, 16).alloc(3, 16).load(1).load(2, nbufs=1, nvals=0, name=b"zero")
             .graph(5, [rec(1, [(1, 0), (2, 0)], [4], (4, 1, 1)), rec(2, [(3, 0)], [])])
             .graphrun(5, [patch(0, P.PATCH_BUF, 1, 3, 4), patch(0, P.PATCH_VAL, 0, 0, 2), patch(1, P.PATCH_GLOBAL, 0, 0, 2),
                           patch(1, P.PATCH_LOCAL, 2, 0, 1)], wait=True)
             .free(3).graphrun(5, [], wait=True).graphfree(5).sync().bytes(),
    "errors_in_order": S().free(9).write(9, 0, b"abc").alloc(1, 8).alloc(1, 8).write(1, 4, b"too long").read(1, 9, 1)
                       .copy(1, 1, 0, 4, 8).unload(4).graphfree(4).launch(4, [], []).alloc(2, 0).ping().bytes(),
    "many_errors": many_errors(S()).ping().bytes(),
    "profile": S().clock().profile(count=0).alloc(1, 16).alloc(2, 16).load(1).write(1, 0, bytes(16)).copy(2, 1, 0, 0, 8)
               .launch(1, [(1, 0), (2, 0)], [4]).launch(1, [(1, 0), (9, 0)], [4]).launch(1, [(1, 0), (1, 0)], [1], g=(1, 1, FAIL_LAUNCH))
               .graph(3, [rec(1, [(1, 0), (2, 0)], [4])] * 3).graphrun(3, [], wait=True).read(2, 0, 16).profile(count=2).profile(mode=5)
               .launch(1, [(1, 0), (1, 0)], [1], g=(1, 1, FAIL_SYNC)).profile().clock().profile(P.PROFILE_OFF).copy(2, 1, 0, 0, 8)
               .profile().bytes(),
    "load_errors": S().load(1, image=b"").load(1, kind=P.PROG_METALLIB).load(2, arch=P.ARCH_ARM64).load(3, crc=0).load(4, entry=100)
                   .load(5, nbufs=40, nvals=30).load(6, corearg=9).load(7, name=b"").load(1).load(1).ping().bytes(),
    "launch_errors": S().alloc(1, 16).load(1).launch(1, [(1, 0)], []).launch(1, [(1, 0), (1, 0)], [1], g=(0, 1, 1))
                     .launch(1, [(1, 0), (9, 0)], [1]).launch(1, [(1, 17), (1, 0)], [1]).launch(2, [], [], wait=True)
                     .launch(1, [(1, 0), (1, 0)], [1], g=(1, 1, FAIL_LAUNCH), wait=True)
                     .launch(1, [(1, 0), (1, 0)], [1], g=(1, 1, FAIL_SYNC)).sync().bytes(),
    "graph_errors": S().alloc(1, 16).load(1).graph(1, []).graph(2, [rec(9, [], [])]).graph(3, [rec(1, [(1, 0)], [])])
                    .graph(4, [rec(1, [(1, 0), (1, 0)], [1])]).graph(4, [rec(1, [(1, 0), (1, 0)], [1])])
                    .graphrun(4, [patch(1, P.PATCH_VAL, 0)], wait=True).graphrun(4, [patch(0, 9, 0)])
                    .graphrun(4, [patch(0, P.PATCH_GLOBAL, 0, 0, 0)]).graphrun(4, [patch(0, P.PATCH_BUF, 5, 1, 0)])
                    .graphrun(4, [patch(0, P.PATCH_BUF, 0, 8, 0)], wait=True).graphrun(8, [], wait=True).ping().bytes(),
    "token_wrong_mac": S().auth().ping().bytes(OPT_TOKEN),
    "token_skipped": S().alloc(1, 8).bytes(OPT_TOKEN),
    "session_mem": S().alloc(1, 1 << 19).alloc(2, 1 << 19).alloc(3, 1).free(1).alloc(3, 1).alloc(4, 1 << 30).ping().bytes(OPT_SESSION_MEM),
    "few_handles": S().alloc(1, 8).alloc(2, 8).load(3).load(4).load(5).load(6).alloc(7, 8).alloc(8, 8).alloc(9, 8).ping()
                   .bytes(OPT_FEW_HANDLES),
    "small_msg": S(maxmsg=P.MIN_MAXMSG).alloc(1, 1 << 17).read(1, 0, 1 << 17).read(1, 0, P.MIN_MAXMSG - 16).bytes(OPT_SMALL_MSG),
    "device_failure": S().alloc(1, 8).load(1, nbufs=1, nvals=0).launch(1, [(1, 0)], [], g=(1, 1, FAIL_SYNC)).read(1, 0, 8)
                      .launch(1, [(1, 0)], [], g=(1, 1, FAIL_SYNC)).write(1, 0, b"x").sync().bytes(),
    # copies between runners: grants and their errors, Tpeersends refused before any connection (the fuzz build never dials), a Tpeer
    "peer": S().alloc(1, 64).req(P.TGRANT, handle=1, offset=8, count=16, ttl=60).req(P.TGRANT, handle=2, count=1, ttl=1)
            .req(P.TGRANT, handle=1, offset=60, count=5, ttl=1).req(P.TGRANT, handle=1, count=1, ttl=0)
            .req(P.TPEERSEND, b"", handle=1, count=8, port=1).req(P.TPEERSEND, b"a\0", handle=1, count=8, port=1, hostlen=2)
            .req(P.TPEERSEND, b"127.0.0.1", handle=9, count=8, port=1, hostlen=9)
            .req(P.TPEERSEND, b"127.0.0.1", handle=1, count=8, port=1, hostlen=9, grant=1 << 32 | 1)
            .req(P.TPEER, magic=P.MAGIC, grant=1 << 32 | 1, count=16).bytes(),
    # links between runners: a listening link and its programs, launches and a graph with link entries (nobody connects: EPEER), bad
    # shapes and handles, Tdials refused before any connection, a Tpeer for the link grant, Tunlink
    "links": S().alloc(1, 64).req(P.TLISTEN, link=3, ttl=60).req(P.TLISTEN, link=3, ttl=60).req(P.TLISTEN, link=4, ttl=0)
             .load(5, nbufs=1, nvals=2, name=b"recv", image=b"", kind=P.PROG_LINK_RECV, arch=0, entry=3)
             .load(6, nbufs=1, nvals=2, name=b"send", image=b"", kind=P.PROG_LINK_SEND, arch=0, entry=3)
             .load(7, nbufs=2, nvals=2, name=b"bad", image=b"", kind=P.PROG_LINK_SEND, arch=0, entry=3)
             .launch(5, [(1, 0)], [16, 1], g=(1, 1, 1), wait=True).launch(6, [(1, 0)], [16, 1], g=(1, 1, 1)).launch(5, [(1, 60)], [16, 1], g=(1, 1, 1))
             .graph(8, [rec(5, [(1, 0)], [8, 2]), rec(6, [(1, 8)], [8, 3])]).graphrun(8, [patch(0, P.PATCH_VAL, 0, 0, 4)], wait=True)
             .req(P.TDIAL, b"", link=9, port=1).req(P.TDIAL, b"a\0", link=9, port=1, hostlen=2)
             .req(P.TDIAL, b"127.0.0.1", link=9, port=1, hostlen=9, grant=1 << 32 | 1)
             .req(P.TPEER, magic=P.MAGIC, grant=1 << 32 | 1, count=0).req(P.TUNLINK, link=3).req(P.TUNLINK, link=3)
             .launch(5, [(1, 0)], [16, 1], g=(1, 1, 1)).ping().bytes(),
    "peer_first": S(hello=False).req(P.TPEER, magic=P.MAGIC, grant=1 << 32 | 1, count=16).bytes(),
    "no_hello": S(hello=False).ping().bytes(),
    "bad_magic": S(hello=False).req(P.THELLO, magic=0x12345678, version=1, maxmsg=P.DEFAULT_MAXMSG).bytes(),
    "bad_version": S(hello=False).req(P.THELLO, magic=P.MAGIC, version=2, maxmsg=P.DEFAULT_MAXMSG).bytes(),
    "small_client_maxmsg": S(hello=False).req(P.THELLO, magic=P.MAGIC, version=1, maxmsg=100).bytes(),
    "hello_twice": S().req(P.THELLO, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG).bytes(),
    "reply_type_sent": S().req(P.RPING, count=0).bytes(),
    "bad_size": S().ping().bytes() + P.pack(P.TALLOC, 50, size=25, handle=1, bufsize=8) + bytes(1),
    "cache": S().alloc(1, 64).req(P.TWRITE, bytes(range(64)), P.FCACHE, handle=1, offset=0, count=64)
             .req(P.THAVE, bytes(32) + bytes(range(32)), count=2).req(P.THAVE, count=0)
             .req(P.TWRITEHASH, handle=1, offset=0, count=64, hash=bytes(32)).req(P.TWRITEHASH, handle=1, offset=63, count=2, hash=bytes(32))
             .req(P.TWRITEHASH, handle=9, offset=0, count=1, hash=bytes(32)).ping().bytes(),
    # the harness gives its session no control socket, so no CAP_RESUME: Tresumekey and Tresume end the connection (EPROTO)
    "resume_key": S().alloc(1, 8).req(P.TRESUMEKEY, mode=P.RESUME_ON).ping().bytes(),
    "resume": S().req(P.TRESUME, session=1, sent=0, received=0, cnonce=bytes(32), mac=bytes(32)).bytes(),
    "ack": S().alloc(1, 8).req(P.TACK, received=0).ping().bytes(),
    "truncated_write": S().alloc(1, 64).bytes() + P.pack(P.TWRITE, 60, payload_len=64, handle=1, offset=0, count=64) + bytes(10),
  }

def frames() -> dict[str, bytes]:
  rec, patch = P.launch_record, P.patch
  out = {f"fixed_{P.TYPE_NAMES[t]}": P.pack(t, 1, **({"count": 0} if t in (P.RERROR, P.RREAD) else {}))
         for t in P.MSGS if t not in (P.TGRAPH, P.TGRAPHRUN, P.TLAUNCH)}
  out.update({
    "hello": P.pack(P.THELLO, 1, magic=P.MAGIC, version=1, maxmsg=P.DEFAULT_MAXMSG),
    "ping_data": P.pack(P.TPING, 2, payload_len=5, count=5) + b"hello",
    "write_data": P.pack(P.TWRITE, 3, payload_len=8, handle=1, offset=4, count=8) + bytes(range(8)),
    "load": P.pack(P.TLOAD, 4, payload_len=4 + len(IMAGE), prog=1, kind=1, arch=1, nbufs=2, nvals=1, corearg=P.NO_CORE,
                   crc=zlib.crc32(IMAGE), namelen=4, datalen=len(IMAGE)) + b"add1" + IMAGE,
    "launch": P.pack(P.TLAUNCH, 5, P.FWAIT, payload_len=40, **P.launch_fields(1, [(1, 0), (2, 8)], [-1])) + P.launch_args([(1, 0), (2, 8)], [-1]),
    "graph": (lambda r: P.pack(P.TGRAPH, 6, payload_len=len(r), graph=1, count=2) + r)(rec(1, [(1, 0)], [3]) + rec(2, [], [1, 2], (8, 2, 1))),
    "graphrun": P.pack(P.TGRAPHRUN, 7, payload_len=48, graph=1, count=2) + patch(0, P.PATCH_BUF, 0, 1, 8) + patch(1, P.PATCH_VAL, 1, 0, -5),
    "rerror": P.pack(P.RERROR, 8, payload_len=11, code=P.EINVAL, count=11) + b"bad request",
    "launch_too_many_args": P.pack(P.TLAUNCH, 9, payload_len=16 * 40 + 8 * 30, **P.launch_fields(1, [(0, 0)] * 40, [0] * 30)),
    "have": P.pack(P.THAVE, 11, payload_len=64, count=2) + bytes(range(64)),
    "have_bad_count": P.pack(P.THAVE, 12, payload_len=31, count=1) + bytes(31),
    "writehash": P.pack(P.TWRITEHASH, 13, handle=1, offset=8, count=64, hash=bytes(range(32))),
    "size_wraps": P.pack(P.TWRITE, 10, size=0xffffffff, handle=1, offset=0, count=0xffffffffffffffe0),
    "dial": P.pack(P.TDIAL, 14, payload_len=9, link=1, port=6667, hostlen=9, grant=1 << 32 | 1, secret=bytes(range(32))) + b"127.0.0.1",
    "dial_bad_hostlen": P.pack(P.TDIAL, 15, payload_len=3, link=1, port=6667, hostlen=9) + b"abc",
  })
  return out

def main():
  for sub, items in (("session", sessions()), ("proto", frames())):
    d = OUT / sub
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir(): old.unlink()
    for name, data in sorted(items.items()): (d / name).write_bytes(data)
    print(f"{d.relative_to(ROOT)}: {len(items)} files, {sum(map(len, items.values()))} bytes")

if __name__ == "__main__": main()
