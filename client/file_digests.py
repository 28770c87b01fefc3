"""The host's record of a file's SHA-256 digests, piece by piece (docs/cache.md, The host's record): what a cached upload from the file
(client/placement.py) would otherwise hash again at every start. One record per file, in $XDG_CACHE_HOME/metal_runner/digests/ (~/.cache
without it; METAL_RUNNER_DIGESTS=DIR names another folder, =0 keeps none), named by the SHA-256 of the file's real path, keyed by what
stat says of the file (device, inode, size, modification and change times, nanoseconds): a file that changed in any of these is hashed
again, and its record replaced. A record is written only when the file did not change while it was hashed and its modification time is
at least RACY seconds old when hashing began (as git's racy index entries: a write within the same clock tick would leave stat unchanged).

A wrong record would name other content than the file's, so nothing in it is trusted that its key does not hold: a record that cannot
be parsed, or is for another file, is ignored (and replaced). Format: one JSON line (the key), then 48 bytes a piece: offset[8]
length[8] little-endian, then the piece's SHA-256.
"""
from __future__ import annotations
import contextlib, hashlib, json, os, pathlib, struct, tempfile, time

RACY = 2.0   # s: a file modified this recently when hashing began is not recorded
_ENTRY = struct.Struct("<QQ32s")
MAGIC = "metal_runner file digests 1"

def folder() -> pathlib.Path|None:
  if (d:=os.environ.get("METAL_RUNNER_DIGESTS", "")) == "0": return None
  if d: return pathlib.Path(d)
  from .local_build import cache_dir
  return cache_dir() / "digests"

def key(st:os.stat_result) -> dict:
  return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}

class FileDigests:
  """The digests of pieces (offset, length) of the file at path: get() what the record holds, add() what was hashed now, save() at the
  end. hashed counts the pieces added (hashed this run), for the caller and the tests."""
  def __init__(self, path:str|os.PathLike):
    self.path = os.path.realpath(path)
    self.st = os.stat(self.path)
    self.started = time.time()
    self.known: dict[tuple[int, int], bytes] = {}
    self.hashed = 0
    d = folder()
    self.record = d / (hashlib.sha256(self.path.encode()).hexdigest() + ".digests") if d is not None else None
    with contextlib.suppress(OSError, ValueError, UnicodeDecodeError, struct.error):
      if self.record is not None: self.known = self._load(self.record.read_bytes())

  def _load(self, raw:bytes) -> dict[tuple[int, int], bytes]:
    head, _, body = raw.partition(b"\n")
    h = json.loads(head)
    if h.get("magic") != MAGIC or h.get("path") != self.path or h.get("key") != key(self.st) or len(body) % _ENTRY.size: return {}
    return {(o, n): d for o, n, d in _ENTRY.iter_unpack(body)}

  def get(self, offset:int, length:int) -> bytes|None: return self.known.get((offset, length))
  def add(self, offset:int, length:int, digest:bytes):
    if self.known.get((offset, length)) != digest: self.known[(offset, length)], self.hashed = digest, self.hashed + 1

  def save(self) -> bool:
    """Write the record if anything was hashed, the file is as it was and was not modified just before (RACY); whether it was written."""
    if self.record is None or not self.hashed: return False
    with contextlib.suppress(OSError):
      if key(os.stat(self.path)) != key(self.st) or self.st.st_mtime > self.started - RACY: return False
      self.record.parent.mkdir(parents=True, exist_ok=True)
      head = json.dumps({"magic": MAGIC, "path": self.path, "key": key(self.st)}).encode() + b"\n"
      body = b"".join(_ENTRY.pack(o, n, d) for (o, n), d in sorted(self.known.items()))
      fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=self.record.parent)
      try:
        with os.fdopen(fd, "wb") as f: f.write(head + body)
        os.replace(tmp, self.record)
        return True
      except OSError:
        with contextlib.suppress(OSError): os.unlink(tmp)
    return False
