"""tinygrad.llm's OpenAI-compatible server (tinygrad/llm/serve.py) over several runners, when one of them is lost (stopped, killed, its
machine gone) while it serves: the answer being streamed ends with an error event that names the runner (the `openai` client raises it
as an APIError), an answer not streamed gets HTTP 503 with that text, and the server stays up. The next request places the model again
over the runners that still answer (client/placement.py place_again: the old model let go, the file read again) and is answered by them;
where they cannot hold it, it and every later request get HTTP 503 naming the runner lost, what each runner left offers and what is
needed. Without this, tinygrad's handler died with the runner's exception: a stream ended as if complete, and the next request got no
answer at all. A runner lost is watched for (client/rejoin.py): once it answers again, the next request places the model again over
every runner named that answers, that one as a new device, and so ends the 503s of runners that could not hold the model alone.
client/placement.py's across_runners() installs it, and placement_tp.py's across_runners_tp(), whose place_again_tp() places the model
tensor parallel again where the runners that answer allow it, else by layers; with one runner nothing here is imported.
"""
from __future__ import annotations
import json, sys
from client.connection import RunnerError

def error_body(e:Exception) -> dict:
  text = str(e) if str(e).startswith("metal_runner: ") else f"metal_runner: {e}"
  return {"error": {"message": f"{text}; the model is not served until the runners can hold it", "type": "runner_unavailable", "code": 503}}

def runners(server):
  """The runners the model was placed over (client/rejoin.py Runners), kept by the server from its first model: a placement that failed
  half way leaves it none."""
  if not hasattr(server, "runners"): server.runners = getattr(server.model, "runners", None)
  return server.runners

def let_go_of_model(server):
  """The server's model let go, its attributes too (its blocks, embedding, head, KV caches and JITs): tinygrad.llm's main() keeps the
  model it loaded in a local of its own while it serves (cli.py: `model, kv = Transformer.from_gguf(...)`, then `LLMServer(..., model,
  ...).serve_forever()`), so the first model's buffers stayed on the runners beside the one placed again, and a runner with room for
  one model only (--session-mem) ran out of memory in the request after it."""
  if (m:=getattr(server, "model", None)) is not None: vars(m).clear()
  server.model = None

def report_runner_faults():
  from tinygrad.llm import serve
  H = serve.Handler
  if getattr(H, "reports_runner_faults", False): return
  stream_json, do_post = H.stream_json, H.do_POST
  def lost(self, e:Exception):
    if getattr(self.server, "runner_fault", None) is None: print(f"metal_runner: {e}", file=sys.stderr)
    self.server.runner_fault = e
  def guarded_stream(self, source):
    def events():
      try: yield from source
      except RunnerError as e:
        lost(self, e)
        yield error_body(e)   # an event with "error": the openai client raises APIError with its message
    self.streaming = True
    stream_json(self, events())
  def guarded_post(self):
    e, rs = getattr(self.server, "runner_fault", None), runners(self.server)
    if rs is not None and (e is not None or rs.back):
      try:   # the model again, over the runners that answer (client/placement.py place_again)
        self.server.model = rs.place_again(lambda: let_go_of_model(self.server))
        self.server.runner_fault = e = None
      except RuntimeError as e2: self.server.runner_fault = e = e2   # a RunnerError, or DoesNotFit: what remains cannot hold it
    if e is not None:
      self.rfile.read(int(self.headers.get("Content-Length", "0")))
      return self.send_data(json.dumps(error_body(e)).encode(), status_code=503)
    try: do_post(self)
    except RunnerError as e:
      lost(self, e)
      if not getattr(self, "streaming", False): self.send_data(json.dumps(error_body(e)).encode(), status_code=503)
  H.stream_json, H.do_POST, H.reports_runner_faults = guarded_stream, guarded_post, True
