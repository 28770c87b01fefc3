# tests/mac_report.py, the command a Mac owner runs to turn a first run into a report, run here as it runs on Linux: against the Metal
# emulator, with tinygrad's CPU device as the reference (--quick: small shapes, short timings; three Metal tests, one of them in the
# second pass). So the script cannot rot before a Mac ever runs it. The report's content is checked, not only its exit status.
import re, subprocess, sys
import numpy as np
import pytest
from conftest import ROOT, needs_own_metal_runner
import mac_report

# test_process_isolation_spawns skips in the first pass (its own runner); the graph run's misaligned offset is one refusal in the tests
SELECTION = "test_hello or test_int_matmul or test_process_isolation_spawns or test_offset_not_aligned_in_a_graph_run_is_einval"

def table(report:str, header:str) -> list[list[str]]:
  """The rows of the Markdown table whose header line starts with header, as cells (escaped pipes kept inside their cell)."""
  lines = report.splitlines()
  start = next(i for i, ln in enumerate(lines) if ln.startswith(header))
  rows = []
  for ln in lines[start + 2:]:
    if not ln.startswith("|"): break
    rows.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln)[1:-1]])
  return rows

@pytest.mark.metal
def test_report_on_linux(tmp_path):
  if sys.platform == "darwin": pytest.skip("on macOS the report runs against the GPU: run tests/mac_report.py itself, its report is the result")
  needs_own_metal_runner()
  out = tmp_path / "report.md"
  r = subprocess.run([sys.executable, str(ROOT / "tests" / "mac_report.py"), "--quick", "-k", SELECTION, "--out", str(out)], cwd=tmp_path,
                     capture_output=True, text=True, timeout=900)
  report = out.read_text() if out.exists() else ""
  assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-3000:]}\n{report[-6000:]}"
  for h in ("## Machine", "## Build", "## Metal tests", "## Computations", "## Figures (NOT GPU figures)", "## Runner log", "## Sending this back"):
    assert f"\n{h}\n" in report, f"no section {h!r}"
  assert "## This script failed" not in report
  # the warning, at the top, before anything else
  top = report.split("## Machine")[0]
  for w in ("**Not a Mac, not a GPU.**", "**Metal emulator**", "`daemon/metal_runner_emu`", "**tinygrad's CPU device**",
            "**No figure in this report is a GPU figure**", "within a tolerance, not bit for bit"):
    assert w in top, f"the warning lacks {w!r}"
  assert "Result: **Metal tests 4 passed, 0 failed; computations 9 of 9 within tolerance**" in top
  machine = {row[0]: row[1:] for row in table(report, "| | | where it came from |")}
  assert machine["GPU family"][0] == "Apple7" and "Rhello" in machine["GPU family"][1]
  assert machine["runner device"][0] == "Metal emulator (CPU, test harness)"
  assert machine["Metal source"][0] == "compiles on the runner: it offers source (CAP_METAL_SOURCE)", machine["Metal source"]
  # issue 26, items 1 and 5: the runner's macOS and language version (the emulator's default, 26.0), its memory, what was sent
  assert machine["runner macOS"][0] == "26.0.0, newest Metal language 4.0", machine["runner macOS"]
  assert machine["unified memory"][0] == "yes: buffers are Shared (CAP_UNIFIED)", machine["unified memory"]
  assert machine["programs sent"][0] == "Metal source, by a client on macOS (none: not a Mac)", machine["programs sent"]
  assert re.fullmatch(r"[0-9a-f]{12}( with local changes)?", machine["metal_runner commit"][0])
  assert machine["tinygrad, reference"][0].startswith("CPU:") and machine["tinygrad, runner"][0].startswith("METAL: MetalRenderer, arch Apple7")
  # the Metal tests: both passes, the second one for the test that starts its own runner
  assert "**4 passed, 0 failed** (of them, 1 in the second pass)." in report
  assert "MTL_DEBUG_LAYER=1 pytest -m metal" in report and "tests/test_metal_backend.py::test_process_isolation_spawns` (exit status 0" in report
  # every computation, within tolerance; the matmuls used simdgroup matrices on the runner (tensor cores: METAL only), none on the CPU
  rows = {row[0]: row for row in table(report, "| computation | what | result |")}
  assert list(rows) == [name for name, *_ in mac_report.CASES]
  for name, row in rows.items():
    assert row[2].startswith("within tolerance ("), f"{name}: {row[2]}"
    m = re.fullmatch(r"(\d+) \((\d+)\) / (\d+) \((\d+)\)", row[3])
    assert m and int(m[1]) > 0 and int(m[3]) > 0 and int(m[4]) == 0, f"{name}: kernels {row[3]}"
    if name.startswith("matmul"): assert int(m[2]) >= 1, f"{name}: no simdgroup-matrix kernel ran on the runner ({row[3]})"
  outputs = table(report, "| computation | output |")
  assert len(outputs) >= 50 and all(o[3] in ("yes", "no") for o in outputs)
  # every figure on both sides, with its unit, ratio and how it was measured
  figures = {row[0]: row[1:] for row in table(report, "| figure | local | runner |")}
  assert set(figures) == {"launch", "launch + 4-byte read", "launch + 4-byte read, p90", "copy in", "copy out", "MLP training steps", "LLM decode"}
  for name, (local, runner, ratio, how) in figures.items():
    assert re.fullmatch(r"[\d.,]+ (µs|GB/s|steps/s|tokens/s)", local) and re.fullmatch(r"[\d.,]+ (µs|GB/s|steps/s|tokens/s)", runner), name
    assert float(ratio) > 0 and len(how) > 20, name
  assert "**These figures say nothing about a GPU or Metal**" in report
  # the tests and computations ran on a runner under the validation layer, the figures on a second one without it
  assert re.search(r"Runner 1, `metal_runner_emu --backend metal` with MTL_DEBUG_LAYER=1 \(the tests and computations\): \d+ lines on "
                   r"stderr, 0 mentioning validation", report)
  assert re.search(r"Runner 2, `metal_runner_emu --backend metal` without MTL_DEBUG_LAYER \(the figures\): \d+ lines on stderr, 0 mentioning",
                   report)
  # the refusals the runner logged: the test's misaligned offset, none from tinygrad's kernels
  assert "**1 during the Metal tests** (some provoke them on purpose), **0 during the computations and figures**" in report
  # issue 35 item 2: the start of a session of the llm case's kernels, first and second, in both isolation modes
  starts = {row[0]: row[1:] for row in table(report, "| isolation | first session | second session |")}
  assert list(starts) == ["`--isolation thread`", "process (spawned, the default)"], starts
  for mode, cells in starts.items(): assert all(re.fullmatch(r"[\d.]+ ms", c) for c in cells), (mode, cells)
  m = re.search(r"A session of its own sends again the (\d+) Tloads \(Metal source\)", report)
  assert m and int(m[1]) >= 5, "the llm case's Tloads were not replayed"
  assert "nothing here is a Mac's figure" in report
  # issue 35 item 3: what reflection gave for tinygrad's kernels, from the runner's -v log
  m = re.search(r"\*\*(\d+) lines, (\d+) with a binding reported unused\.\*\*", report)
  assert m and int(m[1]) >= 1, "no reflection lines from the computations"
  assert re.search(r"metal: reflection of kernel \w+: \d+ buffer bindings: \[0\] \d+ B align \d+ (used|UNUSED)", report)
  first, second = re.search(r"METAL_RUNNER=(127\.0\.0\.1:\d+), the runner under MTL_DEBUG_LAYER=1", report), \
    re.search(r"through a second `daemon/metal_runner_emu` on (127\.0\.0\.1:\d+)", report)
  assert first and second and first[1] != second[1]

# *** the parts a Mac's run takes other paths through, checked on their own

def test_ulp_distance():
  one = np.array([1.0], np.float32)
  assert mac_report.compare(np.nextafter(one, np.float32(2)), one, 0, 0)["max_ulp"] == 1
  assert mac_report.compare(np.array([-0.0], np.float32), np.array([0.0], np.float32), 0, 0)["max_ulp"] == 0   # not bit-identical, 0 ULP
  tiny = np.array([np.finfo(np.float16).smallest_subnormal], np.float16)
  assert mac_report.compare(-tiny, tiny, 0, 0)["max_ulp"] == 2
  r = mac_report.compare(np.array([1.0, np.nan, 3.0], np.float32), np.array([1.0, 2.0, 3.0], np.float32), 1, 1)
  assert not r["identical"] and r["ndiff"] == 1 and r["nan_mismatch"] == 1 and not r["close"]
  r = mac_report.compare(np.array([5, 7], np.int32), np.array([5, 9], np.int32), 1, 1)   # integers must be equal, whatever the tolerance
  assert r["max_abs"] == 2 and not r["close"]
  assert mac_report.compare(np.float32(2.5).reshape(()), np.float32(2.5).reshape(()), 0, 0)["identical"]

def test_junit_to_node_ids(tmp_path):
  xml = tmp_path / "j.xml"
  xml.write_text('<testsuites><testsuite><testcase classname="tests.test_metal_backend" name="test_hello" time="0.1"/>'
                 '<testcase classname="tests.test_tinygrad_metal" name="test_matmul[1-1-1-float32]"><failure message="assert 1 == 2">'
                 'long traceback</failure></testcase><testcase classname="tests.test_metal_backend" name="test_process_isolation_spawns">'
                 f'<skipped type="pytest.skip" message="{mac_report.OWN_RUNNER_SKIP}"/></testcase></testsuite></testsuites>')
  cases = mac_report.junit(xml)
  assert [(c["id"], c["outcome"]) for c in cases] == [("tests/test_metal_backend.py::test_hello", "passed"),
                                                      ("tests/test_tinygrad_metal.py::test_matmul[1-1-1-float32]", "failed"),
                                                      ("tests/test_metal_backend.py::test_process_isolation_spawns", "skipped")]
  tests = {"first": {"cases": cases, "cmd": "pytest", "exit": 1, "seconds": 1, "output": ""}, "second": None}
  rep = mac_report.Report(None, [], {"ok": True}, None, tests, None, [])
  rep.tests_section()
  text = "\n".join(rep.lines)
  assert "**1 passed, 1 failed, 1 skipped**" in text and "### Failed" in text and "long traceback" in text and "assert 1 == 2" in text
  assert not mac_report.tests_ok(tests)

def test_mac_facts_missing_are_said(monkeypatch):
  # on a Mac without one of the tools, the report says so rather than failing (here none of them exists but sysctl, which has no hw.model)
  monkeypatch.setattr(mac_report, "MAC", True)
  facts = {what: (value, src) for what, value, src in mac_report.machine()}
  assert facts["Mac model"][1] == "`sysctl -n hw.model`" and facts["macOS"][1].startswith("`sw_vers")
  if sys.platform != "darwin": assert facts["Mac model"][0] == "(not available)" and facts["GPU"][0] == "(not available)"

def test_mac_differences_are_given_in_ulp(monkeypatch):
  monkeypatch.setattr(mac_report, "MAC", True)
  ref = np.linspace(1, 2, 8, dtype=np.float32)
  near = ref * np.float32(1.0000002)   # 1 or 2 ULP away
  outs = [{"name": "x", **mac_report.compare(ref, ref, 1e-5, 1e-5)}, {"name": "y", **mac_report.compare(near, ref, 1e-5, 1e-5)}]
  text = mac_report.Report(None, [], {"ok": True}, None, None, None, []).result({"outputs": outs, "rtol": 1e-5, "atol": 1e-5})
  assert text.startswith("**DIFFERS**: 1 of 2 outputs; largest difference ") and "ULP (`y`)" in text and ": yes" in text
  assert mac_report.Report(None, [], {"ok": True}, None, None, None, []).result({"outputs": outs[:1], "rtol": 0, "atol": 0}) == \
    "bit-identical (1 outputs)"
