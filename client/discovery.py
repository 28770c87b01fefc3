"""Runners advertised with DNS-SD (`metal_runner --advertise`, service type _metal-runner._tcp), for METAL_RUNNER=auto.

Browsing uses python-zeroconf, an optional dependency (pip install 'metal-runner-client[discovery]'): it is imported only when
discovery is asked for. The TXT record a runner publishes (daemon/advertise.h): txtvers=1, proto=1, backend=cpu|metal, auth=0|1.

Environment:
  METAL_RUNNER=auto                    the runners are the advertised ones, sorted by instance name; a device picks those whose backend
                                       it needs (REMOTE: cpu, METAL: metal), so REMOTE:1 is the second advertised CPU runner
  METAL_RUNNER_DISCOVER_TIMEOUT        seconds to listen for advertisements (default 2)
  METAL_RUNNER_DISCOVER_INTERFACES     comma-separated local addresses to browse on (default: all interfaces), e.g. 127.0.0.1
"""
from __future__ import annotations
import dataclasses, ipaddress, os, socket, threading, time
from .errors import RunnerUnavailable   # importable from here too
from .settings import Settings, from_env

SERVICE = "_metal-runner._tcp.local."
PROTO = 1  # client/protocol.py VERSION; a runner advertising another version is left out

@dataclasses.dataclass(frozen=True)
class Advertised:
  name: str                 # the instance name ("gpu box" of "gpu box._metal-runner._tcp.local.")
  addr: str                 # "host:port" for Runner(): the first address that accepts a connection (IPv4 first), else the first
  addrs: tuple[str, ...]    # every address the advertisement carries
  port: int
  backend: str|None         # "cpu", "metal", None if the TXT record does not say
  auth: bool|None           # the runner wants a token (METAL_RUNNER_TOKEN_FILE)
  proto: int|None

def _txt(props:dict, key:str) -> str|None:
  v = props.get(key.encode(), props.get(key))
  return v.decode("utf-8", "replace") if isinstance(v, bytes) else v

def from_info(info) -> Advertised|None:
  """An Advertised from a resolved zeroconf ServiceInfo, or None when it cannot be used (no address, no port)."""
  addrs = sorted(info.parsed_addresses(), key=lambda a: ipaddress.ip_address(a).version)   # IPv4 first, in the order given
  if not addrs or not info.port: return None
  props = info.properties or {}
  proto = _txt(props, "proto")
  a = addrs[0]
  return Advertised(info.name[:-len("." + SERVICE)] if info.name.endswith("." + SERVICE) else info.name,
                    f"[{a}]:{info.port}" if ":" in a else f"{a}:{info.port}", tuple(addrs), info.port, _txt(props, "backend"),
                    None if _txt(props, "auth") is None else _txt(props, "auth") == "1", int(proto) if proto and proto.isdigit() else None)

def reachable(a:Advertised, timeout:float=1.0) -> Advertised:
  """The same runner, its addr the first of its addresses that accepts a TCP connection. A runner bound to one address is advertised
  with all of its host's (avahi-daemon, mDNSResponder), so the first one need not be where it listens."""
  for x in a.addrs:
    try: socket.create_connection((x, a.port), timeout=timeout).close()
    except OSError: continue
    return dataclasses.replace(a, addr=f"[{x}]:{a.port}" if ":" in x else f"{x}:{a.port}")
  return a

def usable(found:list[Advertised], backend:str|None=None) -> list[Advertised]:
  """The runners a client can use, in a stable order: the right protocol (or unstated), the backend wanted (or unstated), by name."""
  ok = [a for a in found if a.proto in (None, PROTO) and (backend is None or a.backend in (None, backend))]
  return sorted(ok, key=lambda a: (a.name, a.addr))

def _zeroconf():
  try: import zeroconf
  except ImportError:
    raise RunnerUnavailable("metal_runner: METAL_RUNNER=auto (DNS-SD discovery) needs python-zeroconf: "
                            "pip install 'metal-runner-client[discovery]' (or pip install zeroconf)") from None
  return zeroconf

def discover(timeout:float|None=None, backend:str|None=None, interfaces:list[str]|None=None) -> list[Advertised]:
  """Listen for advertisements for timeout seconds and resolve them; the usable ones (usable()), possibly none."""
  zc_mod = _zeroconf()
  if timeout is None: timeout = float(os.environ.get("METAL_RUNNER_DISCOVER_TIMEOUT", 2))
  if interfaces is None and (v := os.environ.get("METAL_RUNNER_DISCOVER_INTERFACES")): interfaces = [x.strip() for x in v.split(",") if x.strip()]
  zc = zc_mod.Zeroconf(interfaces=interfaces or zc_mod.InterfaceChoice.All)
  names, lock = set(), threading.Lock()
  def on_change(zeroconf, service_type, name, state_change):
    with lock:
      if state_change is zc_mod.ServiceStateChange.Removed: names.discard(name)
      else: names.add(name)
  try:
    browser = zc_mod.ServiceBrowser(zc, SERVICE, handlers=[on_change])
    time.sleep(timeout)
    browser.cancel()
    with lock: todo = sorted(names)
    found = []
    for n in todo:
      info = zc_mod.ServiceInfo(SERVICE, n)
      if info.request(zc, int(max(timeout, 1) * 1000)) and (a := from_info(info)) is not None: found.append(a)
  finally: zc.close()
  return [reachable(a) for a in usable(found, backend)]

_auto: dict[str|None, list[str]] = {}   # backend -> addresses discovered for METAL_RUNNER=auto, once per process

def runner_addrs(backend:str|None=None, s:Settings|None=None) -> list[str]:
  """The runner addresses METAL_RUNNER names (in the settings s, default from_env()): host[:port][,host[:port]...] (port 6667 by
  default), "auto" (discovered on first use, for backend), or none (unset)."""
  if not (s := s or from_env()).auto: return list(s.runners)
  if backend in _auto: return _auto[backend]
  if not (found := discover(backend=backend)):
    raise RunnerUnavailable(f"metal_runner: {s.named('METAL_RUNNER', 'auto')}: no {backend + ' ' if backend else ''}runner advertised "
                            f"itself with DNS-SD (_metal-runner._tcp) within {os.environ.get('METAL_RUNNER_DISCOVER_TIMEOUT', 2)} s; start one "
                            "with --advertise")
  _auto[backend] = [a.addr for a in found]   # every device index sees the same list, without listening again
  return _auto[backend]
