"""`python -m tinygrad.llm ARGS` for the tests and bench/llm.py: with the stand-in for tinygrad.llm.kernels (client/llm_kernels.py; under
`client run` its site hook has installed it already) and --serve bound to 127.0.0.1, where tinygrad's server listens on every interface.
  DEV=CPU python tests/llm_app.py --model M.gguf --serve PORT              # tinygrad's own CPU device
  python -m client run --runner ADDR tests/llm_app.py --model M.gguf --serve PORT
"""
import pathlib, runpy, sys
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from client.llm_kernels import install  # noqa: E402
install()
import tinygrad.llm.serve as serve  # noqa: E402
bind = serve.LLMServer.__init__
serve.LLMServer.__init__ = lambda self, addr, *a: bind(self, ("127.0.0.1", addr[1]), *a)
runpy.run_module("tinygrad.llm", run_name="__main__", alter_sys=True)
