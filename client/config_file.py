"""config_file.py: runners by name, as ssh names hosts. ~/.metal_runner_config (METAL_RUNNER_CONFIG names another file) gives each runner a
name, its address, its token file and the address other runners reach it at; `--runner studio1,studio2` (or METAL_RUNNER) then names them:

  # ~/.metal_runner_config
  runner studio1
    address studio1.local          # HOST[:PORT], port 6667 unless given
    token-file ~/.studio1.token    # as --token-file, for this runner only
  runner studio2
    address 192.168.1.20:7000
    peer-via 10.0.0.2:7000         # where the other runners reach it (METAL_RUNNER_PEER_VIA)

A name that is not in the file is an address, as before: names and addresses mix in one list. The file is refused when another user owns
it or others may write it (a line of it decides where tokens go and whom this host trusts), as ssh refuses such a config. This module
reads the file; client/settings.py (apply_names) turns the names into addresses once, in the environment (METAL_RUNNER,
METAL_RUNNER_TOKEN_FILE, METAL_RUNNER_PEER_VIA), before anything connects, so that child processes see the same runners.
"""
from __future__ import annotations
import os, shlex
from dataclasses import dataclass
from .errors import SettingsError

CONFIG, DEFAULT_CONFIG = "METAL_RUNNER_CONFIG", "~/.metal_runner_config"
KEYS = ("address", "token-file", "peer-via")

@dataclass
class Named:
  name: str
  address: str|None = None
  token_file: str|None = None
  peer_via: str|None = None

def config_path() -> str: return os.path.expanduser(os.environ.get(CONFIG) or DEFAULT_CONFIG)

def load(path:str|None=None) -> dict[str, Named]:
  """The runners the file names ({} when there is no file). SettingsError for a file others may write, or a line it cannot read."""
  path = path or config_path()
  try: f = open(path, encoding="utf-8")
  except FileNotFoundError: return {}
  except OSError as e: raise SettingsError(f"{path}: {e.strerror}") from None
  with f:
    st = os.fstat(f.fileno())
    if st.st_uid != os.getuid() and st.st_uid != 0:
      raise SettingsError(f"{path} belongs to another user (uid {st.st_uid}): it decides where tokens go, so only yours is read")
    if st.st_mode & 0o022:
      raise SettingsError(f"{path} may be written by others (mode {st.st_mode & 0o7777:04o}): chmod go-w {shlex.quote(path)}")
    runners: dict[str, Named] = {}
    cur: Named|None = None
    for n, line in enumerate(f, 1):
      words = shlex.split(line, comments=True)
      if not words: continue
      key, args = words[0].lower(), words[1:]
      if len(args) != 1: raise SettingsError(f"{path}:{n}: '{key}' takes one value, as in 'runner studio1' or 'address studio1.local'")
      if key == "runner":
        if "," in args[0] or ":" in args[0]: raise SettingsError(f"{path}:{n}: a runner's name has no comma or colon: {args[0]!r}")
        runners[args[0]] = cur = Named(args[0])
      elif key in KEYS:
        if cur is None: raise SettingsError(f"{path}:{n}: '{key}' before any 'runner NAME' line")
        setattr(cur, key.replace("-", "_"), os.path.expanduser(args[0]) if key == "token-file" else args[0])
      else: raise SettingsError(f"{path}:{n}: unknown setting {key!r} (a runner has {', '.join(KEYS)})")
  for r in runners.values():
    if r.address is None: raise SettingsError(f"{path}: runner {r.name} has no 'address HOST[:PORT]'")
  return runners
