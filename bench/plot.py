"""Draw bench/results/latest.json (from bench/run.py) as a PNG: cost against message size, and against the number of concurrent clients.

  python3 bench/plot.py [results.json [out.png]]
Needs matplotlib (pip install matplotlib, or the project's `bench` extra). Bars are the min..max of the runs, points their median.
"""
from __future__ import annotations
import json, pathlib, sys

MIB = 1 << 20
SIZES = [4096, MIB, 64 * MIB, 256 * MIB]
SIZE_NAMES = ["4 KiB", "1 MiB", "64 MiB", "256 MiB"]

def draw(src, dst):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  d = json.loads(pathlib.Path(src).read_text())
  F, info = d["figures"], d["info"]

  def series(keys):
    got = [(i, F[k]) for i, k in enumerate(keys) if k in F and "median" in F[k]]
    return [i for i, _ in got], [f["median"] for _, f in got], [[f["median"] - f["min"] for _, f in got], [f["max"] - f["median"] for _, f in got]]

  fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(16, 5.2))
  m = info["machine"]
  fig.suptitle(f"metal_runner, CPU backend over loopback — {info['date'][:10]}, {m['cpu']}, {m['cores']} cores "
               f"({info['reps']} runs per point: median, bars min..max)", fontsize=11)

  # cost per message against size
  for d_, color, how in (("write", "tab:blue", "pipelined, then one sync"), ("read", "tab:orange", "each waited for")):
    idx, y, err = series([f"proto.{d_}_us.{s}" for s in SIZES])
    a1.errorbar([SIZES[i] for i in idx], y, yerr=err, marker="o", capsize=4, color=color, label=f"{d_} (Python client; {how})")
  regime = next((r for r in ("same", "any", "cross") if f"link.echo_rtt.{r}" in F), None)
  where = {"same": ", 1 CPU", "cross": ", 2 CPUs", "any": ""}.get(regime, "")
  if "link.stream" in F and regime:
    gbps, rtt = F["link.stream"]["median"], F[f"link.echo_rtt.{regime}"]["median"]
    a1.plot(SIZES, [rtt + s / (gbps * 1e3) for s in SIZES], "k--", label=f"C link: echo RTT{where} + size / C stream rate")
  if regime and f"proto.ping_rtt.{regime}" in F:
    a1.axhline(F[f"proto.ping_rtt.{regime}"]["median"], color="tab:green", ls=":", label=f"client ping RTT{where} (no payload)")
  have_sizes = any(f"proto.write_us.{s}" in F for s in SIZES)
  a1.set(xscale="log" if have_sizes else "linear", yscale="log" if have_sizes else "linear", xlabel="message size",
         ylabel="µs per write / read", title="cost per message against size")
  a1.set_xticks(SIZES, SIZE_NAMES, rotation=30)
  a1.minorticks_off()
  a1.grid(True, which="both", alpha=0.3)
  a1.legend(fontsize=8)

  # throughput against size
  for d_, color in (("write", "tab:blue"), ("read", "tab:orange")):
    idx, y, err = series([f"proto.{d_}.{s}" for s in SIZES])
    a2.errorbar([SIZES[i] for i in idx], y, yerr=err, marker="o", capsize=4, color=color, label=f"{d_} (Python client)")
  if "link.stream" in F:
    st = F["link.stream"]
    a2.axhspan(st["min"], st["max"], color="gray", alpha=0.2)
    a2.axhline(st["median"], color="k", ls="--", label="C TCP stream (link limit; band: min..max)")
    a2.axhline(0.9 * st["median"], color="tab:red", ls=":", label="target: 90% of the C stream")
  a2.axhline(2.0, color="tab:purple", ls=":", label="target: 2 GB/s")
  a2.set(xscale="log" if have_sizes else "linear", xlabel="message size", ylabel="GB/s", title="throughput against size")
  a2.set_xticks(SIZES, SIZE_NAMES, rotation=30)
  a2.minorticks_off()
  a2.set_ylim(bottom=0)
  a2.grid(True, which="both", alpha=0.3)
  a2.legend(fontsize=8)

  # against concurrent clients
  ns = [1, 2, 4]
  idx, y, err = series([f"conc.ping.{n}" for n in ns])
  a3.errorbar([ns[i] for i in idx], y, yerr=err, marker="o", capsize=4, color="tab:green", label="ping RTT per client (µs)")
  a3.set(xlabel="concurrent clients (one process each)", ylabel="µs per ping, per client", title="against concurrent clients", xticks=ns)
  a3.set_ylim(bottom=0)
  a3.grid(True, alpha=0.3)
  b3 = a3.twinx()
  idx, y, err = series([f"conc.bulk.{n}" for n in ns])
  b3.errorbar([ns[i] for i in idx], y, yerr=err, marker="s", capsize=4, color="tab:blue", label="64 MiB write+read, all clients (GB/s)")
  b3.set_ylabel("GB/s, all clients together")
  b3.set_ylim(bottom=0)
  h1, l1 = a3.get_legend_handles_labels()
  h2, l2 = b3.get_legend_handles_labels()
  a3.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
  a3.set_ylim(top=max(a3.get_ylim()[1], 1) * 1.3)  # room for the legend
  b3.set_ylim(top=max(b3.get_ylim()[1], 1) * 1.3)

  for ax, have in ((a1, have_sizes), (a2, have_sizes), (a3, any(f"conc.ping.{n}" in F for n in ns))):
    if not have: ax.text(0.5, 0.5, "not measured in this run", transform=ax.transAxes, ha="center", va="center", color="gray")
  fig.tight_layout()
  fig.savefig(dst, dpi=110)
  plt.close(fig)

def draw_network(src, dst):
  """bench/results/network.json (bench/run.py --only network): step time and tokens/s against the emulated RTT, for this runner,
  tinygrad 0.11's REMOTE and the ideal line (local + round trips x RTT + bytes / rate), round trips per step or token written on."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker  # noqa: F401
  d = json.loads(pathlib.Path(src).read_text())
  rows = d["rows"]
  fig, axs = plt.subplots(1, 3, figsize=(16, 4.8))
  for ax, wl, title in ((axs[0], "mlp_item", "TinyJit MLP step, loss read every step"), (axs[1], "mlp_sync", "the same, one sync per 50 steps"),
                        (axs[2], "llm", "LLM decoding (~20 M parameters)")):
    rs = sorted((r for r in rows if r["workload"] == wl), key=lambda r: r["rtt_ms"])
    if not rs: continue
    x = [r["rtt_ms"] for r in rs]
    conv = (lambda ms: 1e3 / ms) if wl == "llm" else (lambda ms: ms)
    for key, label, style in (("runner_ms", "this runner", "o-"), ("r011_ms", "tinygrad 0.11 REMOTE", "s-"),
                              ("ideal_ms", "ideal (local tinygrad CPU)", "k--"),
                              ("floor_ms", "ideal (this runner on loopback)", "k:")):
      pts = [(xx, conv(r[key])) for xx, r in zip(x, rs) if r.get(key)]
      if pts: ax.plot(*zip(*pts), style, label=label)
    for xx, r in zip(x, rs): ax.annotate(f"{r['round_trips']:.2f} RT/{r['per']}\n{r['profile']}", (xx, conv(r["runner_ms"])), fontsize=7,
                                         textcoords="offset points", xytext=(4, -18 if wl == "llm" else 4))
    ax.set_xscale("log")
    ax.set_yscale("log")
    for a in (ax.xaxis, ax.yaxis):
      a.set_major_formatter(matplotlib.ticker.ScalarFormatter())
      a.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("emulated round trip (ms, measured through bench/linkemu)")
    ax.set_ylabel("tokens/s" if wl == "llm" else "ms per step")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f"Over EMULATED links (a relay on loopback, not a network): {d['info'].get('date', '')}", fontsize=10)
  fig.tight_layout()
  fig.savefig(dst, dpi=110)

if __name__ == "__main__":
  here = pathlib.Path(__file__).resolve().parent / "results"
  draw(sys.argv[1] if len(sys.argv) > 1 else here / "latest.json", sys.argv[2] if len(sys.argv) > 2 else here / "latest.png")
