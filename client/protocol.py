"""The metal_runner wire protocol, version 1, in Python: constants and frame layouts.

This is daemon/protocol.h for Python and the only place the client spells out a wire layout; protocol.md is the spec.
Every frame is packed and unpacked with struct (little-endian, no implicit padding), never pickle or eval.
tests/test_protocol_layout.py checks every size, offset and constant here against the C structs and proto.c.
"""
from __future__ import annotations
import hashlib, hmac, re, struct, zlib

MAGIC = 0x524c544d  # the bytes "MTLR"
VERSION = 1
HDR_SIZE = 12
MIN_MAXMSG = 65536
DEFAULT_MAXMSG = 67108864
MAX_ARGS = 63
MAX_NAME = 255
MAX_ERRTEXT = 1024
NONCE_SIZE = 32
MAC_SIZE = 32
NO_CORE = 65535
PROFILE_RECORDS = 65536  # records a session's profile holds
HASH_SIZE = 32  # a SHA-256, the cache's content name
CACHE_PINS = 4096  # cached contents a session keeps (Thave)
SECRET_SIZE, MAX_GRANTS, MAX_GRANT_TTL, MAX_PEER_HOST = 32, 64, 600, 255  # copies between runners
LINK_MAGIC, LINK_HDR_SIZE = 0x4b4e4c4d, 32  # links between runners: a link message's header ("MLNK")
RREAD_INLINE, RESUME_REFS = 4096, 8  # CAP_ACK: Rread data of more bytes the runner keeps by reference, for up to this many Rreads

# message types: a T-message is a request, its R-message (T+1) the reply
RERROR = 1
THELLO, RHELLO, TAUTH, RAUTH, TPING, RPING, TSYNC, RSYNC = 2, 3, 4, 5, 6, 7, 8, 9
TALLOC, TFREE, TWRITE, TREAD, RREAD, TCOPY, TLOAD, TUNLOAD = 10, 12, 14, 16, 17, 18, 20, 22
TLAUNCH, RLAUNCH, TGRAPH, TGRAPHRUN, RGRAPHRUN, TGRAPHFREE = 24, 25, 26, 28, 29, 30
TCLOCK, RCLOCK, TPROFILE, RPROFILE = 32, 33, 34, 35
THAVE, RHAVE, TWRITEHASH = 36, 37, 38  # CAP_CACHE
TRESUMEKEY, RRESUMEKEY, TRESUME, RRESUME = 46, 47, 48, 49  # CAP_RESUME
TACK = 50  # CAP_ACK
TGRANT, RGRANT, TPEERSEND, RPEERSEND, TPEER, RPEER = 40, 41, 42, 43, 44, 45  # copies between runners; Tpeer/Rpeer: peer connections only
TLISTEN, RLISTEN, TDIAL, RDIAL, TUNLINK = 52, 53, 54, 55, 56  # CAP_LINK: links between runners

FWAIT = 1  # hdr.flags on Tlaunch/Tgraphrun: wait and reply with the device time
FCACHE = 2  # hdr.flags on Twrite (CAP_CACHE): the runner also keeps the data in its cache

EPROTO, EVERSION, EAUTH, ESTATE, EHANDLE, EEXIST, ERANGE, EINVAL = 1, 2, 3, 4, 5, 6, 7, 8
ENOMEM, ELIMIT, EKIND, EPROGRAM, EDEVICE, EMORE, ECRASH, ETIMEOUT = 9, 10, 11, 12, 13, 14, 15, 16
ENOTCACHED, ECACHE = 17, 18
ERESUME = 21
EGRANT, EPEER = 19, 20
ERRORS = {EPROTO: "EPROTO", EVERSION: "EVERSION", EAUTH: "EAUTH", ESTATE: "ESTATE", EHANDLE: "EHANDLE", EEXIST: "EEXIST",
          ERANGE: "ERANGE", EINVAL: "EINVAL", ENOMEM: "ENOMEM", ELIMIT: "ELIMIT", EKIND: "EKIND", EPROGRAM: "EPROGRAM",
          EDEVICE: "EDEVICE", EMORE: "EMORE", ECRASH: "ECRASH", ETIMEOUT: "ETIMEOUT", ENOTCACHED: "ENOTCACHED", ECACHE: "ECACHE", ERESUME: "ERESUME", EGRANT: "EGRANT", EPEER: "EPEER"}
# after an Rerror with one of these codes the runner closes the connection
FATAL_ERRORS = {EPROTO, EVERSION, EAUTH, ESTATE, ECRASH, ETIMEOUT, ERESUME}

BACKEND_CPU, BACKEND_METAL = 1, 2
BACKENDS = {BACKEND_CPU: "cpu", BACKEND_METAL: "metal"}
CAP_AUTH, CAP_UNIFIED, CAP_CPU_IMAGE, CAP_METALLIB, CAP_METAL_SOURCE, CAP_PROFILE = 1, 2, 4, 8, 16, 32
CAP_CACHE = 64
CAP_RESUME = 256
CAP_ACK = 512
CAP_PEER = 128
CAP_LINK = 1024
PROG_CPU_IMAGE, PROG_METALLIB, PROG_METAL_SOURCE = 1, 2, 3
PROG_LINK_SEND, PROG_LINK_RECV = 4, 5  # CAP_LINK: link programs (one buffer; values count and channel)
PROG_CAPS = {PROG_CPU_IMAGE: CAP_CPU_IMAGE, PROG_METALLIB: CAP_METALLIB, PROG_METAL_SOURCE: CAP_METAL_SOURCE, PROG_LINK_SEND: CAP_LINK,
             PROG_LINK_RECV: CAP_LINK}
ARCH_NONE, ARCH_X86_64, ARCH_ARM64, ARCH_RISCV64 = 0, 1, 2, 3
ARCHS = {ARCH_X86_64: "x86_64", ARCH_ARM64: "arm64", ARCH_RISCV64: "riscv64"}
PATCH_BUF, PATCH_VAL, PATCH_GLOBAL, PATCH_LOCAL = 1, 2, 3, 4
PROFILE_OFF, PROFILE_ON = 0, 1  # Tprofile.mode
RESUME_OFF, RESUME_ON = 0, 1  # Tresumekey.mode
PROF_LAUNCH, PROF_GRAPH, PROF_WRITE, PROF_READ, PROF_COPY = 1, 2, 3, 4, 5  # profile record kinds

crc32 = zlib.crc32

class Msg:
  """One fixed layout: struct format ('<', pads as fields named pad) and field names; .size, .offsets, .widths."""
  def __init__(self, name:str, fmt:str, fields:tuple[str, ...]):
    self.name, self.fmt, self.fields, self.st = name, fmt, fields, struct.Struct(fmt)
    self.size, self.offsets, self.widths, self.bytes_fields, off = self.st.size, {}, {}, set(), 0
    codes = [(int(n) if n else 1, c) for n, c in re.findall(r"(\d*)([a-zA-Z])", fmt)]
    for n, c in codes:
      for _ in range(1 if c == "s" else n):
        w = n if c == "s" else struct.calcsize("<" + c)
        name_ = fields[len(self.offsets)]
        self.offsets[name_], self.widths[name_], off = off, w, off + w
        if c == "s": self.bytes_fields.add(name_)
    assert len(self.offsets) == len(fields) and off == self.size, f"{name}: {fmt} does not match {fields}"
  def pack(self, **kw) -> bytes:
    if (bad := kw.keys() - set(self.fields)): raise TypeError(f"{self.name} has no field {', '.join(sorted(bad))}")
    return self.st.pack(*(kw.get(f, b"" if f in self.bytes_fields else 0) for f in self.fields))
  def unpack(self, buf, off:int=0) -> dict:
    return dict(zip(self.fields, self.st.unpack_from(buf, off)))
  def __repr__(self): return f"Msg({self.name!r}, {self.fmt!r}, {self.fields!r})"

H, HF = "<IHHI ", ("size", "type", "flags", "tag")  # every frame starts with size[4] type[2] flags[2] tag[4]
HDR = Msg("hdr", H, HF)
_PING, _SYNC, _TIME, _GRAPH = ("I", ("count",)), ("", ()), ("IQ", ("pad", "ns")), ("III", ("graph", "count", "pad"))
_IO = ("IQQ", ("handle", "offset", "count"))
_LAUNCH = ("IHH3I3I", ("prog", "nbufs", "nvals", "global0", "global1", "global2", "local0", "local1", "local2"))
# Talloc's size[8] is called bufsize here: the header already has a field named size
MSGS = {t: Msg(name, H + fmt, HF + fields) for t, name, (fmt, fields) in [
  (RERROR, "Rerror", ("II", ("code", "count"))),
  (THELLO, "Thello", ("III", ("magic", "version", "maxmsg"))),
  (RHELLO, "Rhello", ("IIIHHI QQII 32s64s16s32s128s", ("magic", "version", "maxmsg", "backend", "caps", "ncores", "memory", "maxbuf",
                                                      "maxhandles", "session", "nonce", "name", "arch", "cpu", "features"))),
  (TAUTH, "Tauth", ("32s32s", ("cnonce", "mac"))),
  (RAUTH, "Rauth", ("32s", ("mac",))),
  (TPING, "Tping", _PING), (RPING, "Rping", _PING),
  (TSYNC, "Tsync", _SYNC), (RSYNC, "Rsync", _SYNC),
  (TALLOC, "Talloc", ("IQ", ("handle", "bufsize"))),
  (TFREE, "Tfree", ("I", ("handle",))),
  (TWRITE, "Twrite", _IO), (TREAD, "Tread", _IO),
  (RREAD, "Rread", ("I", ("count",))),
  (TCOPY, "Tcopy", ("IIIQQQ", ("dst", "src", "pad", "dstoff", "srcoff", "count"))),
  (TLOAD, "Tload", ("IHHHHHH IIII", ("prog", "kind", "arch", "nbufs", "nvals", "corearg", "pad", "entry", "crc", "namelen", "datalen"))),
  (TUNLOAD, "Tunload", ("I", ("prog",))),
  (TLAUNCH, "Tlaunch", ("I" + _LAUNCH[0], ("pad",) + _LAUNCH[1])),
  (RLAUNCH, "Rlaunch", _TIME),
  (TGRAPH, "Tgraph", _GRAPH),
  (TGRAPHRUN, "Tgraphrun", _GRAPH),
  (RGRAPHRUN, "Rgraphrun", _TIME),
  (TGRAPHFREE, "Tgraphfree", ("I", ("graph",))),
  (TCLOCK, "Tclock", _SYNC),
  (RCLOCK, "Rclock", ("IQ", ("pad", "clock"))),
  (TPROFILE, "Tprofile", ("II", ("mode", "count"))),
  (RPROFILE, "Rprofile", ("IIIII", ("count", "left", "lost", "cap", "pad"))),
  (THAVE, "Thave", _PING), (RHAVE, "Rhave", _PING),
  (TWRITEHASH, "Twritehash", (_IO[0] + "32s", _IO[1] + ("hash",))),
  (TRESUMEKEY, "Tresumekey", ("I", ("mode",))),
  (RRESUMEKEY, "Rresumekey", ("IQ32s", ("grace", "log", "secret"))),
  (TRESUME, "Tresume", ("IQQ32s32s", ("session", "sent", "received", "cnonce", "mac"))),
  (RRESUME, "Rresume", ("IQ32s", ("pad", "processed", "mac"))),
  (TACK, "Tack", ("IQ", ("pad", "received"))),
  (TGRANT, "Tgrant", ("IQQII", ("handle", "offset", "count", "ttl", "pad"))),
  (RGRANT, "Rgrant", ("IQ32s", ("pad", "grant", "secret"))),
  (TPEERSEND, "Tpeersend", ("IQQQ32sHHI", ("handle", "offset", "count", "grant", "secret", "port", "hostlen", "pad"))),
  (RPEERSEND, "Rpeersend", _TIME),
  (TPEER, "Tpeer", ("IQQ32s32s", ("magic", "grant", "count", "cnonce", "mac"))),
  (RPEER, "Rpeer", ("IQ32s", ("pad", "count", "mac"))),
  (TLISTEN, "Tlisten", ("II", ("link", "ttl"))),
  (RLISTEN, "Rlisten", ("IQ32s", ("pad", "grant", "secret"))),
  (TDIAL, "Tdial", ("IHHIQ32s", ("link", "port", "hostlen", "pad", "grant", "secret"))),
  (RDIAL, "Rdial", _TIME),
  (TUNLINK, "Tunlink", ("I", ("link",)))]}
TYPE_NAMES = {t: m.name for t, m in MSGS.items()}

# records inside frames: a launch (Tlaunch, Tgraph) with its buffer args and int64 values, a Tgraphrun patch
LAUNCH = Msg("launch", "<" + _LAUNCH[0], _LAUNCH[1])
ARG = Msg("arg", "<IIQ", ("handle", "pad", "offset"))
VAL = struct.Struct("<q")
PATCH = Msg("patch", "<IHHIIQ", ("entry", "kind", "index", "handle", "pad", "value"))
LINKHDR = Msg("linkhdr", "<IIQQQ", ("magic", "pad", "seq", "channel", "count"))  # a message on a link (not a frame)
PROF = Msg("prof", "<HHIIIQQQ", ("kind", "entry", "tag", "handle", "aux", "start", "end", "count"))  # an Rprofile record

def is_request(t:int) -> bool: return t in MSGS and t % 2 == 0

def pack(type:int, tag:int, flags:int=0, payload_len:int=0, **fields) -> bytes:
  """The fixed part of a frame, with size = fixed size + payload_len unless size= is given. Unnamed fields are 0."""
  m = MSGS[type]
  return m.pack(**{"size": m.size + payload_len, **fields, "type": type, "flags": flags, "tag": tag})

def unpack(buf) -> tuple[int, dict]:
  """Decode the header and fixed fields of a frame (buf may hold more); returns (type, {field: value})."""
  if len(buf) < HDR_SIZE: raise ValueError(f"{len(buf)} bytes is shorter than the {HDR_SIZE}-byte header")
  t = HDR.unpack(buf)["type"]
  if (m := MSGS.get(t)) is None: raise ValueError(f"unknown message type {t}")
  if len(buf) < m.size: raise ValueError(f"{m.name} needs its {m.size}-byte fixed part, only {len(buf)} bytes given")
  return t, m.unpack(buf)

def payload_len(type:int, f:dict) -> int|None:
  """Bytes that must follow the fixed part, from its count fields; None for Tgraph (records are self-describing)."""
  if type in (RERROR, TPING, RPING, RREAD, TWRITE, RHAVE): return f["count"]
  if type == THAVE: return HASH_SIZE * f["count"]
  if type == TLOAD: return f["namelen"] + f["datalen"]
  if type in (TPEERSEND, TDIAL): return f["hostlen"]
  if type == TLAUNCH: return 16 * f["nbufs"] + 8 * f["nvals"]
  if type == TGRAPHRUN: return 24 * f["count"]
  if type == RPROFILE: return PROF.size * f["count"]
  return None if type == TGRAPH else 0

AUTH_CLIENT, AUTH_SERVER = b"metal_runner-auth-v1 client", b"metal_runner-auth-v1 server"  # the proofs of Tauth, Rauth
PEER_SRC, PEER_DST, PEER_DONE = b"metal_runner peer src", b"metal_runner peer dst", b"metal_runner peer done"
LINK_SRC, LINK_DST = b"metal_runner link src", b"metal_runner link dst"  # the proofs of a link's peer connection (count 0)
def peer_mac(secret:bytes, label:bytes, grant:int, count:int, cnonce:bytes) -> bytes:
  """HMAC-SHA256(secret, label || grant[8] || count[8] || cnonce[32]): the proofs of a peer connection (protocol.md, Tpeer, Rpeer)."""
  return hmac.new(secret, label + struct.pack("<QQ", grant, count) + cnonce, hashlib.sha256).digest()

# A launch size as the launch record's three numbers, the missing ones 1. dims() encodes what it is given (tests send sizes the runner
# must refuse); launch_dims() first checks tinygrad's sizes, which the devices and graphs send, and raises on one that is not whole positive numbers.
def dims(d) -> tuple[int, int, int]: return tuple(d) + (1,) * (3 - len(d))

def launch_dims(d) -> tuple[int, int, int]:
  if len(d) == 3 and type(d[0]) is int and type(d[1]) is int and type(d[2]) is int and d[0] > 0 and d[1] > 0 and d[2] > 0: return d
  if any(x != int(x) or x < 1 for x in d): raise RuntimeError(f"launch size {tuple(d)} is not whole positive numbers")
  return dims(tuple(int(x) for x in d))

def launch_fields(prog:int, bufs, vals, global_size=(1, 1, 1), local_size=(1, 1, 1)) -> dict:
  g, l = dims(global_size), dims(local_size)
  return {"prog": prog, "nbufs": len(bufs), "nvals": len(vals), "global0": g[0], "global1": g[1], "global2": g[2],
          "local0": l[0], "local1": l[1], "local2": l[2]}

def launch_args(bufs, vals) -> bytes:
  """The tail of a launch record: (handle, offset) per buffer, then each value as int64."""
  return b"".join(ARG.pack(handle=h, offset=o) for h, o in bufs) + b"".join(VAL.pack(v) for v in vals)

def launch_record(prog:int, bufs, vals, global_size=(1, 1, 1), local_size=(1, 1, 1)) -> bytes:
  """One launch record as in Tgraph: prog[4] nbufs[2] nvals[2] global[3*4] local[3*4] arg[16*nbufs] value[8*nvals]."""
  return LAUNCH.pack(**launch_fields(prog, bufs, vals, global_size, local_size)) + launch_args(bufs, vals)

def unpack_launch(buf, off:int=0) -> tuple[dict, list, list, int]:
  """Decode a launch record at buf[off]; returns (fields, [(handle, offset)], [values], offset after it)."""
  f = LAUNCH.unpack(buf, off)
  off += LAUNCH.size
  bufs = [(a["handle"], a["offset"]) for a in (ARG.unpack(buf, off + ARG.size * i) for i in range(f["nbufs"]))]
  off += ARG.size * f["nbufs"]
  vals = [VAL.unpack_from(buf, off + VAL.size * i)[0] for i in range(f["nvals"])]
  return f, bufs, vals, off + VAL.size * f["nvals"]

def patch(entry:int, kind:int, index:int, handle:int=0, value:int=0) -> bytes:
  """One Tgraphrun patch; value is a u64 on the wire (a negative PATCH_VAL value is sent as two's complement)."""
  return PATCH.pack(entry=entry, kind=kind, index=index, handle=handle, value=value & 0xffffffffffffffff)

def cstr(b:bytes) -> str:
  """A NUL-padded string field (Rhello name, arch, cpu, features) as text."""
  return b.split(b"\0", 1)[0].decode("utf-8", "replace")
