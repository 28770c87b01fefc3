#!/usr/bin/env python3
"""One TinyJit training step of examples/train_mlp.py through a runner, as tinygrad's profiler saw it, printed as text.

  python3 examples/profile_step.py [--steps 6] [--out docs/profile_step.txt] [--svg docs/profile_step.svg]

Runs train_mlp.py with PROFILE=1 (METAL_RUNNER as for train_mlp.py: a runner's address, or a local runner), loads the profile
tinygrad writes at exit, and prints every event of the last training step, from the end of the step before (its loss.item()) to
the end of this one's, on one clock: the host's (TINY, USER: tinygrad's own work), the host's side of each transfer (<dev>:NET),
the runner's kernels (<dev>, <dev> Graph: the TinyJit step is one runner graph run) and its side of the transfers (<dev>:COPY).
The same profile opens in tinygrad's VIZ (python -m tinygrad.viz.serve --profile-path PATH).
"""
import argparse, getpass, os, pathlib, pickle, platform, subprocess, sys, tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--steps", type=int, default=6)
  ap.add_argument("--out", help="also write the text here")
  ap.add_argument("--svg", help="also draw the step as a timeline, one row per profile row, into this SVG file")
  args = ap.parse_args()
  sys.path.insert(0, str(ROOT))
  from tinygrad.helpers import ProfileRangeEvent, TracingKey
  from tinygrad.device import ProfileGraphEvent

  with tempfile.TemporaryDirectory() as tmp:
    env = {**os.environ, "PROFILE": "1", "TMPDIR": tmp, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_mlp.py"), "--steps", str(args.steps)], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0: sys.exit(f"train_mlp.py failed:\n{r.stderr[-3000:]}")
    with open(pathlib.Path(tmp) / f"profile.pkl.{getpass.getuser()}", "rb") as f: events = pickle.load(f)
  training = next(l for l in r.stdout.splitlines() if l.startswith("training on"))
  dev = training.split()[2]

  rows: list[tuple[int, int, str, str, str]] = []   # start ns, end ns, row, name, extra
  def name_of(n) -> str: return n.display_name if isinstance(n, TracingKey) else str(n)
  for e in events:
    if isinstance(e, ProfileRangeEvent) and e.en is not None:
      extra = f"{e.name.ret} B" if isinstance(e.name, TracingKey) and isinstance(e.name.ret, int) else ""
      rows.append((int(e.st * 1000), int(e.en * 1000), e.device, name_of(e.name), extra))
    elif isinstance(e, ProfileGraphEvent):
      st, en = int(min(e.sigs) * 1000), int(max(e.sigs) * 1000)
      rows.append((st, en, f"{e.ents[0].device} Graph", f"batched {len(e.ents)}", "one Tgraphrun"))
      rows += [(int(e.sigs[x.st_id] * 1000), int(e.sigs[x.en_id] * 1000), x.device, name_of(x.name), f"graph entry {i}")
               for i, x in enumerate(e.ents)]
  # the step's window: from the end of the previous loss.item() to the end of this one's (the host's reads on <dev>:NET)
  reads = sorted(en for st, en, row, name, _ in rows if row == f"{dev}:NET" and name == f"{dev} -> TINY")
  lo, hi = reads[args.steps - 2], reads[args.steps - 1]
  step = sorted(r for r in rows if lo <= r[0] <= hi)
  runner = [r for r in step if r[2] == dev]
  lines = [f"# One TinyJit step (step {args.steps}) of examples/train_mlp.py through a runner, from tinygrad's PROFILE=1 profile",
           f"# {training}; host {platform.system()} {platform.machine()}, Python {platform.python_version()}",
           f"# made by: python3 examples/profile_step.py --steps {args.steps}",
           "# times in ms from the end of the previous step's loss.item(), all on the host's clock; the runner's own times (rows "
           f"{dev}, {dev} Graph, {dev}:COPY)",
           "# are mapped onto it by the client (Tclock offsets); rows TINY and USER are tinygrad's host work, "
           f"{dev}:NET the host's side of each transfer.",
           f"# {len(runner)} kernels ran on the runner in this step, {sum(en - st for st, en, *_ in runner) / 1e6:.3f} ms of device time "
           f"in a step of {(hi - lo) / 1e6:.3f} ms.", "",
           f"{'start ms':>9} {'dur us':>9}  {'row':<16} {'event':<40} note"]
  lines += [f"{(st - lo) / 1e6:9.3f} {(en - st) / 1e3:9.1f}  {row:<16} {name[:40]:<40} {extra}" for st, en, row, name, extra in step]
  text = "\n".join(lines) + "\n"
  print(text, end="")
  if args.out: pathlib.Path(args.out).write_text(text)
  if args.svg: pathlib.Path(args.svg).write_text(svg(step, lo, hi, lines[1][2:]))

def svg(step:list, lo:int, hi:int, title:str) -> str:
  """The step as timelines, one lane per row (host rows first), a bar per event: the whole step, then zoomed in on the part where
  the runner worked (its kernels take a small part of a step)."""
  from xml.sax.saxutils import escape
  order = sorted({r[2] for r in step}, key=lambda r: (r not in ("USER", "TINY"), not r.endswith(":NET"), r))
  W, L, H = 1400, 130, 24
  dev_st = min((st for st, _, row, *_ in step if row not in ("USER", "TINY") and not row.endswith(":NET")), default=lo)
  zlo = max(lo, dev_st - (hi - dev_st) // 10)
  out, y = [f'<text x="8" y="18" font-size="13">{escape(title)}: one TinyJit step, tinygrad PROFILE=1, runner times on the host clock</text>'], 30
  for a, b, what in ((lo, hi, "the whole step"), (zlo, hi, "zoomed in on the runner's part")):
    x = lambda ns: L + (ns - a) / max(b - a, 1) * (W - L - 10)
    out.append(f'<text x="8" y="{y + 14}" font-weight="bold">{what}: {(a - lo) / 1e6:.3f} .. {(b - lo) / 1e6:.3f} ms</text>')
    y += 20
    for row in order:
      out.append(f'<text x="8" y="{y + 15}">{escape(row)}</text><line x1="{L}" x2="{W - 10}" y1="{y + H - 2}" y2="{y + H - 2}" stroke="#ddd"/>')
      for st, en, r, name, _ in step:
        if r != row or en < a: continue
        x0, x1 = x(max(st, a)), max(x(en), x(max(st, a)) + 1)
        color = "#4c78a8" if row in ("USER", "TINY") else "#f58518" if row.endswith(":NET") else "#54a24b" if "COPY" in row else "#e45756"
        out.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{x1 - x0:.1f}" height="{H - 8}" fill="{color}" opacity="0.8">'
                   f'<title>{escape(name)}: {(en - st) / 1e3:.1f} us</title></rect>')
        if x1 - x0 > 7 * len(name): out.append(f'<text x="{x0 + 2:.1f}" y="{y + 15}" fill="white">{escape(name)}</text>')
      y += H
    y += 16
  head = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{y}" font-family="monospace" font-size="11">',
          '<rect width="100%" height="100%" fill="white"/>']
  return "\n".join(head + out + ["</svg>"]) + "\n"

if __name__ == "__main__": main()
