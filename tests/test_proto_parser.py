"""The C frame parser (daemon/proto.c) driven directly with malformed input.

Every check asserts the return value and that the error text names the problem and its numbers.
"""
import shutil, subprocess
import pytest
from cproto import P, DAEMON, build, check_hdr, check_size, get, cmsg

def frame(t, tag=1, flags=0, payload=b"", **fields):
  """A frame built by the Python codec; size= overrides the header size, payload is appended as is."""
  return P.pack(t, tag, flags, len(payload), **fields) + payload

def err_buf():
  ffi, lib = build()
  return ffi.new("char[]", lib.PROTO_ERRLEN)

def cs(t, **fields):
  """proto_check_size on a union built field by field, so no earlier check can stand in for it."""
  ffi, lib = build()
  err = err_buf()
  return lib.proto_check_size(cmsg(t, fields), err), ffi.string(err).decode()

# proto_check_hdr

def test_hdr_ok():
  assert check_hdr(frame(P.TSYNC)) == (0, "")
  assert check_hdr(frame(P.TWRITE, size=P.MIN_MAXMSG), maxmsg=P.MIN_MAXMSG) == (0, "")

@pytest.mark.parametrize("size", [0, 5, 11])
def test_hdr_size_smaller_than_header(size):
  rc, err = check_hdr(frame(P.TSYNC, size=size))
  assert rc == -1 and err == f"frame size {size} is smaller than the 12-byte header"

def test_hdr_size_over_maxmsg():
  rc, err = check_hdr(frame(P.TWRITE, size=65537), maxmsg=65536)
  assert rc == -1 and err == "Twrite frame size 65537 exceeds maxmsg 65536"
  rc, err = check_hdr(frame(P.TPING, size=0xffffffff))
  assert rc == -1 and "4294967295" in err and str(P.DEFAULT_MAXMSG) in err

@pytest.mark.parametrize("t", [0, 11, 13, 31, 58, 1000, 0xffff])
def test_hdr_unknown_type(t):
  f = bytearray(frame(P.TSYNC))
  f[4:6] = t.to_bytes(2, "little")
  rc, err = check_hdr(bytes(f))
  assert rc == -1 and err == f"unknown message type {t}"

@pytest.mark.parametrize("t", sorted(t for t in P.MSGS if t % 2 == 1))
def test_hdr_reply_type_from_client(t):
  rc, err = check_hdr(frame(t, size=max(P.MSGS[t].size, 100)))
  assert rc == -1 and P.TYPE_NAMES[t] in err and f"type {t}" in err and "reply" in err

@pytest.mark.parametrize("t", sorted(t for t in P.MSGS if P.is_request(t) and P.MSGS[t].size > 12))
def test_hdr_smaller_than_fixed_part(t):
  fixed = P.MSGS[t].size
  rc, err = check_hdr(frame(t, size=fixed - 1))
  assert rc == -1 and err == f"{P.TYPE_NAMES[t]} frame size {fixed - 1} is smaller than its {fixed}-byte fixed part"
  assert check_hdr(frame(t, size=fixed))[0] == 0

def test_hdr_checks_in_order():
  # an R-type that is also over maxmsg is reported as a reply; a short header before anything else
  assert "reply" in check_hdr(frame(P.RREAD, size=1 << 30), maxmsg=65536)[1]
  f = bytearray(frame(P.TSYNC, size=3))
  f[4:6] = (999).to_bytes(2, "little")
  assert "12-byte header" in check_hdr(bytes(f))[1]

# proto_get

def test_get_short_buffers():
  ffi, lib = build()
  m, err = ffi.new("union proto_msg *"), err_buf()
  assert lib.proto_get(b"\0" * 11, 11, m, err) == -1 and "11 bytes" in ffi.string(err).decode()
  tl = frame(P.TLOAD)
  assert lib.proto_get(tl, 43, m, err) == -1 and ffi.string(err).decode() == "Tload needs its 44-byte fixed part, only 43 bytes given"
  rc, m2, e = get(frame(P.TALLOC, handle=1)[:12] + b"\0" * 12)
  assert rc == 0 and m2.talloc.handle == 0
  bad = bytearray(frame(P.TSYNC))
  bad[4] = 77
  assert get(bytes(bad))[0] == -1 and "unknown message type 77" in get(bytes(bad))[2]

def test_get_ignores_pad_and_zeroes_struct():
  ffi, lib = build()
  f = bytearray(frame(P.TCOPY, dst=1, src=2, dstoff=3, srcoff=4, count=5))
  f[20:24] = b"\xff" * 4
  m = ffi.new("union proto_msg *")
  ffi.memmove(m, b"\xee" * ffi.sizeof(m[0]), ffi.sizeof(m[0]))
  assert lib.proto_get(bytes(f), len(f), m, err_buf()) == 0
  assert (m.tcopy.dst, m.tcopy.src, m.tcopy.pad, m.tcopy.dstoff, m.tcopy.srcoff, m.tcopy.count) == (1, 2, 0, 3, 4, 5)

# proto_check_size: counts that disagree with the frame size

@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_size_twrite(delta):
  rc, err = check_size(frame(P.TWRITE, handle=1, count=100 + delta, payload=b"x" * 100))
  assert rc == -1 and err == f"Twrite frame size 132 is not its 32-byte fixed part + count {100 + delta}"

def test_size_twrite_counts_that_wrap():
  # 32 + count computed in 32 bits would be 40 for these
  for count in (2**32 + 8, 2**64 - 24, 2**64 - 1):
    rc, err = check_size(frame(P.TWRITE, count=count, payload=b"x" * 8))
    assert rc == -1 and f"count {count}" in err and "size 40" in err
  assert cs(P.TWRITE, size=31, count=2**64 - 1)[0] == -1
  assert cs(P.TWRITE, size=40, count=8) == (0, "")

@pytest.mark.parametrize("count", [0, 4, 6, 0xffffffff])
def test_size_tping(count):
  rc, err = check_size(frame(P.TPING, count=count, payload=b"hello"))
  assert rc == -1 and err == f"Tping frame size 21 is not its 16-byte fixed part + count {count}"

def test_size_tping_wrap():
  # 16 + 0xffffffff is 15 in 32 bits; check_size must not trust that check_hdr ran first
  rc, err = cs(P.TPING, size=15, count=0xffffffff)
  assert rc == -1 and "count 4294967295" in err
  assert cs(P.TPING, size=16, count=0) == (0, "")

@pytest.mark.parametrize("namelen,datalen", [(3, 5), (5, 4), (100, 0), (0, 0), (0xffffffff, 17), (17, 0xffffffff), (0x80000000, 0x80000010)])
def test_size_tload(namelen, datalen):
  # the last three sum to 60 - 44 = 16 modulo 2**32
  rc, err = check_size(frame(P.TLOAD, namelen=namelen, datalen=datalen, payload=b"k" * 16))
  assert rc == -1 and err == f"Tload frame size 60 is not its 44-byte fixed part + namelen {namelen} + datalen {datalen}"
  assert check_size(frame(P.TLOAD, namelen=6, datalen=10, payload=b"k" * 16)) == (0, "")

def test_size_tlaunch():
  args = P.launch_args([(1, 0), (2, 0)], [5])
  assert check_size(frame(P.TLAUNCH, nbufs=2, nvals=1, payload=args)) == (0, "")
  for nb, nv in [(3, 1), (2, 0), (1, 2), (0, 4), (2, 2), (0, 0)]:  # (1, 3) and (0, 5) would also be 40 bytes
    rc, err = check_size(frame(P.TLAUNCH, nbufs=nb, nvals=nv, payload=args))
    assert rc == -1 and err == f"Tlaunch frame size 88 is not its 48-byte fixed part + 16 * nbufs {nb} + 8 * nvals {nv}"

@pytest.mark.parametrize("nb,nv", [(64, 0), (0, 64), (32, 32), (63, 1), (0xffff, 0xffff)])
def test_size_tlaunch_too_many_args(nb, nv):
  # the frame size agrees with the counts: only the argument limit is wrong
  rc, err = check_size(frame(P.TLAUNCH, nbufs=nb, nvals=nv, payload=b"\0" * (16 * nb + 8 * nv)))
  assert rc == -1 and err == f"Tlaunch has {nb} buffers + {nv} values, more than the 63 arguments a kernel may take"

def test_size_tlaunch_at_limit():
  assert check_size(frame(P.TLAUNCH, nbufs=63, nvals=0, payload=b"\0" * 16 * 63)) == (0, "")
  assert check_size(frame(P.TLAUNCH, nbufs=0, nvals=63, payload=b"\0" * 8 * 63)) == (0, "")

@pytest.mark.parametrize("count", [0, 1, 3, 2**29 + 2, 0xffffffff])
def test_size_tgraphrun(count):
  # 24 * (2**29 + 2) is 48 modulo 2**32
  rc, err = check_size(frame(P.TGRAPHRUN, count=count, payload=P.patch(0, 1, 0) * 2))
  assert rc == -1 and err == f"Tgraphrun frame size 72 is not its 24-byte fixed part + 24 * count {count}"
  assert check_size(frame(P.TGRAPHRUN, count=2, payload=P.patch(0, 1, 0) * 2)) == (0, "")

def test_size_tgraph_only_fixed_part():
  assert check_size(frame(P.TGRAPH, count=5)) == (0, "")
  assert check_size(frame(P.TGRAPH, count=1, payload=b"\0" * 7)) == (0, "")
  rc, err = cs(P.TGRAPH, size=23, count=1)
  assert rc == -1 and err == "Tgraph frame size 23 is smaller than its 24-byte fixed part"

@pytest.mark.parametrize("t", [P.THELLO, P.TAUTH, P.TSYNC, P.TALLOC, P.TFREE, P.TREAD, P.TCOPY, P.TUNLOAD, P.TGRAPHFREE, P.TCLOCK, P.TPROFILE,
                               P.TWRITEHASH])
def test_size_fixed_messages_exact(t):
  fixed = P.MSGS[t].size
  assert check_size(frame(t)) == (0, "")
  rc, err = check_size(frame(t, payload=b"\0"))
  assert rc == -1 and err == f"{P.TYPE_NAMES[t]} frame size {fixed + 1} is not its fixed size {fixed}"

def test_size_thave_and_rhave_counts():
  h = lambda t, n, extra: P.pack(t, 1, 0, n * (32 if t == P.THAVE else 1) + extra, count=n) + bytes(n * (32 if t == P.THAVE else 1) + extra)
  assert check_size(h(P.THAVE, 3, 0)) == (0, "") and check_size(h(P.RHAVE, 3, 0)) == (0, "")
  rc, err = check_size(h(P.THAVE, 3, -1))
  assert rc == -1 and err == "Thave frame size 111 is not its 16-byte fixed part + 32 * count 3"
  rc, err = check_size(P.pack(P.THAVE, 1, 0, 0, count=0x08000000))   # 32 * count wraps 32 bits: computed in 64
  assert rc == -1 and "count 134217728" in err
  assert check_size(h(P.RHAVE, 3, 1))[0] == -1

def test_size_unknown_type():
  ffi, lib = build()
  m, e = ffi.new("union proto_msg *"), err_buf()
  m.h.type, m.h.size = 99, 12
  assert lib.proto_check_size(m, e) == -1 and ffi.string(e).decode() == "unknown message type 99"

# proto_get_launch

def launch(frame_bytes, off=0):
  ffi, lib = build()
  l, args, vals = ffi.new("struct proto_launch *"), ffi.new("struct proto_arg[]", 63), ffi.new("int64_t[]", 63)
  offp, err = ffi.new("size_t *", off), err_buf()
  rc = lib.proto_get_launch(frame_bytes, len(frame_bytes), offp, l, args, vals, err)
  return rc, offp[0], l, ffi.string(err).decode()

def test_launch_ok_and_advances():
  rec = P.launch_record(7, [(1, 2), (3, 4)], [-9], (8, 1, 1))
  rc, off, l, err = launch(b"\xaa" * 5 + rec + rec, 5)
  assert (rc, off, l.prog, l.nbufs, l.nvals, getattr(l, "global")[0], l.local[2]) == (0, 5 + len(rec), 7, 2, 1, 8, 1)

def test_launch_record_past_end():
  rec = P.launch_record(7, [(1, 2), (3, 4)], [-9])
  for cut in (1, 8, 16, len(rec) - 32):
    rc, off, l, err = launch(rec[:-cut])
    assert rc == -1 and off == 0 and f"needs {len(rec)} bytes; only {len(rec) - cut} remain" in err
  rc, off, l, err = launch(rec[:31])
  assert rc == -1 and err == "launch record at offset 0 runs past the end of the 31-byte frame"
  rc, off, l, err = launch(rec, len(rec))
  assert rc == -1 and f"offset {len(rec)} runs past the end" in err

def test_launch_offset_beyond_len_no_wrap():
  rec = P.launch_record(1, [], [])
  for off in (len(rec) + 1, 2**63, 2**64 - 1, 2**64 - 16):
    rc, o, l, err = launch(rec, off)
    assert rc == -1 and o == off and f"offset {off} runs past the end of the 32-byte frame" in err

@pytest.mark.parametrize("nb,nv", [(64, 0), (40, 40), (0, 64), (0xffff, 0xffff)])
def test_launch_too_many_args(nb, nv):
  rec = P.LAUNCH.pack(prog=1, nbufs=nb, nvals=nv) + b"\0" * (16 * nb + 8 * nv)
  rc, off, l, err = launch(rec)
  assert rc == -1 and off == 0 and f"{nb} buffers + {nv} values, more than the 63 arguments" in err

def test_launch_63_args_fit():
  rec = P.launch_record(1, [(i, i) for i in range(31)], list(range(-16, 16)))
  rc, off, l, err = launch(rec)
  assert (rc, off, l.nbufs, l.nvals) == (0, len(rec), 31, 32)

def test_tgraph_second_record_truncated():
  recs = P.launch_record(1, [(1, 0)], []) + P.launch_record(2, [(1, 0), (2, 0)], [3])
  f = frame(P.TGRAPH, count=2, payload=recs[:-8])
  rc, off, l, err = launch(f, 24)
  assert rc == 0 and off == 24 + 48
  rc, off2, l, err = launch(f, off)
  assert rc == -1 and off2 == off and "offset 72" in err and "needs 72 bytes; only 64 remain" in err

# proto_get_patch

def test_patch_bounds():
  ffi, lib = build()
  body, p, err = P.patch(1, P.PATCH_VAL, 2, 0, 3) * 2 + b"\1" * 23, ffi.new("struct proto_patch *"), err_buf()
  assert lib.proto_get_patch(body, len(body), 1, p, err) == 0 and (p.entry, p.kind, p.index, p.value) == (1, 2, 2, 3)
  for i in (2, 3, 2**32):
    assert lib.proto_get_patch(body, len(body), i, p, err) == -1
    assert ffi.string(err).decode() == f"patch {i} is past the end of the 71-byte patch list (2 patches)"
  # 24 * i wraps to 8 in 64 bits: a multiply-then-compare bound check would accept it
  i = -(-2**64 // 24)
  assert (24 * i) % 2**64 == 8
  assert lib.proto_get_patch(body, len(body), i, p, err) == -1 and f"patch {i} is past the end" in ffi.string(err).decode()
  assert lib.proto_get_patch(b"", 0, 0, p, err) == -1 and "0-byte patch list (0 patches)" in ffi.string(err).decode()

# proto_put, proto_put_rerror

def test_put_short_cap_writes_nothing():
  ffi, lib = build()
  for t in P.MSGS:
    m, fixed = cmsg(t, {"size": 999}), P.MSGS[t].size
    buf = ffi.new("uint8_t[]", [0xaa] * (fixed + 4))
    assert lib.proto_put(buf, fixed - 1, m) == 0
    assert bytes(ffi.buffer(buf)) == b"\xaa" * (fixed + 4)
    assert lib.proto_put(buf, fixed, m) == fixed and bytes(ffi.buffer(buf))[fixed:] == b"\xaa" * 4
  assert lib.proto_put(buf, 0, m) == 0

def test_put_unknown_type():
  ffi, lib = build()
  m, buf = ffi.new("union proto_msg *"), ffi.new("uint8_t[]", 512)
  for t in (0, 11, 31, 0xffff):
    m.h.type = t
    assert lib.proto_put(buf, 512, m) == 0

def rerror(cap, text, tag=5, code=P.EPROGRAM):
  ffi, lib = build()
  buf = ffi.new("uint8_t[]", [0xaa] * (cap + 8))
  n = lib.proto_put_rerror(buf, cap, tag, code, text)
  return n, bytes(ffi.buffer(buf))

def test_rerror_truncates_text():
  text = bytes(ord("a") + i % 26 for i in range(2000))
  n, b = rerror(4096, text)
  assert n == 20 + 1024
  t, f = P.unpack(b)
  assert (t, f["size"], f["count"], f["code"], f["tag"]) == (P.RERROR, 1044, 1024, P.EPROGRAM, 5)
  assert b[20:n] == text[:1024] and b[n] == 0xaa

def test_rerror_exact_and_short_cap():
  text = b"x" * 1024
  assert rerror(1044, text)[0] == 1044
  n, b = rerror(1043, text)
  assert n == 0 and b == b"\xaa" * (1043 + 8)
  n, b = rerror(25, b"hello")
  assert n == 25 and b[:25] == frame(P.RERROR, 5, code=P.EPROGRAM, count=5, payload=b"hello")
  assert rerror(24, b"hello")[0] == 0
  n, b = rerror(20, b"")
  assert n == 20 and P.unpack(b)[1]["count"] == 0

# proto.c builds warning-free with both compilers

@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_compiles_clean(cc, tmp_path):
  if shutil.which(cc) is None: pytest.skip(f"{cc} not installed")
  r = subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-O2", "-c", str(DAEMON / "proto.c"),
                      "-o", str(tmp_path / "proto.o")], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
