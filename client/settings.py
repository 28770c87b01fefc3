"""settings.py: runners by name, as ssh names hosts. ~/.metal_runner_config (METAL_RUNNER_CONFIG names another file) gives each runner a
name, its address, its token file and the address other runners reach it at; `--runner studio1,studio2` (or METAL_RUNNER) then names them:

  # ~/.metal_runner_config
  runner studio1
    address studio1.local          # HOST[:PORT], port 6667 unless given
    token-file ~/.studio1.token    # as --token-file, for this runner only
  runner studio2
    address 192.168.1.20:7000
    peer-via 10.0.0.2:7000         # where the other runners reach it (METAL_RUNNER_PEER_VIA)

A name that is not in the file is an address, as before: names and addresses mix in one list. The file is refused when another user owns
it or others may write it (a line of it decides where tokens go and whom this host trusts), as ssh refuses such a config. Names are
turned into addresses once, in the environment (METAL_RUNNER, METAL_RUNNER_TOKEN_FILE, METAL_RUNNER_PEER_VIA), before anything connects,
so that child processes see the same runners.
"""
from __future__ import annotations
import os, shlex
from dataclasses import dataclass
from .address import full_addr

CONFIG, DEFAULT_CONFIG = "METAL_RUNNER_CONFIG", "~/.metal_runner_config"
KEYS = ("address", "token-file", "peer-via")

class SettingsError(ValueError): pass

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

def apply_names(environ=os.environ):
  """METAL_RUNNER's names (of the file) become their addresses in environ; the token files and peer addresses the file gives them join
  METAL_RUNNER_TOKEN_FILE (unless token files were named already) and METAL_RUNNER_PEER_VIA. Nothing changes without a name of the
  file in METAL_RUNNER. SettingsError as load()."""
  items = [a.strip() for a in environ.get("METAL_RUNNER", "").split(",") if a.strip()]
  if not items or items == ["auto"] or not (named:=load()) or not any(a in named for a in items): return
  addrs = [full_addr(named[a].address if a in named else a) for a in items]
  environ["METAL_RUNNER"] = ",".join(addrs)
  if environ.get("METAL_RUNNER_TOKEN_FILE") is None and any(named[a].token_file for a in items if a in named):
    # one file per runner, in order; "" for none (a runner of the list the file names without one, or an address: the default, if any)
    default = p if os.path.lexists(p:=os.path.expanduser("~/.metal_runner_token")) else ""
    environ["METAL_RUNNER_TOKEN_FILE"] = ",".join((named[a].token_file or default) if a in named else default for a in items)
  via = [f"{addr}={full_addr(named[a].peer_via)}" for a, addr in zip(items, addrs) if a in named and named[a].peer_via]
  if via: environ["METAL_RUNNER_PEER_VIA"] = ",".join(filter(None, [environ.get("METAL_RUNNER_PEER_VIA", ""), *via]))
