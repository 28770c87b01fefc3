"""A stand-in for tinygrad.llm.kernels.amd where it is missing: tinygrad 0.14.0's wheel lacks tinygrad/llm/kernels/, which
tinygrad/llm/model.py imports, so `python -m tinygrad.llm` does not start (bench/upstream/llm_kernels.md).

install() adds an import finder at the end of sys.meta_path: it is asked only after every real finder failed, so it stands in only
while the real module cannot be imported and steps aside once tinygrad ships it. What it stands in is what the real module means off
AMD GPUs (tinygrad/llm/kernels/amd.py upstream): Linear is nn.Linear (the real one falls back to it unless the device is an RDNA3 GPU
and the weights are K-quants), amd_custom_kernels_supported is False, so model.py never calls gated_delta_prefill or flash_attention.

`python -m client.llm_kernels ARGS` is `python -m tinygrad.llm ARGS` with the stand-in, on tinygrad's own devices (no runner).
"""
from __future__ import annotations
import importlib.abc, importlib.machinery, os, runpy, sys, types

NAMES = ("tinygrad.llm.kernels", "tinygrad.llm.kernels.amd")
SAID = "METAL_RUNNER_LLM_KERNELS_SAID"   # inherited by children: the DEBUG line is said once per run, not once per process

def not_here(name:str):
  def f(*args, **kwargs): raise NotImplementedError(f"{name}: the AMD kernels are not in this tinygrad (client/llm_kernels.py stands in)")
  return f

def fill(mod:types.ModuleType):
  from tinygrad import nn
  from tinygrad.helpers import DEBUG
  class Linear(nn.Linear):
    ggml_type: int|None = None
    def __init__(self, in_features:int, out_features:int, bias=True):
      super().__init__(in_features, out_features, bias)
      self.in_features, self.out_features = in_features, out_features
  Linear.__module__ = mod.__name__
  mod.Linear, mod.amd_custom_kernels_supported = Linear, lambda device: False
  mod.gated_delta_prefill, mod.flash_attention = not_here("gated_delta_prefill"), not_here("flash_attention")
  if DEBUG >= 1 and not os.environ.get(SAID):
    os.environ[SAID] = "1"
    print("tinygrad.llm.kernels.amd is missing from this tinygrad: client/llm_kernels.py stands in (nn.Linear, no AMD kernels)", file=sys.stderr)

class StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  def find_spec(self, name, path=None, target=None):
    if name not in NAMES: return None
    return importlib.machinery.ModuleSpec(name, self, is_package=name == NAMES[0])
  def create_module(self, spec): return None
  def exec_module(self, mod):
    if mod.__name__ == NAMES[0]: mod.__path__ = []   # a package, so that .amd is looked up (and found here once the real finders fail)
    else: fill(mod)

def install():
  """Stand in for tinygrad.llm.kernels.amd wherever it cannot be imported; a no-op once the real module exists, and when done twice."""
  if not any(isinstance(f, StandIn) for f in sys.meta_path): sys.meta_path.append(StandIn())

if __name__ == "__main__":
  install()
  runpy.run_module("tinygrad.llm", run_name="__main__", alter_sys=True)
