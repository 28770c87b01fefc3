"""SIGHUP reads the token file again (daemon/main.c, the token swap in daemon/handshake.c): new sessions need the new token, the old
one is refused, a session already open carries on, and a token file that cannot be used at SIGHUP leaves the old token in force."""
import os, signal, time
import pytest
from client import protocol as P
from client.connection import Runner, RunnerError
from runner_proc import RunnerProc

pytestmark = pytest.mark.cpu_only
A, B = b"token A for the SIGHUP tests", b"token B, after the SIGHUP"

def hup(r:RunnerProc, expect:str):
  """SIGHUP the runner and wait for the log line that says what it did with it."""
  n = len(r.log)
  os.kill(r.proc.pid, signal.SIGHUP)
  deadline = time.monotonic() + 5
  while time.monotonic() < deadline:
    if any(expect in l for l in r.log[n:]): return next(l for l in r.log[n:] if expect in l)
    time.sleep(0.02)
  raise AssertionError(f"no log line with {expect!r} after SIGHUP: {r.log[n:]}")

def refused(addr:str, token:bytes) -> bool:
  try:
    with Runner(addr, token=token, connect_timeout=10) as c: c.ping()
  except RunnerError as e:
    assert e.code == P.EAUTH, e
    return True
  return False

@pytest.mark.parametrize("iso", ["process", "thread"])
def test_sighup_switches_new_sessions_to_the_new_token(tmp_path, iso):
  tf = tmp_path / "token"
  tf.write_bytes(A + b"\n")
  tf.chmod(0o600)   # the runner refuses a token others can read
  r = RunnerProc("--token-file", str(tf), "--isolation", iso, "-v")
  try:
    old = Runner(r.addr, token=A)       # a session open across the reload
    assert old.ping(b"x") == b"x"
    tf.write_bytes(B)
    hup(r, "token reloaded")
    assert refused(r.addr, A), "the old token still opens a session after SIGHUP"
    assert not refused(r.addr, B), "the new token is refused after SIGHUP"
    assert old.ping(b"still here") == b"still here"   # the open session is not touched
    old.close()
    # and back: a second reload replaces the replacement
    tf.write_bytes(A)
    hup(r, "token reloaded")
    assert not refused(r.addr, A) and r.alive()
  finally: r.stop()

@pytest.mark.parametrize("bad", ["missing", "empty", "newlines only", "readable by others"])
def test_sighup_with_an_unusable_token_file_keeps_the_token(tmp_path, bad):
  tf = tmp_path / "token"
  tf.write_bytes(A)
  tf.chmod(0o600)
  r = RunnerProc("--token-file", str(tf))
  try:
    if bad == "missing": tf.unlink()
    elif bad == "readable by others": tf.chmod(0o644)
    else: tf.write_bytes(b"" if bad == "empty" else b"\n\r\n")
    line = hup(r, "keeping the previous token")
    why = {"missing": "No such file", "readable by others": f"chmod 600 {tf}"}.get(bad, "empty")
    assert str(tf) in line and why in line, line
    assert r.alive()
    assert not refused(r.addr, A), "the token in force before the bad reload no longer works"
  finally: r.stop()

def test_sighup_without_a_token_file_changes_nothing():
  r = RunnerProc()
  try:
    hup(r, "nothing to reload")
    with Runner(r.addr) as c: assert c.ping(b"ok") == b"ok"
    assert r.alive()
  finally: r.stop()

def test_sighup_many_times_while_clients_authenticate(tmp_path):
  """Swaps racing with Tauth (thread isolation: sessions read the token under the lock the swap takes; process isolation: a fork
  never inherits that lock held). Every session must get in with the one token that the file holds throughout."""
  tf = tmp_path / "token"
  tf.write_bytes(A)
  tf.chmod(0o600)
  for iso in ("thread", "process"):
    r = RunnerProc("--token-file", str(tf), "--isolation", iso)
    try:
      for _ in range(30):
        os.kill(r.proc.pid, signal.SIGHUP)
        with Runner(r.addr, token=A) as c: assert c.ping(b"p") == b"p"
      assert r.alive()
    finally: r.stop()
