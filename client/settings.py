"""settings.py: the user's runner settings, read from the environment in one place and parsed once into a Settings value.

Environment (what python -m client run's --runner and --token-file set, and what ~/.metal_runner_config's names become, apply_names):
  METAL_RUNNER             the runners: HOST[:PORT][,HOST[:PORT]...] (port 6667 unless given), "auto" (DNS-SD, client/discovery.py),
                           or unset (a local runner, client/local_runner.py)
  METAL_RUNNER_TOKEN_FILE  file holding the shared token (arbitrary bytes, trailing \\r and \\n stripped), when no token= is given:
                           one for every runner, or one per address of METAL_RUNNER, comma-separated in the same order. Unset,
                           ~/.metal_runner_token if it exists (as ssh takes ~/.ssh/id_*); set and empty, no token at all. A file
                           that group or others can read is refused. A client that holds a token refuses a runner that does not
                           prove it holds the same (protocol.md, Authentication): one that asks for no token may be anyone
  METAL_RUNNER_PEER_VIA    ADDR=VIA[,...]: where the other runners reach the runner this host reaches at ADDR (client/graph.py)

They stay in the environment, and python -m client run writes its options there (apply_options), so that child processes see the same
runners. Which of its options it was given travels there too (RUN_OPTIONS): a message then names what its user typed, --runner or
--token-file, not the variable it set. from_env() parses the variables once per distinct value (tests change os.environ inside one
process); connection.py, discovery.py, graph.py, remote_metal.py, local_runner.py and run.py ask it instead of reading them.
"""
from __future__ import annotations
import functools, os, shlex
from dataclasses import dataclass
from .address import full_addr
from .config_file import CONFIG, DEFAULT_CONFIG, KEYS, Named, config_path, load   # importable from here too (settings.py held them)
from .errors import SettingsError, TokenFileError   # importable from here too

DEFAULT_TOKEN_FILE, DEFAULT_SETTING = "~/.metal_runner_token", "used when no token file is named"
CLIENT_RUN = "METAL_RUNNER_CLIENT_RUN"   # "1" for a program python -m client run started, and its children (client/run.py)
# python -m client run sets METAL_RUNNER and METAL_RUNNER_TOKEN_FILE from its options and lists here those it was given: a message then
# names the option its user typed, not the variable
RUN_OPTIONS = "METAL_RUNNER_CLIENT_RUN_OPTIONS"
OPTIONS = {"METAL_RUNNER": "--runner", "METAL_RUNNER_TOKEN_FILE": "--token-file"}   # the variable each option sets
ENV = ("METAL_RUNNER", "METAL_RUNNER_TOKEN_FILE", "METAL_RUNNER_PEER_VIA", RUN_OPTIONS, CLIENT_RUN)   # what a Settings is parsed from

@dataclass(frozen=True)
class Settings:
  runner_var: str                   # METAL_RUNNER as set, stripped ("": unset), for messages
  runners: tuple[str, ...]          # its addresses, each with its port; () for "auto" or none
  auto: bool                        # METAL_RUNNER=auto: the runners are the advertised ones (client/discovery.py)
  token_var: str|None               # METAL_RUNNER_TOKEN_FILE as set (None: unset), for messages
  token_files: tuple[str, ...]      # its files, one for every runner or one per address ("" in the list: none); () when unset or empty
  peer_via: tuple[tuple[str, str], ...]   # METAL_RUNNER_PEER_VIA's (ADDR, VIA) pairs
  options_given: frozenset[str]     # python -m client run's options its user gave ("--runner", "--token-file", ...)
  client_run: bool                  # in a program python -m client run started (or a child of one)

  def setting(self, var:str) -> str:
    """The name of var as the user gave it: python -m client run's option that set it (--runner, --token-file), else var itself."""
    opt = OPTIONS.get(var)
    return opt if opt is not None and opt in self.options_given else var

  def named(self, var:str, value:str) -> str:
    """var and its value as the user gave them, for a message: "--runner a:6667" or "METAL_RUNNER=a:6667"."""
    return f"{name} {value}" if (name := self.setting(var)) != var else f"{var}={value}"

  def give(self, var:str, value:str) -> str:
    """How a message tells its user to give var: "pass --token-file FILE" in python -m client run, else "set METAL_RUNNER_TOKEN_FILE=FILE"."""
    return f"pass {OPTIONS[var]} {value}" if self.client_run and var in OPTIONS else f"set {var}={value}"

  def token_file(self, addr:str|None=None) -> tuple[str, str]|None:
    """The token file for the runner at addr, and the setting that named it (for messages), or None: METAL_RUNNER_TOKEN_FILE (one file
    for every runner, or one per address of METAL_RUNNER, comma-separated in the same order); unset, ~/.metal_runner_token if it exists;
    set and empty, none. TokenFileError when the files do not match the runners."""
    if (v := self.token_var) is None:   # looked for at each use: the file may come and go, HOME may change
      return (path, DEFAULT_SETTING) if os.path.lexists(path := os.path.expanduser(DEFAULT_TOKEN_FILE)) else None
    if not (files := self.token_files): return None
    name = self.setting("METAL_RUNNER_TOKEN_FILE")
    if len(files) == 1: return files[0], name
    runners, addrs = self.runner_var, self.runners
    if len(addrs) != len(files):
      raise TokenFileError(v, name, "", f"{self.named('METAL_RUNNER_TOKEN_FILE', v)} names {len(files)} token files, one per runner, but "
                           f"{self.named('METAL_RUNNER', runners) if runners else self.setting('METAL_RUNNER') + ' is not set and'} names "
                           f"{len(addrs) or 'no'} runner address{'es' if len(addrs) != 1 else ''}: give one file per address, in the same "
                           "order, or one file for all")
    if addr is None or (a := full_addr(addr)) not in addrs:
      raise TokenFileError(v, name, "", f"{self.named('METAL_RUNNER_TOKEN_FILE', v)} names one token file per runner of "
                           f"{self.named('METAL_RUNNER', runners)}, which does not list {addr}")
    return (f, name) if (f:=files[addrs.index(a)]) else None   # "" in the list: none for that runner (apply_names writes it)

@functools.lru_cache(maxsize=16)
def _parse(runner:str|None, token:str|None, via:str|None, options:str|None, client_run:str|None) -> Settings:
  r = (runner or "").strip()
  auto = r.lower() == "auto"
  return Settings(r, () if auto else tuple(full_addr(a.strip()) for a in r.split(",") if a.strip()), auto,
                  token, tuple(f.strip() for f in token.split(",")) if token is not None and token.strip() else (),
                  tuple((a, b) for a, _, b in (p.partition("=") for p in (via or "").split(",") if "=" in p)),
                  frozenset((options or "").split()), client_run == "1")

def from_env(environ=None) -> Settings:
  """The settings in environ (default os.environ), parsed once for each distinct value of the variables they come from (ENV)."""
  env = os.environ if environ is None else environ
  return _parse(*(env.get(k) for k in ENV))

# the settings of os.environ now, for callers that ask for one thing (connection.py offers these under the same names, as before)
def setting(var:str) -> str: return from_env().setting(var)
def named(var:str, value:str) -> str: return from_env().named(var, value)
def token_file(addr:str|None=None) -> tuple[str, str]|None: return from_env().token_file(addr)

def _private(st:os.stat_result, path:str, setting:str):
  """A token file others may read is refused, as ssh refuses such a key, and as the runner does (daemon/main.c): one of ours must be
  closed to group and others, another owner's (a service's, root's and readable by its group) to others."""
  mode = st.st_mode & 0o7777
  if st.st_uid == os.getuid() and mode & 0o077:
    raise TokenFileError(path, setting, f"is open to group or others (mode {mode:04o}), as a secret must not be: chmod 600 {shlex.quote(path)}")
  if mode & 0o007:
    raise TokenFileError(path, setting, f"is open to others (mode {mode:04o}), as a secret must not be: chmod o-rwx {shlex.quote(path)}")

def read_token(path:str, setting:str="METAL_RUNNER_TOKEN_FILE") -> bytes:
  """The token in the file at path, which setting named (for the message of a TokenFileError)."""
  try:
    with open(path, "rb") as f:
      _private(os.fstat(f.fileno()), path, setting)
      tok = f.read()
  except OSError as e: raise TokenFileError(path, setting, f"cannot be read: {e.strerror}") from None
  tok = tok.rstrip(b"\r\n")  # as the runner reads it
  if not tok: raise TokenFileError(path, setting, "is empty: it must hold the runner's token (the file its --token-file names)")
  return tok

def held_token(token:bytes|str|None, source:str|None=None, addr:str|None=None, s:Settings|None=None) -> tuple[bytes|None, str|None]:
  """The token a client holds for the runner at addr and where it came from, for messages: token= as given (source: how its user gave
  it, e.g. "--token-file F"), else the file the settings s (default: from_env()) name, else none."""
  if token is not None: return (token.encode() if isinstance(token, str) else bytes(token)), source or "token="
  if (tf := (s := s or from_env()).token_file(addr)) is None: return None, None
  path, name = tf
  return read_token(path, name), (f"{path} ({name})" if name == DEFAULT_SETTING else s.named("METAL_RUNNER_TOKEN_FILE", path))

# *** writing them: each for the program and its children, before anything connects

def apply_options(opts:dict[str, str], environ=os.environ):
  """python -m client run's options (client/run.py) into environ: --runner as METAL_RUNNER, --token-file as METAL_RUNNER_TOKEN_FILE (each
  file absolute: a child may start in another directory), and which options were given (RUN_OPTIONS), for messages."""
  if "--runner" in opts: environ["METAL_RUNNER"] = opts["--runner"]
  if "--token-file" in opts:
    environ["METAL_RUNNER_TOKEN_FILE"] = ",".join(os.path.abspath(os.path.expanduser(f.strip())) for f in opts["--token-file"].split(","))
  environ[RUN_OPTIONS] = " ".join(opts)

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
    default = p if os.path.lexists(p:=os.path.expanduser(DEFAULT_TOKEN_FILE)) else ""
    environ["METAL_RUNNER_TOKEN_FILE"] = ",".join((byname[a].token_file or default) if a in byname else default for a in items)
  via = [f"{addr}={full_addr(byname[a].peer_via)}" for a, addr in zip(items, addrs) if a in byname and byname[a].peer_via]
  if via: environ["METAL_RUNNER_PEER_VIA"] = ",".join(filter(None, [environ.get("METAL_RUNNER_PEER_VIA", ""), *via]))
