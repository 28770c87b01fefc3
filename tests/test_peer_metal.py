"""Copies between two Metal runners go runner to runner too (thread isolation: each session dials and receives itself). On Linux these
are two runners on the Metal emulator (tests/metal_emulator, a test harness): that shows the protocol and runner.m's shared buffers
receiving straight from the socket, not any GPU figure."""
import json, re
import pytest
from conftest import metal_runner_proc, needs_own_metal_runner, run_python
from test_peer import TO_SCRIPT

pytestmark = pytest.mark.metal

def test_metal_to_moves_no_tensor_bytes_through_the_client():
  needs_own_metal_runner()
  ra, rb = metal_runner_proc("-v"), metal_runner_proc("-v")
  try:
    r = run_python(TO_SCRIPT.replace("REMOTE", "METAL"), {"METAL_RUNNER": f"{ra.addr},{rb.addr}"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["equal"] and sum(out[k]["bytes_sent"] + out[k]["bytes_received"] for k in ("a", "b")) < 4096 < out["bytes"], out
    assert re.search(r"received 16777216 bytes from a peer", rb.log_text()), rb.log_text()
  finally:
    ra.stop(); rb.stop()
