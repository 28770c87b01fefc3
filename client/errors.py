"""The client's errors, in one place for every module that raises or catches them.

RunnerError and its kinds are what a Runner raises (client/connection.py) about one runner: a request it rejected, a connection
that failed, what answered not being a runner, a token file that cannot be used, a linked runner lost. RunnerUnavailable is what a
tinygrad device or `python -m client run` raises when a runner it is told to use cannot be used; SettingsError, what a runners-by-name
file that cannot be used raises. connection.py, discovery.py and settings.py, where they were defined before, still offer them under
the same names.
"""
from __future__ import annotations
from . import protocol as P

class RunnerError(RuntimeError):
  """The runner rejected a request: .code (int), .code_name ("EHANDLE"), .text (the runner's message), .tag, .request
  (the failing request, e.g. "Tlaunch prog=3 (E_4_4)"), .addr, and .others: errors of later requests reported at the same time."""
  def __init__(self, addr:str, code:int, text:str, tag:int|None=None, request:str|None=None):
    self.addr, self.code, self.text, self.tag, self.request, self.others = addr, code, text, tag, request, []
    self.code_name = P.ERRORS.get(code, f"E{code}") if code else ""
    super().__init__(addr, code, text, tag, request)
  def reason(self) -> str:
    what = self.text if self.code != P.ECRASH else f"the runner session ended because a kernel crashed: {self.text}"
    s = f"{self.request or 'request'}" + (f" (tag {self.tag})" if self.tag is not None else "") + f" failed: {self.code_name}: {what}"
    if self.others: s += f" (and {len(self.others)} more: " + "; ".join(f"{e.request}: {e.code_name}" for e in self.others[:3]) + ")"
    return s
  def __str__(self): return f"runner {self.addr}: {self.reason()}"

class RunnerConnectionError(RunnerError, ConnectionError):
  """The runner is unreachable or the connection died; the Runner cannot be used any more."""
  def __init__(self, addr:str, text:str, request:str|None=None):
    super().__init__(addr, 0, text, None, request)
    self.args = (addr, text, request)
  def reason(self) -> str: return self.text + (f" (request in flight: {self.request})" if self.request else "")

class PeerLostError(RunnerError):
  """A link between runners broke because the runner at its other end stopped: .addr is that runner, .why what its connection did,
  .seen the EPEER error the runner that is left reported (its .addr the survivor). Code EPEER, as the error it stands for."""
  def __init__(self, addr:str, why:str, seen:RunnerError):
    super().__init__(addr, seen.code, seen.text, seen.tag, seen.request)
    self.why, self.seen, self.others = why, seen, seen.others
  def reason(self) -> str: return f"stopped ({self.why}) while runner {self.seen.addr} was linked to it: {self.seen.reason()}"
  def __str__(self): return f"runner {self.addr} {self.reason()}"

class NotARunnerError(RunnerConnectionError):
  """What answered at the address (or failed to) is not a metal_runner: str() says what it did, e.g.
  "HOST:PORT is not a metal_runner (it answered 'HTTP/1.0 400 Bad Request')"."""
  def __str__(self): return f"{self.addr} {self.text}"

class TokenFileError(RunnerError):
  """The token file cannot be used (missing, unreadable, empty, open to others), or the files named do not match the runners: raised
  before any connection, naming the file and the setting that named it. .path, .setting ("METAL_RUNNER_TOKEN_FILE", "--token-file")."""
  def __init__(self, path:str, setting:str, why:str, text:str|None=None):
    super().__init__(None, P.EAUTH, text or f"the token file {path} ({setting}) {why}")
    self.path, self.setting = path, setting
  def reason(self) -> str: return self.text
  def __str__(self): return self.text if self.addr is None else f"runner {self.addr}: {self.text}"

class RunnerUnavailable(RuntimeError):
  """A runner named by METAL_RUNNER (or `python -m client run --runner`) cannot be used: unreachable, refused the token, the wrong
  backend; or none was advertised for METAL_RUNNER=auto, or a local one could not be started. Its message is one line (but a local
  runner's build output) that names the runner, says why and what to check; client/remote_metal.py prints it alone when uncaught."""

class SettingsError(ValueError):
  """~/.metal_runner_config cannot be used (client/config_file.py): another user's, open to others' writes, or a line it cannot read.
  client/remote_metal.py raises it as RunnerUnavailable, `client probe` prints it."""
