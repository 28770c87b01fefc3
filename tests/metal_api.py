"""What daemon/runner.m sends to Metal, as the compiler sees it, and the pinned PyPI downloads it is checked against.

"runner.m" here is the Metal backend: daemon/runner.m and the daemon/mtl_*.m files it is split into (RUNNER_SOURCES), each
compiled on its own, their lists joined. Shared by tests/test_metal_api_metalcpp.py (Apple's metal-cpp headers) and
tests/test_metal_api_pyobjc.py (PyObjC's metadata for Metal). runner.m is compiled against tests/metal_stub with clang for the GNU Objective-C runtime ABI, whose output names
each selector sent (.objc_sel_name<selector>, an object-file symbol) with the type encoding of the declaration clang chose for
it (the typed selector list, .objc_selector_list), and each class messaged (__objc_class_name_<class>). Those lists are exact,
not a regex over the source.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "daemon" / "runner.m"
# The Metal backend's sources (daemon/Makefile's MTL): every .m file in daemon/ (their shared header, mtl.h, sends nothing).
RUNNER_SOURCES = sorted((ROOT / "daemon").glob("*.m"))
STUB = ROOT / "tests" / "metal_stub"
CLANG = shutil.which("clang")
NM = shutil.which("nm") or shutil.which("llvm-nm")

# The flags: for the GNU runtime (-fobjc-runtime=gcc), whose output names the selectors and classes; blocks for
# <dispatch/dispatch.h>; manual retain/release as runner.m requires; -D__APPLE__ and MR_BACKEND_METAL so the Metal backend is
# compiled, against the stubs (-I tests/metal_stub) as in tests/test_metal_typecheck.py.
OBJC_FLAGS = ["-x", "objective-c", "-fobjc-runtime=gcc", "-fblocks", "-fno-objc-arc", "-DMR_BACKEND_METAL", "-D__APPLE__=1"]


def _compile(src: Path, stub: Path, out: Path, *extra: str):
  cmd = [CLANG, *extra, *OBJC_FLAGS, "-I", str(stub), "-I", str(ROOT / "daemon"), str(src), "-o", str(out)]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stderr}"


def stub_constants(stub: Path = STUB) -> set[str]:
  """The MTL/NS constants (extern ... const NAME;, as MTLCommandBufferEncoderInfoErrorKey) tests/metal_stub declares: an undefined
  symbol of runner.o that is one of them is a constant runner.m reads, not a function it calls."""
  text = "".join(re.sub(r"/\*.*?\*/", "", h.read_text(), flags=re.S) for h in sorted(stub.rglob("*.h")))
  return set(re.findall(r"^extern\s+\w+\s+const\s+((?:MTL|NS)[A-Z]\w*)\s*;", text, flags=re.M))


def runner_symbols(srcs: list[Path] = RUNNER_SOURCES, stub: Path = STUB) -> dict[str, set[str]]:
  """The selectors runner.m sends, the classes it messages and the MTL/NS C functions it calls, from the objects' symbols."""
  nm = ""
  with tempfile.TemporaryDirectory() as tmp:
    for src in srcs:
      obj = Path(tmp) / f"{src.stem}.o"
      _compile(src, stub, obj, "-c")
      nm += subprocess.run([NM, str(obj)], capture_output=True, text=True, timeout=60, check=True).stdout
  syms = [(line.split()[-2], line.split()[-1]) for line in nm.splitlines() if len(line.split()) >= 2]
  consts = stub_constants(stub)
  out = {"selectors": {s[len(".objc_sel_name"):] for _, s in syms if s.startswith(".objc_sel_name")},
         "classes": {s[len("__objc_class_name_"):] for t, s in syms if t == "U" and s.startswith("__objc_class_name_")},
         "functions": {s for t, s in syms if t == "U" and re.match(r"(MTL|NS)[A-Z]", s) and s not in consts},
         "constants": {s for t, s in syms if t == "U" and s in consts}}
  assert len(out["selectors"]) > 20 and "newBufferWithLength:options:" in out["selectors"], \
    f"found {len(out['selectors'])} selector symbols in the object: has the GNU runtime's symbol naming changed?\n{nm[:2000]}"
  return out


def _llvm_strings(ir: str) -> dict[str, bytes]:
  """{global name: bytes} of the IR's constant C strings (c"...\\00": LLVM writes other bytes as \\XX, a backslash too)."""
  out = {}
  for name, body in re.findall(r'^@("[^"]+"|[-\w.$]+) = [^\n]*?constant \[\d+ x i8\] c"((?:[^"\\]|\\[0-9A-Fa-f]{2})*)"', ir, re.M):
    raw = re.sub(rb"\\([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), body.encode())
    out[name.strip('"')] = raw.split(b"\0", 1)[0]
  return out


def runner_method_types(srcs: list[Path] = RUNNER_SOURCES, stub: Path = STUB) -> dict[str, set[str]]:
  """{selector: the Objective-C type encodings runner.m sends it with}: the GNU runtime's typed selector list, where each
  selector a message uses is paired with the method type encoding of the declaration clang resolved it to
  ("@40@0:8r^v16Q24Q32" for -initWithBytes:length:encoding:). An empty set: sent only untyped (no declaration)."""
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    for src in srcs:
      ll = Path(tmp) / f"{src.stem}.ll"
      _compile(src, stub, ll, "-S", "-emit-llvm")
      ir = ll.read_text()
      m = re.search(r"^@\.objc_selector_list = [^\n]*? \[(.*)\], align", ir, re.M)
      assert m, f"no .objc_selector_list in clang's output for {src.name}: has the GNU runtime's code generation changed?"
      strings = _llvm_strings(ir)
      refs = re.findall(r'@("[^"]+"|[-\w.$]+)|\b(null)\b', m.group(1))
      assert len(refs) % 2 == 0, f"cannot pair the selector list's entries: {m.group(1)[:500]}"
      for (name, _), (types, null) in zip(refs[0::2], refs[1::2]):
        sel = strings[name.strip('"')].decode()
        out.setdefault(sel, set())
        if not null: out[sel].add(strings[types.strip('"')].decode())
  return out


def stub_text(stub: Path) -> str:
  return "\n".join(re.sub(r"/\*.*?\*/|//[^\n]*", "", h.read_text(), flags=re.S) for h in sorted(stub.rglob("*.h")))


def clang_ast(stub: Path, extra: str) -> str:
  """clang's AST dump of every stub header, and of extra code after them."""
  with tempfile.TemporaryDirectory() as tmp:
    src = Path(tmp) / "probe.m"
    src.write_text("".join(f'#include "{h}"\n' for h in sorted(stub.rglob("*.h"))) + extra)
    cmd = [CLANG, "-fsyntax-only", *OBJC_FLAGS, "-I", str(stub), str(src), "-Xclang", "-ast-dump"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, f"clang could not read the stubs:\n{r.stderr}\n{extra}"
  return r.stdout


def stub_enum_values(stub: Path = STUB) -> dict[str, int]:
  """Every MTL.../NS... enumerator and object-like #define constant the stub headers declare, valued by clang itself."""
  text = stub_text(stub)
  names = {n for n in re.findall(r"EnumConstantDecl 0x[0-9a-f]+ <[^>]*> \S+ (?:referenced )?(\w+) '", clang_ast(stub, ""))
           if re.match(r"(MTL|NS)[A-Z]", n) and re.search(rf"\b{n}\b", text)}
  names |= set(re.findall(r"^\s*#\s*define\s+((?:MTL|NS)[A-Z]\w*)[ \t]+\S", text, flags=re.M))
  assert names, f"found no enum constants in {stub}"
  order = sorted(names)
  probe = "enum {\n" + "".join(f"  mr_probe_{i} = ({n}),\n" for i, n in enumerate(order)) + "};\n"
  dump = clang_ast(stub, probe)
  vals = dict(re.findall(r"EnumConstantDecl 0x[0-9a-f]+ <[^>]*> \S+ mr_probe_(\d+) '.*?\n(?:.*\n)*?.*?value: Int (-?\d+)", dump))
  assert len(vals) == len(order), f"clang valued {len(vals)} of {len(order)} stub constants"
  return {order[int(i)]: int(v) for i, v in vals.items()}


# ---- a file from PyPI, pinned by version and SHA-256 -----------------------------------------------------------------------

def _sha256(p: Path) -> str:
  return hashlib.sha256(p.read_bytes()).hexdigest()


def pypi_unavailable(what: str, why: str, dest: Path):
  """No network: a failure on Linux CI (CI=true), where the check must run; a skip elsewhere."""
  msg = (f"cannot obtain {what} from PyPI into {dest.parent}: {why}. Run once with network access, or put the file "
         f"{dest.name} there by hand")
  if os.environ.get("CI") == "true" and sys.platform.startswith("linux"): pytest.fail(msg, pytrace=False)
  pytest.skip(msg)


def pinned_pypi_file(dest: Path, requirement: str, sha256: str, pip_args: list[str], pinned_in: str) -> Path:
  """dest, downloaded once by pip (requirement "name==version", with pip_args choosing the file: sdist or wheel) and checked
  against sha256 on every call. pip's --require-hashes refuses a file with another hash before it runs anything from it."""
  dest.parent.mkdir(parents=True, exist_ok=True)
  if not dest.exists():
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
      req = Path(tmp) / "requirements.txt"
      req.write_text(f"{requirement} --hash=sha256:{sha256}\n")
      cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *pip_args, "--require-hashes", "--disable-pip-version-check",
             "-q", "-r", str(req), "-d", str(Path(tmp) / "dl")]
      try: r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
      except (OSError, subprocess.TimeoutExpired) as e: pypi_unavailable(requirement, f"{' '.join(cmd)}: {e}", dest)
      out = (r.stdout + r.stderr).strip()
      if "DO NOT MATCH THE HASHES" in out:
        pytest.fail(f"PyPI's {requirement} does not have the pinned SHA-256 {sha256} ({pinned_in}): pip says\n{out[-1500:]}",
                    pytrace=False)
      got = [p for p in (Path(tmp) / "dl").glob("*") if p.name == dest.name] if r.returncode == 0 else []
      if len(got) != 1: pypi_unavailable(requirement, f"pip download exited {r.returncode}: {out[-1500:]}", dest)
      if (h:=_sha256(got[0])) != sha256: _hash_mismatch(got[0], h, requirement, sha256, pinned_in)
      os.replace(got[0], dest)
  if (h:=_sha256(dest)) != sha256: _hash_mismatch(dest, h, requirement, sha256, pinned_in)
  return dest


def _hash_mismatch(p: Path, got: str, requirement: str, sha256: str, pinned_in: str):
  pytest.fail(f"{p} has SHA-256 {got}, but {requirement} is pinned to {sha256} ({pinned_in}). Either the download is not the "
              f"file that was pinned, or the pin was changed without its hash: delete {p.parent} and check the pin", pytrace=False)


# ---- the stubs' declarations ---------------------------------------------------------------------------------------------

def stub_method_containers(stub: Path = STUB) -> dict[str, set[tuple[str, str]]]:
  """{selector: {(container, "protocol" | "class")}}: the protocols and classes of tests/metal_stub that declare each
  method, property accessors included (clang's implicit methods)."""
  out, container = {}, None
  for line in clang_ast(stub, "").splitlines():
    if m := re.match(r"[|`]-ObjC(Protocol|Interface)Decl 0x[0-9a-f]+ .* (\w+)$", line):
      container = (m.group(2), "protocol" if m.group(1) == "Protocol" else "class")
    elif re.match(r"[|`]-", line):
      container = None
    elif container and (m := re.match(r"[| ] [|`]-ObjCMethodDecl 0x[0-9a-f]+ .*? [-+] ([\w:]+) '", line)):
      out.setdefault(m.group(1), set()).add(container)
  assert "newBufferWithLength:options:" in out and "status" in out, f"read no methods from {stub}: has clang's AST dump changed?"
  return out


def _ast_type(quoted: str) -> str:
  """A type as clang's AST dump quotes it, desugared where it gives both ("'NSUInteger':'unsigned long'" -> unsigned long)."""
  parts = re.findall(r"'([^']*)'", quoted)
  return parts[-1]


def stub_method_types(stub: Path = STUB) -> dict[tuple[str, str], list[str]]:
  """{(selector, container): [return type, parameter types...]} as C type names, for each method tests/metal_stub declares
  (property accessors included): which declaration a send resolved to, where two containers declare one selector."""
  out, container, key = {}, None, None
  for line in clang_ast(stub, "").splitlines():
    if m := re.match(r"[|`]-ObjC(?:Protocol|Interface)Decl 0x[0-9a-f]+ .* (\w+)$", line):
      container, key = m.group(1), None
    elif re.match(r"[|`]-", line):
      container, key = None, None
    elif container and (m := re.match(r"[| ] [|`]-ObjCMethodDecl 0x[0-9a-f]+ .*? [-+] ([\w:]+) ('.*)$", line)):
      key = (m.group(1), container)
      out[key] = [_ast_type(m.group(2))]
    elif key and (m := re.match(r"[| ] [| ] [|`]-ParmVarDecl 0x[0-9a-f]+ .*? \w+ ('.*)$", line)):
      out[key].append(_ast_type(m.group(1)))
    elif re.match(r"[| ] [|`]-", line):
      key = None
  assert len(out.get(("setBuffer:offset:atIndex:", "MTLComputeCommandEncoder"), ())) == 4, \
    f"read no method types from {stub}: has clang's AST dump changed?"
  return out


def stub_functions(stub: Path = STUB) -> dict[str, tuple[str, list[str], bool]]:
  """{C function: (return type, [parameter types], returns retained)} for the MTL/NS functions tests/metal_stub declares."""
  out, lines = {}, clang_ast(stub, "").splitlines()
  for i, line in enumerate(lines):
    m = re.match(r"[|`]-FunctionDecl 0x[0-9a-f]+ .* ((?:MTL|NS)[A-Z]\w*) '[^']*'(?::'([^']*)')?", line)
    if not m: continue
    t = m.group(2) or re.search(r" '([^']*)'", line[m.start(1):]).group(1)
    ret, _, params = t.rpartition("(")
    assert ret and params.endswith(")") and "(" not in params, f"cannot read the type of {m.group(1)}: {t!r}"
    params = [p.strip() for p in params[:-1].split(",") if p.strip() not in ("", "void")]
    attrs = []
    for nxt in lines[i + 1:]:
      if not re.match(r"[| ] ", nxt): break
      attrs.append(nxt)
    out[m.group(1)] = (ret.replace("NS_RETURNS_RETAINED", "").strip(), params, any("NSReturnsRetainedAttr" in a for a in attrs))
  return out


def stub_encodings(types: list[str], stub: Path = STUB) -> list[str]:
  """@encode of each C type, as clang compiles it against tests/metal_stub (["BOOL", "MTLSize"] -> ["c", "{?=QQQ}"])."""
  with tempfile.TemporaryDirectory() as tmp:
    src, ll = Path(tmp) / "probe.m", Path(tmp) / "probe.ll"
    src.write_text("".join(f'#include "{h}"\n' for h in sorted(stub.rglob("*.h"))) +
                   "".join(f"const char mr_enc_{i}[] = @encode({t});\n" for i, t in enumerate(types)))
    _compile(src, stub, ll, "-S", "-emit-llvm")
    strings = _llvm_strings(ll.read_text())
  return [strings[f"mr_enc_{i}"].decode() for i in range(len(types))]
