"""tinygrad.llm's OpenAI-compatible server (tinygrad/llm/serve.py) over several runners, when one of them is lost (stopped, killed, its
machine gone) while it serves: the answer being streamed ends with an error event that names the runner (the `openai` client raises it
as an APIError), an answer not streamed gets HTTP 503 with that text, and the server stays up. The next request places the model again
over the runners that still answer (client/placement.py place_again: the old model let go, the file read again) and is answered by them;
where they cannot hold it, it and every later request get HTTP 503 naming the runner lost, what each runner left offers and what is
needed. Without this, tinygrad's handler died with the runner's exception: a stream ended as if complete, and the next request got no
answer at all. A runner lost is watched for (client/rejoin.py): once it answers again, the next request places the model again over
every runner named that answers, that one as a new device, and so ends the 503s of runners that could not hold the model alone.
Any other error in the middle of the model's work (a MemoryError of an allocation, tinygrad's own) ends the request the same way,
with that error, and the next request places the model again: the model's state after it (KV caches written half way, a JIT half
captured) cannot be trusted. Without this the handler died with it: the connection dropped with no answer, or a stream ended as if
complete, and the openai client, which sends a request again when its connection drops, was answered by the model as the error left it.
A request that fails before the model runs (its body not JSON, a field missing) gets HTTP 400 naming the error.
client/placement.py's across_runners() installs it, and placement_tp.py's across_runners_tp(), whose place_again_tp() places the model
tensor parallel again where the runners that answer allow it, else by layers; with one runner nothing here is imported.
"""
from __future__ import annotations
import json, sys, traceback
from client.errors import RunnerError, RunnerUnavailable

class ModelFailed(RuntimeError):
  """An error other than a runner's in the middle of the model's work, or of placing it again."""
  def __init__(self, e:BaseException):
    super().__init__(f"metal_runner: the model failed in the middle of a request ({type(e).__name__}: {e}); the next request places it again")

def error_body(e:Exception) -> dict:
  if isinstance(e, ModelFailed): return {"error": {"message": str(e), "type": "model_failed", "code": 503}}
  text = str(e) if str(e).startswith("metal_runner: ") else f"metal_runner: {e}"
  return {"error": {"message": f"{text}; the model is not served until the runners can hold it", "type": "runner_unavailable", "code": 503}}

def model_failed(e:Exception) -> RuntimeError:
  """e as the fault that has the next request place the model again: a runner's error (RunnerError), a placement refused (DoesNotFit,
  a RunnerUnavailable) as they are, any other as ModelFailed, its traceback on stderr (an error nobody expected)."""
  if isinstance(e, (RunnerError, RunnerUnavailable)): return e
  traceback.print_exception(e, file=sys.stderr)
  (f:=ModelFailed(e)).__cause__ = e
  return f

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
  stream_json, do_post, run_model = H.stream_json, H.do_POST, H.run_model
  def lost(self, e:Exception):
    if getattr(self.server, "runner_fault", None) is None: print(f"metal_runner: {e}" if isinstance(e, RunnerError) else e, file=sys.stderr)
    self.server.runner_fault = e
  def guarded_stream(self, source):
    def events():
      try: yield from source
      except Exception as e:   # a RunnerError, or any other error in the model's work: the request ends with it
        lost(self, e:=model_failed(e))
        yield error_body(e)   # an event with "error": the openai client raises APIError with its message
    self.streaming = True
    stream_json(self, events())
  def model_runs(self, *args, **kwargs):
    self.model_ran = True   # at the first token asked for: what fails from here on leaves the model as it was half way
    return (yield from run_model(self, *args, **kwargs))
  def guarded_post(self):
    e, rs = getattr(self.server, "runner_fault", None), runners(self.server)
    if rs is not None and (e is not None or rs.back):
      try:   # the model again, over the runners that answer (client/placement.py place_again)
        self.server.model = rs.place_again(lambda: let_go_of_model(self.server))
        self.server.runner_fault = e = None
      except Exception as e2: self.server.runner_fault = e = model_failed(e2)   # a RunnerError, DoesNotFit (what remains cannot hold it)
    if e is not None:
      self.rfile.read(int(self.headers.get("Content-Length", "0")))
      return self.send_data(json.dumps(error_body(e)).encode(), status_code=503)
    self.model_ran = self.streaming = False
    try: do_post(self)
    except Exception as e:
      if self.streaming: raise   # the stream said what the model's work raised: this is the connection's (a client gone)
      if not self.model_ran and not isinstance(e, RunnerError):
        return self.send_data(json.dumps({"error": {"message": f"metal_runner: the request failed before the model ran ({type(e).__name__}: "
                                                               f"{e})", "type": "invalid_request_error", "code": 400}}).encode(), status_code=400)
      lost(self, e:=model_failed(e))
      self.send_data(json.dumps(error_body(e)).encode(), status_code=503)
  H.stream_json, H.do_POST, H.run_model, H.reports_runner_faults = guarded_stream, guarded_post, model_runs, True
