"""llm_access.py: tinygrad.llm's OpenAI-compatible server (`--serve PORT`) under `metal-client run`, reachable only where the user says.

tinygrad 0.14's server listens on every interface, with no authentication, while it prints http://127.0.0.1:PORT: anyone on the network
could use the runners. Under `run` it listens on 127.0.0.1 unless --listen names another address, says where in one line, and with
--api-key-file answers only requests that carry that key as `Authorization: Bearer KEY` (what the openai client's api_key= sends); the
key file is refused when others may read it, as token files are (client/connection.py).
"""
from __future__ import annotations
import hmac, json, sys

LOOPBACK = ("127.0.0.1", "localhost")

def guard(listen:str="127.0.0.1", key:bytes|None=None):
  """Bind tinygrad.llm.serve's server to listen, and with key require it of every request. Before the app starts its server."""
  import tinygrad.llm.serve as serve
  start = serve.LLMServer.__init__
  def bound(self, addr, *args):
    start(self, (listen, addr[1]), *args)
    where = "this machine only" if listen in LOOPBACK or listen.startswith("127.") else "other machines too"
    print(f"metal-client: the server listens on http://{listen}:{self.server_address[1]}/v1 ({where}; --listen ADDR to change), "
          + ("requests need the API key (Authorization: Bearer)" if key else "no API key (--api-key-file F requires one)"),
          file=sys.stderr, flush=True)
  serve.LLMServer.__init__ = bound
  if key is None: return
  for name in ("do_GET", "do_POST"):
    def checked(self, _answer=getattr(serve.Handler, name)):
      got = self.headers.get("Authorization", "")
      if got.startswith("Bearer ") and hmac.compare_digest(got[7:].strip().encode(), key): return _answer(self)
      self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))   # the body, unread, would make the close a reset
      self.send_data(json.dumps({"error": {"message": "this server needs its API key: Authorization: Bearer KEY (the openai client's "
                                           "api_key=), the key in the file metal-client run --api-key-file names",
                                           "type": "invalid_request_error", "code": "invalid_api_key"}}).encode(), status_code=401)
    setattr(serve.Handler, name, checked)
