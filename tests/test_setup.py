"""setup.sh ends by saying what to run next, except under test.sh, whose own output follows. make is replaced by a stub that does
nothing (the daemon is built by the suite itself): these tests check the script's last lines, not the build."""
import os, pathlib, subprocess
import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists(), reason="needs the .venv setup.sh makes")

def setup(tmp_path:pathlib.Path, *args:str, env:dict|None=None) -> list[str]:
  (stub := tmp_path / "make").write_text("#!/bin/sh\nexit 0\n")
  stub.chmod(0o755)
  e = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", **(env or {})}
  p = subprocess.run(["sh", str(ROOT / "setup.sh"), *args], capture_output=True, text=True, env=e, timeout=600)
  assert p.returncode == 0, p.stdout + p.stderr
  return p.stdout.splitlines()

def test_setup_ends_with_the_next_command(tmp_path):
  out = setup(tmp_path)
  assert out[-2] == "setup.sh: done. Next: .venv/bin/python examples/train_mlp.py (trains an MLP through a runner it starts)", out
  assert (ROOT / "examples" / "train_mlp.py").exists()

def test_setup_test_names_test_sh_but_not_under_test_sh(tmp_path):
  assert setup(tmp_path, "test")[-1] == "setup.sh: done. Next: ./test.sh (the whole suite, as CI runs it)"
  assert not any("Next" in l for l in setup(tmp_path, "test", env={"SETUP_FROM_TEST": "1"}))
  assert "SETUP_FROM_TEST=1 ./setup.sh test" in (ROOT / "test.sh").read_text()   # how test.sh keeps its output quiet
