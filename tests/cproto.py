"""Build daemon/proto.c into a cffi module so tests drive the real C codec, plus helpers shared by the protocol tests.

The module is compiled once per test session into tests/.build (never committed). cdef is the text of protocol.h and
proto.h with every preprocessor line dropped except "#define NAME <integer>", so the C headers are the only declaration.
"""
from __future__ import annotations
import importlib.util, pathlib, re, sys
import cffi

ROOT = pathlib.Path(__file__).resolve().parent.parent
DAEMON, BUILD = ROOT / "daemon", pathlib.Path(__file__).resolve().parent / ".build"
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
from client import protocol as P  # noqa: E402

def cdef_text(path:pathlib.Path) -> str:
  keep = re.compile(r"#\s*define\s+\w+\s+(0x[0-9a-fA-F]+|\d+)\b")
  return "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("#") or keep.match(l.lstrip()))

_mods: dict[str, tuple] = {}
def cffi_module(name:str, cdef:str, header:str, source:str|list[str], args=()) -> tuple:
  """(ffi, lib) for daemon C file(s) built as cffi module name into tests/.build, compiled at most once per process."""
  if name not in _mods:
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(name, f'#include "{header}"', sources=[str(DAEMON / f) for f in ([source] if isinstance(source, str) else source)], include_dirs=[str(DAEMON)],
                   extra_compile_args=["-std=c11", *args, "-Wall", "-Wextra", "-Werror"])
    BUILD.mkdir(exist_ok=True)
    so = ffi.compile(tmpdir=str(BUILD), verbose=False)
    spec = importlib.util.spec_from_file_location(name, so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _mods[name] = (mod.ffi, mod.lib)
  return _mods[name]

def build():
  """(ffi, lib) for daemon/proto.c."""
  return cffi_module("_proto_cffi", cdef_text(DAEMON / "protocol.h") + "\n" + cdef_text(DAEMON / "proto.h"), "proto.h", "proto.c")

# type -> member of union proto_msg (its struct is proto_<member>)
MEMBER = {P.RERROR: "rerror", P.THELLO: "thello", P.RHELLO: "rhello", P.TAUTH: "tauth", P.RAUTH: "rauth", P.TPING: "ping",
          P.RPING: "ping", P.TSYNC: "sync", P.RSYNC: "sync", P.TALLOC: "talloc", P.TFREE: "tfree", P.TWRITE: "twrite",
          P.TREAD: "tread", P.RREAD: "rread", P.TCOPY: "tcopy", P.TLOAD: "tload", P.TUNLOAD: "tunload", P.TLAUNCH: "tlaunch",
          P.RLAUNCH: "rtime", P.TGRAPH: "tgraph", P.TGRAPHRUN: "tgraphrun", P.RGRAPHRUN: "rtime", P.TGRAPHFREE: "tgraphfree",
          P.TCLOCK: "sync", P.RCLOCK: "rclock", P.TPROFILE: "tprofile", P.RPROFILE: "rprofile",
          P.THAVE: "have", P.RHAVE: "have", P.TWRITEHASH: "twritehash", P.TRESUMEKEY: "tresumekey",
          P.RRESUMEKEY: "rresumekey", P.TRESUME: "tresume", P.RRESUME: "rresume", P.TACK: "tack",
          P.TGRANT: "tgrant", P.RGRANT: "rgrant", P.TPEERSEND: "tpeersend", P.RPEERSEND: "rtime", P.TPEER: "tpeer", P.RPEER: "rpeer",
          P.TLISTEN: "tlisten", P.RLISTEN: "rgrant", P.TDIAL: "tdial", P.RDIAL: "rtime", P.TUNLINK: "tunlink"}
# C member path -> Python field name where they differ (the header already has a "size")
RENAME = {("proto_talloc", "size"): "bufsize"}

def cfields(ffi, ctype, base=0, path=(), struct=None) -> list[tuple[str, int, int, tuple]]:
  """Flatten a C struct to (python name, offset, width, member path): nested structs inlined, int arrays split per element."""
  if isinstance(ctype, str): struct, ctype = ctype.split()[-1], ffi.typeof(ctype)
  out = []
  for name, f in ctype.fields:
    t, off = f.type, base + f.offset
    if t.kind == "struct": out += cfields(ffi, t, off, path + (name,), t.cname.split()[-1])
    elif t.kind == "array" and t.item.cname not in ("char", "uint8_t", "unsigned char"):
      out += [(f"{name}{i}", off + i * ffi.sizeof(t.item), ffi.sizeof(t.item), path + (name, i)) for i in range(t.length)]
    else: out.append((RENAME.get((struct, name), name), off, ffi.sizeof(t), path + (name,)))
  return out

def getp(obj, path):
  for p in path: obj = obj[p] if isinstance(p, int) else getattr(obj, p)
  return obj

def cget(ffi, obj, path):
  """A member's value: an int, or bytes for a byte array."""
  v = getp(obj, path)
  return bytes(ffi.buffer(v)) if isinstance(v, ffi.CData) and ffi.typeof(v).kind == "array" else v

def cset(ffi, obj, path, value):
  if isinstance(value, (bytes, bytearray)):
    arr = getp(obj, path)
    ffi.memmove(arr, value.ljust(ffi.sizeof(arr), b"\0"), ffi.sizeof(arr))
  else:
    parent = getp(obj, path[:-1])
    if isinstance(path[-1], int): parent[path[-1]] = value
    else: setattr(parent, path[-1], value)

def errtext(ffi, err) -> str: return ffi.string(err).decode()

def check_hdr(frame:bytes, maxmsg:int=P.DEFAULT_MAXMSG) -> tuple[int, str]:
  """proto_get_hdr + proto_check_hdr on the first 12 bytes of frame: (rc, error text)."""
  ffi, lib = build()
  h, err = ffi.new("struct proto_hdr *"), ffi.new("char[]", lib.PROTO_ERRLEN)
  lib.proto_get_hdr(frame[:12], h)
  return lib.proto_check_hdr(h, maxmsg, err), errtext(ffi, err)

def get(frame:bytes):
  """proto_get on frame: (rc, union proto_msg *, error text)."""
  ffi, lib = build()
  m, err = ffi.new("union proto_msg *"), ffi.new("char[]", lib.PROTO_ERRLEN)
  rc = lib.proto_get(frame, len(frame), m, err)
  return rc, m, errtext(ffi, err)

def check_size(frame:bytes) -> tuple[int, str]:
  """proto_get then proto_check_size, as the daemon does after proto_check_hdr passed."""
  ffi, lib = build()
  rc, m, e = get(frame)
  assert rc == 0, e
  err = ffi.new("char[]", lib.PROTO_ERRLEN)
  return lib.proto_check_size(m, err), errtext(ffi, err)

def cmsg(type:int, fields:dict):
  """A union proto_msg with header and the named Python fields set (type and the Python field names of P.MSGS)."""
  ffi, _ = build()
  m = ffi.new("union proto_msg *")
  member = MEMBER[type]
  paths = {name: path for name, _, _, path in cfields(ffi, f"struct proto_{member}")}
  cset(ffi, m, (member, "h", "type"), type)
  for k, v in fields.items(): cset(ffi, m, (member,) + paths[k], v)
  return m

def cdecode(m, type:int) -> dict:
  """Every field of a decoded union proto_msg, by Python field name."""
  ffi, _ = build()
  member = MEMBER[type]
  return {name: cget(ffi, m, (member,) + path) for name, _, _, path in cfields(ffi, f"struct proto_{member}")}
