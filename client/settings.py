"""settings.py: runners by name in the environment. The names of ~/.metal_runner_config (client/config_file.py reads it) are turned into
addresses once, in the environment (METAL_RUNNER, METAL_RUNNER_TOKEN_FILE, METAL_RUNNER_PEER_VIA), before anything connects, so that
child processes see the same runners.
"""
from __future__ import annotations
import os
from .address import full_addr
from .config_file import CONFIG, DEFAULT_CONFIG, KEYS, Named, config_path, load   # importable from here too (settings.py held them)
from .errors import SettingsError   # importable from here too

def apply_names(environ=os.environ):
  """METAL_RUNNER's names (of ~/.metal_runner_config, client/config_file.py) become their addresses in environ; the token files and peer
  addresses the file gives them join METAL_RUNNER_TOKEN_FILE (unless token files were named already) and METAL_RUNNER_PEER_VIA. Nothing
  changes without a name of the file in METAL_RUNNER. SettingsError as load()."""
  items = [a.strip() for a in environ.get("METAL_RUNNER", "").split(",") if a.strip()]
  if not items or items == ["auto"] or not (byname:=load()) or not any(a in byname for a in items): return
  addrs = [full_addr(byname[a].address if a in byname else a) for a in items]
  environ["METAL_RUNNER"] = ",".join(addrs)
  if environ.get("METAL_RUNNER_TOKEN_FILE") is None and any(byname[a].token_file for a in items if a in byname):
    # one file per runner, in order; "" for none (a runner of the list the file names without one, or an address: the default, if any)
    default = p if os.path.lexists(p:=os.path.expanduser("~/.metal_runner_token")) else ""
    environ["METAL_RUNNER_TOKEN_FILE"] = ",".join((byname[a].token_file or default) if a in byname else default for a in items)
  via = [f"{addr}={full_addr(byname[a].peer_via)}" for a, addr in zip(items, addrs) if a in byname and byname[a].peer_via]
  if via: environ["METAL_RUNNER_PEER_VIA"] = ",".join(filter(None, [environ.get("METAL_RUNNER_PEER_VIA", ""), *via]))
