"""A second, independent check of daemon/runner.m's Metal API surface: against Apple's own metal-cpp headers.

tests/test_metal_typecheck.py type-checks runner.m against tests/metal_stub/, headers we wrote from Apple's documentation. This
file checks the same surface against metal-cpp, Apple's C++ bindings for Metal (Apache-2.0), which spell out every Objective-C
selector, class name, enum value and C function of Metal and the parts of Foundation they use. metal-cpp comes from the PyPI
sdist of pymetal-cpp (it vendors a copy under thirdparty/metal-cpp), pinned below by version and SHA-256, downloaded once with
pip into .cache/metal-cpp/ (git ignores it) and never committed.

  a. Selectors and classes: runner.m is compiled to an object file with clang for the GNU Objective-C runtime ABI, whose
     object files name each selector sent (.objc_sel_name<selector>) and each class messaged (__objc_class_name_<class>).
     That is the exact list, not a regex over the source. Each must be declared in metal-cpp: _MTL_PRIVATE_DEF_SEL /
     _MTL_PRIVATE_DEF_CLS in Metal/MTLHeaderBridge.hpp, _NS_PRIVATE_DEF_SEL / _NS_PRIVATE_DEF_CLS in
     Foundation/NSPrivate.hpp, or be in NOT_IN_METALCPP_SELECTORS / _CLASSES below with the reason.
  b. Enum values: every MTL.../NS... enumerator and #define constant in tests/metal_stub/**/*.h, evaluated by clang (so
     `MTLStorageModeShared << MTLResourceStorageModeShift` is computed as the compiler does), must equal the metal-cpp
     enumerator of the same name less its prefix (MTLCommandBufferStatusError = MTL::CommandBufferStatusError), read from
     _MTL_ENUM/_MTL_OPTIONS/_NS_ENUM/_NS_OPTIONS bodies, or be in NOT_IN_METALCPP_ENUMS with the reason.
  c. C functions: every MTL... function runner.m calls (an undefined symbol of the object) is declared extern "C" in metal-cpp.
  d. Each check is fed a wrong selector / value / name and must report it.

New API in runner.m or the stubs (a selector, an enum value) is picked up from the object file and the headers; nothing to list.
"""
import ast
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from metal_api import CLANG, NM, ROOT, STUB, pinned_pypi_file, runner_symbols, stub_enum_values

# ---- the pinned metal-cpp ------------------------------------------------------------------------------------------------
# pymetal-cpp 0.1.5 (PyPI sdist) vendors metal-cpp 367.4.2 (Metal/MTLVersion.hpp), the macOS 15 / iOS 18 release.
# To update: pick a version (`.venv/bin/python -m pip index versions pymetal-cpp`), download its sdist
#   .venv/bin/python -m pip download --no-deps --no-binary pymetal-cpp pymetal-cpp==X -d /tmp/p && sha256sum /tmp/p/*.tar.gz
# and set both lines below; the next run replaces the cached copy. Then update tests/metal_stub/README.md (the version named).
PYMETAL_CPP_VERSION = "0.1.5"
PYMETAL_CPP_SDIST_SHA256 = "1118062f635277a2781659fbc4e7e5bac7d565d6948a3461c3b04d6425c15a0e"

# Selectors, classes and enum constants runner.m or the stubs use that metal-cpp does not declare, each with the reason and
# Apple's page for it. The test fails if an entry is declared by metal-cpp after all, or is no longer used (it cannot go stale).
NOT_IN_METALCPP_SELECTORS = {
  "initWithBytes:length:encoding:": "NSString's initializer (developer.apple.com/documentation/foundation/nsstring/"
                                    "init(bytes:length:encoding:)); metal-cpp's NS::String wraps only the NoCopy variant",
}
NOT_IN_METALCPP_CLASSES: dict[str, str] = {}
NOT_IN_METALCPP_FUNCTIONS: dict[str, str] = {}
# An enum constant here has no metal-cpp enumerator; the value is either derived from metal-cpp's (a function of its values)
# or None, accepted unverified (e.g. an enumerator newer than the pinned metal-cpp; pin a newer one when there is one).
NOT_IN_METALCPP_ENUMS = {
  "MTLResourceStorageModeShift": (
    "a #define in Apple's MTLResource.h (developer.apple.com/documentation/metal/mtlresourceoptions), not an enumerator; "
    "metal-cpp writes MTL::ResourceStorageMode* as literals, so the shift is the one mapping every StorageModeX onto "
    "ResourceStorageModeX",
    lambda mc: _storage_mode_shift(mc)),
}

CACHE = ROOT / ".cache" / "metal-cpp"

pytestmark = [
  pytest.mark.skipif(CLANG is None, reason="clang is not installed, and compiling daemon/runner.m for its selector list "
                     "needs it (Debian: apt-get install clang)"),
  pytest.mark.skipif(NM is None, reason="nm is not installed (Debian: apt-get install binutils)"),
  pytest.mark.skipif(sys.platform == "darwin", reason="on macOS make -C daemon compiles runner.m against the real SDK headers; "
                     "the GNU-runtime object file this check reads is a Linux build"),
]

# ---- getting metal-cpp ---------------------------------------------------------------------------------------------------

def _extract(sdist: Path, dest: Path):
  """Only <top>/thirdparty/metal-cpp/, regular files and folders, no path leaving it."""
  prefix = f"pymetal_cpp-{PYMETAL_CPP_VERSION}/thirdparty/metal-cpp/"
  with tempfile.TemporaryDirectory(dir=CACHE) as tmp, tarfile.open(sdist, "r:gz") as tar:
    n = 0
    for m in tar.getmembers():
      if not m.name.startswith(prefix) or not (m.isfile() or m.isdir()): continue
      rel = Path(m.name[len(prefix):])
      if rel.is_absolute() or ".." in rel.parts: pytest.fail(f"{sdist}: unsafe path {m.name!r}", pytrace=False)
      out = Path(tmp) / "metal-cpp" / rel
      if m.isdir(): out.mkdir(parents=True, exist_ok=True); continue
      out.parent.mkdir(parents=True, exist_ok=True)
      out.write_bytes(tar.extractfile(m).read())
      n += 1
    if n == 0: pytest.fail(f"{sdist} has no {prefix}: pymetal-cpp no longer vendors metal-cpp there", pytrace=False)
    (Path(tmp) / "metal-cpp" / ".sdist-sha256").write_text(PYMETAL_CPP_SDIST_SHA256)
    if dest.exists(): shutil.rmtree(dest)
    os.replace(Path(tmp) / "metal-cpp", dest)


def get_metalcpp() -> Path:
  """The metal-cpp tree of the pinned sdist: .cache/metal-cpp/pymetal-cpp-<version>/metal-cpp.
  pip still prepares the sdist's metadata, in an isolated build environment: --no-binary names pymetal-cpp only, since
  `--no-binary :all:` would build that environment's own packages (scikit-build-core, nanobind) from source too, which can
  take many minutes."""
  sdist = pinned_pypi_file(CACHE / f"pymetal_cpp-{PYMETAL_CPP_VERSION}.tar.gz", f"pymetal-cpp=={PYMETAL_CPP_VERSION}",
                           PYMETAL_CPP_SDIST_SHA256, ["--no-binary", "pymetal-cpp"], "tests/test_metal_api_metalcpp.py")
  tree = CACHE / f"pymetal-cpp-{PYMETAL_CPP_VERSION}" / "metal-cpp"
  marker = tree / ".sdist-sha256"
  if not marker.exists() or marker.read_text() != PYMETAL_CPP_SDIST_SHA256:
    tree.parent.mkdir(exist_ok=True)
    _extract(sdist, tree)
  return tree


@pytest.fixture(scope="module")
def metalcpp() -> Path:
  return get_metalcpp()


# ---- reading metal-cpp ---------------------------------------------------------------------------------------------------

def metalcpp_declarations(tree: Path) -> dict[str, set[str]]:
  """Selectors, classes and extern "C" functions metal-cpp declares."""
  out = {"selectors": set(), "classes": set(), "functions": set()}
  for rel, ns in (("Metal/MTLHeaderBridge.hpp", "MTL"), ("Foundation/NSPrivate.hpp", "NS")):
    text = (tree / rel).read_text()
    body = re.sub(r"^\s*#\s*define\b.*$", "", text, flags=re.M)              # the macros' own definitions
    sels = re.findall(rf"\b_{ns}_PRIVATE_DEF_SEL\(\s*\w+\s*,\s*\"([^\"]+)\"\s*\)", body)
    assert len(sels) == body.count(f"_{ns}_PRIVATE_DEF_SEL(") and len(sels) > 100, \
      f"metal-cpp {rel}: read {len(sels)} of {body.count(f'_{ns}_PRIVATE_DEF_SEL(')} selector definitions; has the format changed?"
    out["selectors"] |= set(sels)
    out["classes"] |= set(re.findall(rf"\b_{ns}_PRIVATE_DEF_CLS\(\s*(\w+)\s*\)", body))
  out["constants"] = set()
  for h in (tree / "Metal").glob("*.hpp"):
    out["functions"] |= set(re.findall(r'^\s*extern\s+"C"\s+[^;(]*?\b(\w+)\s*\(', h.read_text(), flags=re.M))
    # _MTL_PRIVATE_DEF_CONST(NS::ErrorUserInfoKey, CommandBufferEncoderInfoErrorKey): the C symbol MTLCommandBufferEncoderInfoErrorKey
    out["constants"] |= {"MTL" + n for n in re.findall(r"\b_MTL_PRIVATE_DEF_(?:CONST|STR)\(\s*[\w:]+\s*,\s*(\w+)\s*\)", h.read_text())}
  return out


# Foundation/NSTypes.hpp's limits (64-bit), which a few metal-cpp enumerators use (MTL::DeviceLocationUnspecified).
_NS_LIMITS = {"UIntegerMax": 2**64 - 1, "IntegerMax": 2**63 - 1, "IntegerMin": -2**63}
_C_INT = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b")


def _eval(expr: str, names: dict[str, str], ns: str, seen=()) -> int:
  """An integer constant expression from a metal-cpp enum body: literals (C suffixes), + - * << >> | & ~ ( ), and the names
  of other enumerators in the same namespace."""
  def ev(n):
    if isinstance(n, ast.Expression): return ev(n.body)
    if isinstance(n, ast.Constant) and type(n.value) is int: return n.value
    if isinstance(n, ast.Name):
      if n.id in _NS_LIMITS and n.id not in names: return _NS_LIMITS[n.id]
      if n.id not in names or n.id in seen: raise ValueError(f"unknown name {n.id!r}")
      return _eval(names[n.id], names, ns, (*seen, n.id))
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd, ast.Invert)):
      v = ev(n.operand); return -v if isinstance(n.op, ast.USub) else v if isinstance(n.op, ast.UAdd) else ~v
    if isinstance(n, ast.BinOp):
      ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.LShift: int.__lshift__,
             ast.RShift: int.__rshift__, ast.BitOr: int.__or__, ast.BitAnd: int.__and__}
      if type(n.op) in ops: return ops[type(n.op)](ev(n.left), ev(n.right))
    raise ValueError(f"cannot evaluate {ast.dump(n)}")
  py = _C_INT.sub(lambda m: str(int(m.group(1), 0)), re.sub(r"\b(?:MTL|NS)::", "", expr))
  return ev(ast.parse(py.strip(), mode="eval"))


def metalcpp_enum_exprs(text: str, ns: str) -> dict[str, str]:
  """{enumerator: value expression} from the _<ns>_ENUM / _<ns>_OPTIONS bodies of one header (implicit values as prev + 1)."""
  out = {}
  for m in re.finditer(rf"\b_{ns}_(?:ENUM|OPTIONS)\s*\([^,()]+,\s*\w+\s*\)\s*\{{([^}}]*)\}}", text):
    prev = None
    for item in re.sub(r"//[^\n]*|/\*.*?\*/", "", m.group(1), flags=re.S).split(","):
      if not (item:=item.strip()): continue
      name, _, expr = (s.strip() for s in item.partition("="))
      out[name] = prev = expr if expr else ("0" if prev is None else f"({prev}) + 1")
  return out


def metalcpp_enums(tree: Path) -> dict[str, str]:
  """{'MTLCommandBufferStatusError': '5', 'NSUTF8StringEncoding': '4', ...}: metal-cpp's enumerators under their Objective-C
  names, with the value expression (evaluated by metalcpp_enum_value)."""
  out = {}
  for d, ns in (("Metal", "MTL"), ("Foundation", "NS")):
    for h in sorted((tree / d).glob("*.hpp")):
      out |= {ns + k: v for k, v in metalcpp_enum_exprs(h.read_text(), ns).items()}
  assert len(out) > 500, f"read only {len(out)} enumerators from metal-cpp: has the format changed?"
  return out


def metalcpp_enum_value(mc: dict[str, str], name: str) -> int:
  ns = "MTL" if name.startswith("MTL") else "NS"
  names = {k[len(ns):]: v for k, v in mc.items() if k.startswith(ns)}
  return _eval(mc[name], names, ns)


def _storage_mode_shift(mc: dict[str, str]) -> int:
  shifts = set()
  for k in mc:
    if k.startswith("MTLStorageMode") and (r:="MTLResourceStorageMode" + k[len("MTLStorageMode"):]) in mc:
      s, o = metalcpp_enum_value(mc, k), metalcpp_enum_value(mc, r)
      if s: shifts |= {sh for sh in range(64) if s << sh == o} or {-1}
  assert len(shifts) == 1 and -1 not in shifts, f"metal-cpp's StorageMode / ResourceStorageMode values imply shifts {shifts}"
  return shifts.pop()


# ---- the checks: each returns the problems it found, so the sanity tests can feed them wrong input ---------------------------

def check_declared(kind: str, used: set[str], declared: set[str], allowed: dict[str, str]) -> list[str]:
  """kind: selector, class or function."""
  lst = "NOT_IN_METALCPP_" + {"selector": "SELECTORS", "class": "CLASSES", "function": "FUNCTIONS"}[kind]
  problems = [f"{kind} {u!r} is used by runner.m but not declared in metal-cpp (misspelt? not Metal API? if it is real API "
              f"metal-cpp lacks, add it to {lst} with the reason)"
              for u in sorted(used - declared - set(allowed))]
  problems += [f"{lst} lists {a!r}, but metal-cpp declares it: remove the entry"
               for a in sorted(set(allowed) & declared)]
  problems += [f"{lst} lists {a!r}, which runner.m no longer uses: remove the entry"
               for a in sorted(set(allowed) - used)]
  return problems


def check_enums(stub_vals: dict[str, int], mc: dict[str, str], allowed: dict) -> list[str]:
  problems = []
  for name, v in sorted(stub_vals.items()):
    if name in mc:
      try: want = metalcpp_enum_value(mc, name)
      except (ValueError, SyntaxError) as e: problems.append(f"cannot evaluate metal-cpp's {name} = {mc[name]}: {e}"); continue
      if v != want: problems.append(f"{name} is {v} in tests/metal_stub but {want} in metal-cpp ({mc[name]})")
    elif name in allowed:
      if (derive:=allowed[name][1]) is not None and (want:=derive(mc)) != v:
        problems.append(f"{name} is {v} in tests/metal_stub but metal-cpp's values imply {want}")
    else:
      problems.append(f"{name} (tests/metal_stub) has no enumerator in metal-cpp (misspelt? newer than metal-cpp "
                      f"{PYMETAL_CPP_VERSION}'s copy? then add it to NOT_IN_METALCPP_ENUMS with the reason)")
  problems += [f"NOT_IN_METALCPP_ENUMS lists {a!r}, but metal-cpp declares it: remove the entry" for a in sorted(set(allowed) & set(mc))]
  problems += [f"NOT_IN_METALCPP_ENUMS lists {a!r}, which tests/metal_stub no longer declares: remove the entry"
               for a in sorted(set(allowed) - set(stub_vals))]
  return problems


@pytest.fixture(scope="module")
def runner_syms():
  return runner_symbols()


@pytest.fixture(scope="module")
def mc_decls(metalcpp):
  return metalcpp_declarations(metalcpp)


@pytest.fixture(scope="module")
def mc_enums(metalcpp):
  return metalcpp_enums(metalcpp)


def test_selectors_declared_in_metalcpp(runner_syms, mc_decls):
  problems = check_declared("selector", runner_syms["selectors"], mc_decls["selectors"], NOT_IN_METALCPP_SELECTORS)
  assert not problems, "\n".join(problems)


def test_classes_declared_in_metalcpp(runner_syms, mc_decls):
  assert runner_syms["classes"] >= {"MTLCompileOptions", "NSString"}, runner_syms["classes"]
  problems = check_declared("class", runner_syms["classes"], mc_decls["classes"], NOT_IN_METALCPP_CLASSES)
  assert not problems, "\n".join(problems)


def test_constants_declared_in_metalcpp(runner_syms, mc_decls):
  # the constants runner.m reads (MTLCommandBufferEncoderInfoErrorKey, a failed command buffer's userInfo key: issue 35 item 3)
  assert "MTLCommandBufferEncoderInfoErrorKey" in runner_syms["constants"], runner_syms["constants"]
  assert len(mc_decls["constants"]) > 10, "read few constants from metal-cpp: has _MTL_PRIVATE_DEF_CONST changed?"
  missing = sorted(runner_syms["constants"] - mc_decls["constants"])
  assert not missing, f"runner.m reads {missing}, which metal-cpp does not declare (misspelt? not Metal API?)"


def test_c_functions_declared_in_metalcpp(runner_syms, mc_decls):
  assert runner_syms["functions"] >= {"MTLCreateSystemDefaultDevice", "MTLCopyAllDevices"}, runner_syms["functions"]
  problems = check_declared("function", runner_syms["functions"], mc_decls["functions"], NOT_IN_METALCPP_FUNCTIONS)
  assert not problems, "\n".join(problems)


def test_enum_values_match_metalcpp(mc_enums):
  vals = stub_enum_values()
  assert {"MTLCommandBufferStatusError", "MTLGPUFamilyApple1", "MTLResourceStorageModeShared", "NSUTF8StringEncoding"} <= set(vals)
  problems = check_enums(vals, mc_enums, NOT_IN_METALCPP_ENUMS)
  assert not problems, "\n".join(problems)


# ---- d. the checks can fail ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,used,expect", [
  ("selector", "setBuffer:offset:index:", "'setBuffer:offset:index:' is used by runner.m but not declared"),  # Swift spelling
  ("selector", "computeEncoder", "'computeEncoder' is used by runner.m but not declared"),
  ("class", "MTLCompileOption", "'MTLCompileOption' is used by runner.m but not declared"),
  ("function", "MTLCreateDefaultDevice", "'MTLCreateDefaultDevice' is used by runner.m but not declared"),
])
def test_unknown_name_is_reported(runner_syms, mc_decls, kind, used, expect):
  key = {"selector": "selectors", "class": "classes", "function": "functions"}[kind]
  problems = check_declared(kind, runner_syms[key] | {used}, mc_decls[key], {})
  assert any(expect in p for p in problems), problems


@pytest.mark.parametrize("allowed,expect", [
  ({"commit": "x"}, "lists 'commit', but metal-cpp declares it"),                 # an entry metal-cpp has after all
  ({"frobnicate:": "x"}, "lists 'frobnicate:', which runner.m no longer uses"),    # a stale entry
])
def test_stale_allow_list_is_reported(runner_syms, mc_decls, allowed, expect):
  problems = check_declared("selector", runner_syms["selectors"], mc_decls["selectors"], NOT_IN_METALCPP_SELECTORS | allowed)
  assert any(expect in p for p in problems), problems


@pytest.mark.parametrize("old,new,expect", [
  ("MTLCommandBufferStatusError = 5", "MTLCommandBufferStatusError = 6", "MTLCommandBufferStatusError is 6 in tests/metal_stub but 5"),
  ("MTLGPUFamilyMac2 = 2002", "MTLGPUFamilyMac2 = 2001", "MTLGPUFamilyMac2 is 2001 in tests/metal_stub but 2002"),
  ("#define MTLResourceStorageModeShift 4", "#define MTLResourceStorageModeShift 5", "MTLResourceStorageModeShift is 5"),
  ("MTLStorageModeShared = 0", "MTLStorageModeShared = 1", "MTLResourceStorageModeShared is 16 in tests/metal_stub but 0"),
  ("MTLGPUFamilyApple9 = 1009", "MTLGPUFamilyApple9 = 1009,\n\tMTLGPUFamilyApple42 = 1042",
   "MTLGPUFamilyApple42 (tests/metal_stub) has no enumerator in metal-cpp"),
  ("NSUTF8StringEncoding = 4", "NSUTF8StringEncoding = 1 << 2 | 1", "NSUTF8StringEncoding is 5 in tests/metal_stub but 4"),
], ids=["status", "family", "shift", "derived-option", "unknown-name", "foundation-expr"])
def test_wrong_stub_value_is_reported(tmp_path, mc_enums, old, new, expect):
  stub = tmp_path / "metal_stub"
  shutil.copytree(STUB, stub)
  hits = [h for h in stub.rglob("*.h") if old in h.read_text()]
  assert len(hits) == 1, f"tests/metal_stub no longer contains {old!r} exactly once: update this test"
  hits[0].write_text(hits[0].read_text().replace(old, new))
  problems = check_enums(stub_enum_values(stub), mc_enums, NOT_IN_METALCPP_ENUMS)
  assert any(expect in p for p in problems), problems


@pytest.mark.parametrize("body,name,value", [
  ("LanguageVersion3_1 = 196609,\n    LanguageVersion4_0 = (4 << 16) + 0,", "LanguageVersion4_0", 262144),
  ("LanguageVersion2_1 = (2 << 16) + 1,", "LanguageVersion2_1", 131073),
  ("OptA = 1ULL << 40, OptB = OptA | 0x10, OptC,", "OptC", (1 << 40 | 16) + 1),
  ("ModeX = 0x000000FFULL, ModeY = (ModeX & ~0x0FUL),", "ModeY", 0xF0),
])
def test_metalcpp_expressions(body, name, value):
  # The metal-cpp side's reader and evaluator, on the expression forms metal-cpp uses (or may: LanguageVersion as (4 << 16) + 0).
  mc = {"MTL" + k: v for k, v in metalcpp_enum_exprs(f"_MTL_ENUM(NS::UInteger, T) {{\n    {body}\n}};", "MTL").items()}
  assert metalcpp_enum_value(mc, "MTL" + name) == value
