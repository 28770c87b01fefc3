"""A test harness, not a network: a TCP relay on 127.0.0.1 between a client and a runner that drops connections on cue.

It reads the protocol's frame headers (size[4] type[2]) in both directions, so a cut can land exactly where a test wants it: in
the middle of the Nth frame of a type (half of a large Twrite forwarded, or half of a reply), after some bytes, or at once.
A cut closes both sockets of the pair (with SO_LINGER 0, so the client sees a reset, or with a plain close, an end of stream);
the listener stays, so the client's reconnection goes through the relay again.

  with LinkCutter(runner_addr) as lc:
    lc.cut_in(up=P.TWRITE, min_size=1 << 20)   # drop the link half way through the next Twrite of at least 1 MiB
    lc.cut_in(down=P.RREAD)                    # ... half way through the next Rread
    Runner(lc.addr) ...
    lc.blocked = True                           # the link stays down: new connections are dropped at once
    lc.cuts   # how many connections were dropped
"""
from __future__ import annotations
import select, socket, struct, threading

class _Parser:
  """Follows the frames of one direction of one connection; says where to stop forwarding for a pending cut."""
  def __init__(self): self.hdr, self.left, self.type, self.size = b"", 0, None, 0
  def feed(self, data:bytes, rules:list) -> int|None:
    """Returns how many bytes of data to forward before a cut, or None to forward all of it."""
    i = 0
    while i < len(data):
      if self.left == 0:  # in a header
        take = min(12 - len(self.hdr), len(data) - i)
        self.hdr += data[i:i + take]
        i += take
        if len(self.hdr) == 12:
          self.size, self.type = struct.unpack_from("<IH", self.hdr)
          self.left, self.hdr = self.size - 12, b""
          for r in rules:
            if not r["done"] and r["type"] == self.type and self.size >= r["min_size"]:
              if r["skip"] > 0: r["skip"] -= 1
              else:
                r["done"] = True
                return i + max(0, min(self.left, self.size // 2 - 12))   # the header and about half the frame
        continue
      take = min(self.left, len(data) - i)
      self.left -= take
      i += take
    return None

class LinkCutter:
  def __init__(self, target:str, reset:bool=True):
    host, _, port = target.rpartition(":")
    self.target, self.reset, self.cuts, self.conns = (host, int(port)), reset, 0, 0
    self._lock, self._pairs, self._rules = threading.Lock(), [], {"up": [], "down": []}
    self._ls = socket.socket()
    self._ls.bind(("127.0.0.1", 0))
    self._ls.listen(16)
    self.addr = f"127.0.0.1:{self._ls.getsockname()[1]}"
    self._stop = False
    self.blocked = False   # True: the link is down; every new connection is dropped at once
    threading.Thread(target=self._accept, daemon=True).start()

  def __enter__(self): return self
  def __exit__(self, *exc): self.close()

  def cut_in(self, up:int|None=None, down:int|None=None, min_size:int=0, skip:int=0):
    """Arm a cut: half way through the next frame of type up (client to runner) or down (runner to client) of at least min_size
    bytes, after skipping skip such frames. Each rule fires once, on whichever connection carries that frame."""
    with self._lock: self._rules["up" if up is not None else "down"].append(
      {"type": up if up is not None else down, "min_size": min_size, "skip": skip, "done": False})

  def pending(self) -> int:
    with self._lock: return sum(not r["done"] for rs in self._rules.values() for r in rs)

  def cut(self):
    """Drop every connection now."""
    with self._lock: pairs, self._pairs = self._pairs, []
    for p in pairs: self._drop(p)

  def close(self):
    self._stop = True
    self._ls.close()
    self.cut()

  def _drop(self, pair):
    for s in pair:
      try:
        if self.reset: s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
      except OSError: pass
    with self._lock: self.cuts += 1

  def _accept(self):
    while not self._stop:
      try: c, _ = self._ls.accept()
      except OSError: return
      if self.blocked:
        self._drop((c,))
        continue
      try: u = socket.create_connection(self.target)
      except OSError:
        c.close()
        continue
      for s in (c, u): s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      with self._lock:
        self._pairs.append(pair := (c, u))
        self.conns += 1
      threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

  def _pump(self, pair):
    c, u = pair
    parsers = {c: _Parser(), u: _Parser()}
    try:
      while True:
        r, _, _ = select.select([c, u], [], [], 0.5)
        with self._lock:
          if pair not in self._pairs: return
        for s in r:
          data = s.recv(1 << 16)
          if not data: raise EOFError
          with self._lock: n = parsers[s].feed(data, self._rules["up" if s is c else "down"])
          (u if s is c else c).sendall(data if n is None else data[:n])
          if n is not None:
            with self._lock:
              if pair in self._pairs: self._pairs.remove(pair)
            self._drop(pair)
            return
    except (OSError, EOFError, ValueError):
      with self._lock:
        if pair not in self._pairs: return
        self._pairs.remove(pair)
      for s in pair:
        try: s.close()
        except OSError: pass
