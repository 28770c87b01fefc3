"""The C structs (protocol.h), the C codec (proto.c) and the Python codec (client/protocol.py) agree on the wire layout.

Sizes and offsets come from cffi (the C compiler's view of protocol.h); shared vectors are encoded by both codecs and
must be byte-identical, and each side must decode the other's bytes to the same values.
"""
import random, re, zlib
import pytest
from cproto import P, DAEMON, MEMBER, build, cfields, cmsg, cdecode, getp, get, check_hdr, check_size

HDR_TEXT = (DAEMON / "protocol.h").read_text()
STRUCTS = re.findall(r"^struct (proto_\w+) \{", HDR_TEXT, re.M)
ENUMS = re.findall(r"^enum (proto_\w+) \{", HDR_TEXT, re.M)
DEFINES = re.findall(r"^#define (PROTO_\w+)\s+(?:0x[0-9a-fA-F]+|\d+)", HDR_TEXT, re.M)

def py_layouts() -> dict:
  out = {"proto_hdr": [P.HDR], "proto_launch": [P.LAUNCH], "proto_arg": [P.ARG], "proto_patch": [P.PATCH], "proto_prof": [P.PROF],
         "proto_linkhdr": [P.LINKHDR]}
  for t, member in MEMBER.items(): out.setdefault(f"proto_{member}", []).append(P.MSGS[t])
  return out

def test_every_struct_has_a_python_layout():
  assert len(STRUCTS) == 44 and set(STRUCTS) == set(py_layouts())

@pytest.mark.parametrize("struct", STRUCTS)
def test_struct_layout(struct):
  ffi, _ = build()
  c = {name: (off, width) for name, off, width, _ in cfields(ffi, f"struct {struct}")}
  for m in py_layouts()[struct]:
    assert ffi.sizeof(f"struct {struct}") == m.size, m.name
    assert c == {f: (m.offsets[f], m.widths[f]) for f in m.fields}, m.name

def test_fixed_sizes_and_request_types():
  _, lib = build()
  for t in range(0, 70):
    assert lib.proto_fixed_size(t) == (P.MSGS[t].size if t in P.MSGS else 0), t
    assert lib.proto_is_request(t) == P.is_request(t), t
  assert lib.proto_fixed_size(0xffffffff) == 0 and lib.proto_fixed_size(65536 + P.TLOAD) == 0
  assert sorted(t for t in P.MSGS if P.is_request(t)) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56]

def test_constants():
  ffi, lib = build()
  assert len(DEFINES) == 22 and len(ENUMS) == 11
  names = {n: getattr(lib, n) for n in DEFINES}
  for e in ENUMS: names.update(ffi.typeof(f"enum {e}").relements)
  assert len(names) == 22 + 46 + 2 + 21 + 2 + 11 + 5 + 4 + 4 + 2 + 2 + 5
  for n, v in names.items(): assert getattr(P, n.removeprefix("PROTO_")) == v, n
  assert P.MAGIC.to_bytes(4, "little") == b"MTLR"

def test_names():
  ffi, lib = build()
  errs = {v: n.removeprefix("PROTO_") for n, v in ffi.typeof("enum proto_error").relements.items()}
  assert P.ERRORS == errs
  for code in range(0, 50): assert ffi.string(lib.proto_error_name(code)).decode() == errs.get(code, "unknown")
  for t in range(0, 60):
    want = P.TYPE_NAMES.get(t, "unknown")
    assert ffi.string(lib.proto_type_name(t)).decode() == want
    if t in P.MSGS: assert f"PROTO_{want.upper()}" in ffi.typeof("enum proto_type").relements

R = random.Random(1234)
def rb(n): return bytes(R.getrandbits(8) for _ in range(n))
BUFS, VALS = [(0xfffffff1, 0x0102030405060708), (7, 0)], [-1, 0x7fffffffffffffff, -0x8000000000000000]
REC1 = dict(prog=0x8badf00d, bufs=[(3, 5)], vals=[-42], global_size=(65535, 3, 0xffffffff), local_size=(32, 1, 7))
REC2 = dict(prog=2, bufs=BUFS * 3, vals=[], global_size=(1, 2, 3), local_size=(4, 5, 6))
NAME, CODE = b"E_4_4n1", rb(301)

# (type, flags, tag, fields, payload): every message type, odd values, full-width strings, payloads
VECTORS = [
  (P.RERROR, 0, 0xdeadbeef, dict(code=P.EHANDLE, count=24), b"no such buffer handle 99"),
  (P.THELLO, 0, 1, dict(magic=P.MAGIC, version=P.VERSION, maxmsg=0x04000001), b""),
  (P.RHELLO, 0x8000, 1, dict(magic=P.MAGIC, version=1, maxmsg=65536, backend=P.BACKEND_METAL, caps=0xffff, ncores=0x01020304,
                             memory=0xfedcba9876543210, maxbuf=1 << 63, maxhandles=4096, session=0xcafe, nonce=rb(32),
                             name=b"N" * 64, arch=b"x86_64".ljust(16, b"\0"), cpu=b"znver4".ljust(32, b"\0"), features=rb(128)), b""),
  (P.TAUTH, 0, 2, dict(cnonce=rb(32), mac=rb(32)), b""),
  (P.RAUTH, 0, 2, dict(mac=rb(32)), b""),
  (P.TPING, 0, 3, dict(count=5), b"hello"),
  (P.RPING, 0, 3, dict(count=5), b"hello"),
  (P.TPING, 0, 3, dict(count=0), b""),
  (P.TSYNC, 0xffff, 0xffffffff, {}, b""),
  (P.RSYNC, 0, 0xffffffff, {}, b""),
  (P.TALLOC, 0, 4, dict(handle=0xfffffffe, bufsize=0x0123456789abcdef), b""),
  (P.TFREE, 0, 5, dict(handle=0x80000001), b""),
  (P.TWRITE, 0, 6, dict(handle=9, offset=(1 << 63) + 5, count=7), b"\0\1\2\3\4\5\xff"),
  (P.TREAD, 0, 7, dict(handle=9, offset=0x1122334455667788, count=0x8877665544332211), b""),
  (P.RREAD, 0, 7, dict(count=3), b"abc"),
  (P.TCOPY, 0, 8, dict(dst=1, src=2, dstoff=0xa1a2a3a4a5a6a7a8, srcoff=3, count=0xffffffffffffffff), b""),
  (P.TLOAD, 0, 9, dict(prog=77, kind=P.PROG_CPU_IMAGE, arch=P.ARCH_ARM64, nbufs=3, nvals=60, corearg=62, entry=0x10203,
                       crc=zlib.crc32(CODE), namelen=len(NAME), datalen=len(CODE)), NAME + CODE),
  (P.TUNLOAD, 0, 10, dict(prog=0xffffffff), b""),
  (P.TLAUNCH, P.FWAIT, 11, dict(prog=0x31337, nbufs=2, nvals=3, global0=1, global1=0xffffffff, global2=65536, local0=1024,
                                local1=0x80000000, local2=3), P.launch_args(BUFS, VALS)),
  (P.TLAUNCH, 0, 12, dict(prog=1, nbufs=0, nvals=0, global0=1, global1=1, global2=1, local0=1, local1=1, local2=1), b""),
  (P.RLAUNCH, 0, 11, dict(ns=0xffffffffffffffff), b""),
  (P.TGRAPH, 0, 13, dict(graph=0xabcdef01, count=2), P.launch_record(**REC1) + P.launch_record(**REC2)),
  (P.TGRAPHRUN, P.FWAIT, 14, dict(graph=0xabcdef01, count=3),
   P.patch(0, P.PATCH_BUF, 1, 0xfffffff0, 1 << 40) + P.patch(1, P.PATCH_VAL, 0, 0, -5) + P.patch(0xffffffff, P.PATCH_LOCAL, 2, 0, 9)),
  (P.RGRAPHRUN, 0, 14, dict(ns=123456789012), b""),
  (P.TGRAPHFREE, 0, 15, dict(graph=0xabcdef01), b""),
  (P.TCLOCK, 0, 16, {}, b""),
  (P.RCLOCK, 0, 16, dict(clock=0xfedcba9876543210), b""),
  (P.TPROFILE, 0, 17, dict(mode=P.PROFILE_ON, count=0xffffffff), b""),
  (P.RPROFILE, 0, 17, dict(count=2, left=0x01020304, lost=0xfffffffe, cap=P.PROFILE_RECORDS),
   P.PROF.pack(kind=P.PROF_GRAPH, entry=0xfffe, tag=0xdeadbeef, handle=7, aux=0x80000001, start=1 << 63, end=(1 << 64) - 1, count=0)
   + P.PROF.pack(kind=P.PROF_COPY, entry=0, tag=1, handle=2, aux=3, start=4, end=5, count=0x0102030405060708)),
  (P.THAVE, 0, 18, dict(count=2), rb(64)),
  (P.THAVE, 0, 18, dict(count=0), b""),
  (P.RHAVE, 0, 18, dict(count=3), b"\1\0\1"),
  (P.TWRITEHASH, 0, 19, dict(handle=0xfffffff3, offset=(1 << 63) + 9, count=0x0102030405060708, hash=rb(32)), b""),
  (P.TRESUMEKEY, 0, 18, dict(mode=P.RESUME_ON), b""),
  (P.RRESUMEKEY, 0, 18, dict(grace=0x80000001, log=0x0102030405060708, secret=rb(32)), b""),
  (P.TRESUME, 0, 0, dict(session=0xfffffffe, sent=(1 << 64) - 1, received=0x1122334455667788, cnonce=rb(32), mac=rb(32)), b""),
  (P.RRESUME, 0, 0, dict(processed=0xa1a2a3a4a5a6a7a8, mac=rb(32)), b""),
  (P.TACK, 0, 0xfffffff0, dict(received=0xf1f2f3f4f5f6f7f8), b""),
  (P.TGRANT, 0, 18, dict(handle=0xfffffff3, ttl=P.MAX_GRANT_TTL, offset=(1 << 63) + 1, count=0x0102030405060708), b""),
  (P.RGRANT, 0, 18, dict(grant=0xfedcba9800000001, secret=rb(32)), b""),
  (P.TPEERSEND, 0, 19, dict(handle=5, port=65535, hostlen=11, offset=0x1122334455667788, count=1 << 40, grant=0x0000000200000003,
                            secret=rb(32)), b"192.168.1.2"),
  (P.RPEERSEND, 0, 19, dict(ns=0xffffffff00000001), b""),
  (P.TPEER, 0, 20, dict(magic=P.MAGIC, grant=(1 << 64) - 1, count=0x8000000000000000, cnonce=rb(32), mac=rb(32)), b""),
  (P.RPEER, 0, 20, dict(count=0xa1a2a3a4a5a6a7a8, mac=rb(32)), b""),
  (P.TLISTEN, 0, 21, dict(link=0xfffffff5, ttl=P.MAX_GRANT_TTL), b""),
  (P.RLISTEN, 0, 21, dict(grant=0x0000000700000009, secret=rb(32)), b""),
  (P.TDIAL, 0, 22, dict(link=0x80000003, port=6667, hostlen=9, grant=0xfedcba9800000002, secret=rb(32)), b"127.0.0.1"),
  (P.RDIAL, 0, 22, dict(ns=0x0102030405060708), b""),
  (P.TUNLINK, 0, 23, dict(link=0xffffffff), b""),
]

def test_link_header():
  """A link message's header (not a frame): proto.c and client/protocol.py write the same 32 bytes and read back the same fields."""
  ffi, lib = build()
  buf = ffi.new("uint8_t[]", P.LINK_HDR_SIZE)
  lib.proto_put_linkhdr(buf, 0x0102030405060708, 0xfffffffffffffffe, 1 << 40)
  want = P.LINKHDR.pack(magic=P.LINK_MAGIC, seq=0x0102030405060708, channel=0xfffffffffffffffe, count=1 << 40)
  assert bytes(ffi.buffer(buf)) == want and want[:4] == b"MLNK"
  h = ffi.new("struct proto_linkhdr *")
  lib.proto_get_linkhdr(want, h)
  assert (h.magic, h.seq, h.channel, h.count) == (P.LINK_MAGIC, 0x0102030405060708, 0xfffffffffffffffe, 1 << 40)

def test_vectors_cover_every_type():
  assert {v[0] for v in VECTORS} == set(P.MSGS)

def expected(t, flags, tag, fields, payload) -> dict:
  m = P.MSGS[t]
  return {**{f: (b"\0" * m.widths[f] if f in m.bytes_fields else 0) for f in m.fields}, **fields,
          "size": m.size + len(payload), "type": t, "flags": flags, "tag": tag}

@pytest.mark.parametrize("vec", VECTORS, ids=lambda v: f"{P.TYPE_NAMES[v[0]]}-{v[2]}")
def test_vector_c_and_python_agree(vec):
  ffi, lib = build()
  t, flags, tag, fields, payload = vec
  want = expected(*vec)
  py = P.pack(t, tag, flags, len(payload), **fields) + payload
  buf = ffi.new("uint8_t[]", 4096)
  n = lib.proto_put(buf, 4096, cmsg(t, {**fields, "size": want["size"], "flags": flags, "tag": tag}))
  assert n == P.MSGS[t].size
  c = bytes(ffi.buffer(buf, n)) + payload
  assert c == py
  assert len(py) == want["size"] and P.payload_len(t, want) in (len(payload), None)
  # each side decodes the other's bytes
  rc, m, err = get(py)
  assert rc == 0, err
  assert cdecode(m, t) == want
  assert P.unpack(c) == (t, want)
  # a well-formed frame passes the parser's checks (R-types only the size check)
  if P.is_request(t): assert check_hdr(py) == (0, "")
  else: assert check_hdr(py)[0] == -1
  assert check_size(py) == (0, "")

def c_launches(frame:bytes, off:int, count:int):
  """Decode count launch records with proto_get_launch; returns ([(fields, bufs, vals)], final offset)."""
  ffi, lib = build()
  l, args, vals = ffi.new("struct proto_launch *"), ffi.new("struct proto_arg[]", 63), ffi.new("int64_t[]", 63)
  offp, err, out = ffi.new("size_t *", off), ffi.new("char[]", lib.PROTO_ERRLEN), []
  for _ in range(count):
    assert lib.proto_get_launch(frame, len(frame), offp, l, args, vals, err) == 0, ffi.string(err)
    f = {name: getp(l, path) for name, _, _, path in cfields(ffi, "struct proto_launch")}
    out.append((f, [(args[i].handle, args[i].offset) for i in range(l.nbufs)], [vals[i] for i in range(l.nvals)]))
  return out, offp[0]

def test_launch_records_in_tlaunch_and_tgraph():
  tl = next(v for v in VECTORS if v[0] == P.TLAUNCH)
  frame = P.pack(P.TLAUNCH, tl[2], tl[1], len(tl[4]), **tl[3]) + tl[4]
  (rec,), end = c_launches(frame, 16, 1)  # the launch record of a Tlaunch starts after hdr and pad
  assert end == len(frame) and rec[1] == BUFS and rec[2] == VALS and rec[0]["global1"] == 0xffffffff
  tg = next(v for v in VECTORS if v[0] == P.TGRAPH)
  frame = P.pack(P.TGRAPH, tg[2], 0, len(tg[4]), **tg[3]) + tg[4]
  recs, end = c_launches(frame, P.MSGS[P.TGRAPH].size, 2)
  assert end == len(frame)
  off = P.MSGS[P.TGRAPH].size
  for (cf, cb, cv), rec in zip(recs, (REC1, REC2)):
    f, b, v, off = P.unpack_launch(frame, off)
    assert (cf, cb, cv) == (f, b, v) and b == rec["bufs"] and v == rec["vals"] and f["prog"] == rec["prog"]
  assert off == len(frame)

@pytest.mark.parametrize("rec", [REC1, REC2, dict(prog=0, bufs=[], vals=[]), dict(prog=5, bufs=[(i, i << 33) for i in range(40)],
                                 vals=[-(i << 50) for i in range(23)], global_size=(9,), local_size=(2, 2))])
def test_put_launch_matches_python(rec):
  ffi, lib = build()
  g, lc = P.dims(rec.get("global_size", (1, 1, 1))), P.dims(rec.get("local_size", (1, 1, 1)))
  l = ffi.new("struct proto_launch *", dict(prog=rec["prog"], nbufs=len(rec["bufs"]), nvals=len(rec["vals"]), **{"global": g, "local": lc}))
  args = ffi.new("struct proto_arg[]", [dict(handle=h, pad=0xdddddddd, offset=o) for h, o in rec["bufs"]] or 1)
  vals = ffi.new("int64_t[]", rec["vals"] or 1)
  want = P.launch_record(**rec)
  assert lib.proto_launch_size(len(rec["bufs"]), len(rec["vals"])) == len(want)
  buf = ffi.new("uint8_t[]", len(want) + 8)
  assert lib.proto_put_launch(buf, len(want) + 8, l, args, vals) == len(want)
  assert bytes(ffi.buffer(buf, len(want))) == want  # the pad field is sent as zero whatever the struct held
  assert lib.proto_put_launch(buf, len(want) - 1, l, args, vals) == 0

def test_patches():
  ffi, lib = build()
  tg = next(v for v in VECTORS if v[0] == P.TGRAPHRUN)
  body, p, err = tg[4], ffi.new("struct proto_patch *"), ffi.new("char[]", lib.PROTO_ERRLEN)
  got = []
  for i in range(3):
    assert lib.proto_get_patch(body, len(body), i, p, err) == 0
    got.append(dict(entry=p.entry, kind=p.kind, index=p.index, handle=p.handle, pad=p.pad, value=p.value))
  assert got == [P.PATCH.unpack(body, 24 * i) for i in range(3)]
  assert got[0] == dict(entry=0, kind=P.PATCH_BUF, index=1, handle=0xfffffff0, pad=0, value=1 << 40)
  assert got[1]["value"] == 2**64 - 5 and got[2]["entry"] == 0xffffffff and got[2]["kind"] == P.PATCH_LOCAL

@pytest.mark.parametrize("rec", [dict(kind=P.PROF_LAUNCH, entry=0, tag=0xffffffff, handle=0x8badf00d, aux=0, start=1, end=2, count=0),
                                 dict(kind=P.PROF_GRAPH, entry=0xffff, tag=3, handle=4, aux=0xfffffff0, start=1 << 63, end=(1 << 64) - 1,
                                      count=0x1122334455667788)])
def test_put_prof_matches_python(rec):
  ffi, lib = build()
  buf = ffi.new("uint8_t[]", 48)
  assert lib.proto_put_prof(buf, 48, ffi.new("struct proto_prof *", rec)) == P.PROF.size == 40
  assert bytes(ffi.buffer(buf, 40)) == P.PROF.pack(**rec)
  assert lib.proto_put_prof(buf, 39, ffi.new("struct proto_prof *", rec)) == 0

def test_rprofile_size_counts_its_records():
  frame = P.pack(P.RPROFILE, 1, 0, 40, count=2) + bytes(40)
  assert check_size(frame)[0] == -1 and "40 * count 2" in check_size(frame)[1]
  assert check_size(P.pack(P.RPROFILE, 1, 0, 80, count=2) + bytes(80)) == (0, "")

def test_rerror_matches_python():
  ffi, lib = build()
  buf = ffi.new("uint8_t[]", 2048)
  n = lib.proto_put_rerror(buf, 2048, 0x01020304, P.ERANGE, b"offset 9 is past the end of buffer 3 (8 bytes)")
  text = b"offset 9 is past the end of buffer 3 (8 bytes)"
  assert bytes(ffi.buffer(buf, n)) == P.pack(P.RERROR, 0x01020304, 0, len(text), code=P.ERANGE, count=len(text)) + text

@pytest.mark.parametrize("data", [b"", b"a", b"123456789", bytes(range(256)) * 3, random.Random(5).randbytes(1 << 20)], ids=len)
def test_crc32(data):
  _, lib = build()
  assert lib.proto_crc32(0, data, len(data)) == zlib.crc32(data) == P.crc32(data)
  cut = len(data) // 3
  assert lib.proto_crc32(lib.proto_crc32(0, data[:cut], cut), data[cut:], len(data) - cut) == zlib.crc32(data)
  assert lib.proto_crc32(0xffffffff, data, len(data)) == zlib.crc32(data, 0xffffffff)

def test_crc32_known_value():
  _, lib = build()
  assert lib.proto_crc32(0, b"123456789", 9) == 0xcbf43926
