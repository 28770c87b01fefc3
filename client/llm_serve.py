"""tinygrad.llm's OpenAI-compatible server (tinygrad/llm/serve.py) over several runners, when one of them is lost (stopped, killed, its
machine gone) while it serves: the answer being streamed ends with an error event that names the runner (the `openai` client raises it
as an APIError), an answer not streamed gets HTTP 503 with that text, and so does every later request, while the server stays up. Without
this, tinygrad's handler died with the runner's exception: a stream ended as if complete, and the next request got no answer at all.
The model is not placed again on the runners that remain (docs/multi-runner.md, A model across runners): the server must be restarted.
client/placement.py's across_runners() installs it; with one runner nothing here is imported.
"""
from __future__ import annotations
import json, sys
from client.connection import RunnerError

def error_body(e:RunnerError) -> dict:
  return {"error": {"message": f"metal_runner: {e}; the model is not served until the server is started again", "type": "runner_unavailable",
                    "code": 503}}

def report_runner_faults():
  from tinygrad.llm import serve
  H = serve.Handler
  if getattr(H, "reports_runner_faults", False): return
  stream_json, do_post = H.stream_json, H.do_POST
  def lost(self, e:RunnerError):
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
    if (e:=getattr(self.server, "runner_fault", None)) is not None:
      self.rfile.read(int(self.headers.get("Content-Length", "0")))
      return self.send_data(json.dumps(error_body(e)).encode(), status_code=503)
    try: do_post(self)
    except RunnerError as e:
      lost(self, e)
      if not getattr(self, "streaming", False): self.send_data(json.dumps(error_body(e)).encode(), status_code=503)
  H.stream_json, H.do_POST, H.reports_runner_faults = guarded_stream, guarded_post, True
