"""Runner addresses as the user writes them: HOST[:PORT], [IPv6][:PORT], the port 6667 unless given.

Every module that takes an address from the user (the devices, `client run`, probe, discovery, the settings file) parses it here, so
that a typing mistake gets the same message everywhere and messages show an address the same way (full_addr).
"""
from __future__ import annotations
import ipaddress

DEFAULT_PORT = 6667   # the runner's (daemon/main.c)

def parse_addr(addr:str) -> tuple[str, int]:
  """(host, port) of "HOST:PORT", "[IPv6]:PORT", or HOST (or [IPv6]) alone at DEFAULT_PORT. A ValueError names what was typed, what
  is wrong with it and what is expected."""
  def bad(why:str): return ValueError(f"runner address {addr!r} is not HOST:PORT ({why}; e.g. mac.local:6667, or mac.local for port 6667)")
  if "://" in addr: raise bad(f"a URL: the runner speaks its own protocol, not {addr.split('://')[0]}; give {addr.split('://', 1)[1].strip('/')}")
  if addr.startswith("["):
    host, sep, rest = addr[1:].partition("]")
    if not sep or rest and not rest.startswith(":"): raise bad("text after the IPv6 address's ]" if sep else "no ] after the IPv6 address")
    port = rest[1:] if rest else str(DEFAULT_PORT)
  elif addr.count(":") > 1:
    try: ipaddress.IPv6Address(addr.split("%")[0])
    except ValueError: raise bad("more than one colon") from None
    raise ValueError(f"runner address {addr!r}: an IPv6 address goes in brackets, as in [{addr}]:6667")
  else:
    host, sep, port = addr.partition(":")
    if not sep: port = str(DEFAULT_PORT)
  if not port.isdigit(): raise bad(f"the port {port!r} is not a number" if port else "no port after the colon")
  if not 1 <= int(port) <= 65535: raise ValueError(f"runner address {addr!r}: port {int(port)} out of range 1-65535")
  return host or "localhost", int(port)

def full_addr(addr:str) -> str:
  """addr with its port, as messages show it: "mac.local" is "mac.local:6667". One that is not HOST[:PORT] as given (Runner refuses it)."""
  try: host, port = parse_addr(addr)
  except ValueError: return addr
  return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
