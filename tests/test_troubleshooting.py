"""docs/troubleshooting.md cannot drift: every message its tables quote (the first column, `…` for what varies) occurs in the
source that prints it, and the messages a newcomer meets first have a row."""
import re
from conftest import ROOT

DOC = ROOT / "docs" / "troubleshooting.md"
SOURCES = [*sorted((ROOT / "client").glob("*.py")), *sorted((ROOT / "daemon").glob("*.[cm]")), ROOT / "setup.sh"]

def source_text() -> str:
  """All the sources, with string literals split over lines joined again ("a "\\n  "b" and "a "\\n  f"b" read as "a b")."""
  return "\n".join(re.sub(r"""(["'])\s*\n\s*f?\1""", "", p.read_text()) for p in SOURCES)

def quoted() -> list[str]:
  """The messages quoted in the first column of every table row."""
  rows = [l for l in DOC.read_text().splitlines() if l.startswith("| `")]
  return [m for r in rows for m in re.findall(r"`([^`]+)`", r.split(" | ")[0])]

def test_every_message_in_the_table_occurs_in_the_source():
  src, msgs = source_text(), quoted()
  assert len(msgs) > 30, msgs
  missing = [m for m in msgs if not all(f in src for f in (f.strip(" ()'") for f in m.split("…")) if f)]
  assert not missing, f"docs/troubleshooting.md quotes messages the source no longer has: {missing}"

def test_the_messages_of_a_wrong_address_token_or_port_have_a_row():
  msgs = " ".join(quoted())
  for m in ("cannot connect", "is not a metal_runner", "never answered the handshake", "out of range 1-65535", "requires a token",
            "wrong token", "did not authenticate", "the token file", "cannot listen on", "usage: metal_runner", "the client disconnected",
            "setup.sh: done. Next:",
            "cannot use the runner at", "does not resolve", "nothing listens on that port"):
    assert m in msgs, f"no row quotes {m!r}"
