"""python -m client probe HOST[:PORT] [--token-file F] [--json]: what a runner is and how fast it answers.

Prints what Rhello says (backend, device, CPU target or GPU family, capabilities, limits, protocol version), then measures the round
trip (median of --pings Tping) and the write and read rates (--size bytes into one buffer and back, median of --repeat). PORT is 6667
unless given (an IPv6 address in brackets: [::1], [::1]:7000); the address may be "auto": the first runner advertised with DNS-SD
(client/discovery.py). With a token (--token-file, default $METAL_RUNNER_TOKEN_FILE, else ~/.metal_runner_token if it exists)
probe refuses a runner that does not prove it holds the same one. Exit codes: 0 ok, 2 usage (or not HOST[:PORT]), 3 unreachable,
4 a token problem (the runner refused the token, wants one, or did not prove it holds ours; the token file cannot be used),
5 the peer is not a metal_runner, 1 any other failure.
"""
from __future__ import annotations
import argparse, json, statistics, sys, time
from . import protocol as P
from .address import full_addr
from .config_file import load
from .connection import Runner
from .errors import RunnerError, RunnerConnectionError, NotARunnerError, TokenFileError
from .settings import held_token, read_token

CAP_BITS = {P.CAP_AUTH: "auth", P.CAP_UNIFIED: "unified", P.CAP_CPU_IMAGE: "cpu_image", P.CAP_METALLIB: "metallib",
            P.CAP_METAL_SOURCE: "metal_source"}
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH, EXIT_NOT_RUNNER = 0, 1, 2, 3, 4, 5

def size_arg(s:str) -> int:
  n, mult = s.upper().rstrip("B"), 1
  if n and n[-1] in "KMG": n, mult = n[:-1], 1 << (10 * ("KMG".index(n[-1]) + 1))
  if not n.isdigit() or int(n) == 0: raise argparse.ArgumentTypeError(f"{s!r} is not a size like 16M")
  return int(n) * mult

def fmt_bytes(n:int) -> str:
  for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
    if n >= 1 << k: return f"{n / (1 << k):.4g} {unit}"
  return f"{n} B"

def measure(r:Runner, pings:int, size:int, repeat:int) -> dict:
  rtts = []
  for _ in range(pings):
    t = time.perf_counter()
    r.ping()
    rtts.append(time.perf_counter() - t)
  size = min(size, r.info.maxbuf, r.info.memory)
  data, back, h = bytes(range(256)) * (size // 256) + bytes(size % 256), bytearray(size), r.new_handle()
  r.alloc(h, size)
  w, rd = [], []
  for _ in range(repeat):
    t = time.perf_counter()
    r.write(h, 0, data)
    r.sync()
    w.append(time.perf_counter() - t)
    t = time.perf_counter()
    r.read(h, 0, back)
    rd.append(time.perf_counter() - t)
  r.free(h)
  r.sync()
  if back != data: raise RunnerError(r.addr, P.EDEVICE, "the data read back differs from what was written", None, "Tread")
  return {"rtt_us": {"median": statistics.median(rtts) * 1e6, "min": min(rtts) * 1e6, "pings": pings},
          "write_GBps": size / statistics.median(w) / 1e9, "read_GBps": size / statistics.median(rd) / 1e9, "size": size, "repeat": repeat}

def describe(r:Runner, connect_s:float) -> dict:
  i = r.info
  d = {"addr": r.addr, "protocol_version": P.VERSION, "maxmsg": i.maxmsg, "backend": i.backend, "device": i.name, "arch": i.arch,
       "caps": [n for b, n in CAP_BITS.items() if i.caps & b], "caps_bits": i.caps, "authenticated": bool(i.caps & P.CAP_AUTH),
       "limits": {"memory": i.memory, "maxbuf": i.maxbuf, "maxhandles": i.maxhandles, "ncores": i.ncores}, "session": i.session,
       "connect_ms": connect_s * 1e3}
  if i.backend == "metal": d.update(gpu_family=i.arch, macos=i.cpu, metal_language=i.features)   # "" from an older runner
  else: d.update(cpu=i.cpu, features=[f for f in i.features.split(",") if f])
  return d

def show(d:dict):
  rows = [("runner", d["addr"]), ("protocol", f"version {d['protocol_version']}, frames up to {fmt_bytes(d['maxmsg'])}"),
          ("backend", d["backend"]), ("device", d["device"])]
  if d["backend"] == "metal": rows += [("gpu family", d["gpu_family"]), ("macos", d["macos"] or "-"), ("metal", d["metal_language"] or "-")]
  else: rows += [("arch", d["arch"]), ("cpu", d["cpu"] or "-"), ("features", ",".join(d["features"]) or "-")]
  lim = d["limits"]
  rows += [("caps", " ".join(d["caps"]) or "-"), ("auth", "token accepted" if d["authenticated"] else "none required"),
           ("memory", f"{fmt_bytes(lim['memory'])} per session, buffers up to {fmt_bytes(lim['maxbuf'])}"),
           ("handles", f"{lim['maxhandles']} per namespace"), ("cores", str(lim["ncores"])), ("session", str(d["session"])),
           ("connect", f"{d['connect_ms']:.2f} ms (TCP and handshake)")]
  if "rtt_us" in d:
    m = d["rtt_us"]
    rows += [("rtt", f"{m['median']:.1f} us median, {m['min']:.1f} us min ({m['pings']} pings)"),
             ("write", f"{d['write_GBps']:.3g} GB/s ({fmt_bytes(d['size'])}, median of {d['repeat']})"),
             ("read", f"{d['read_GBps']:.3g} GB/s ({fmt_bytes(d['size'])}, median of {d['repeat']})")]
  for k, v in rows: print(f"{k:<11} {v}")

def fail(args, code:int, msg:str) -> int:
  if args.json: print(json.dumps({"addr": args.addr, "error": msg, "exit": code}))
  print(f"probe: {msg}", file=sys.stderr)
  return code

def probe(args) -> int:
  token = source = None
  try:
    if (named:=load().get(args.addr)) is not None:   # a runner by name (~/.metal_runner_config, client/config_file.py)
      args.addr = named.address
      if named.token_file and not args.token_file: args.token_file = named.token_file
    addr = full_addr(args.addr)   # as messages show it: with its port
    if args.addr == "auto":
      from .discovery import discover
      if not (found := discover()): return fail(args, EXIT_UNREACHABLE, "no runner advertised itself with DNS-SD (_metal-runner._tcp)")
      addr = found[0].addr
    # read here, so that messages name this command's option, or what it defaults to: METAL_RUNNER_TOKEN_FILE, ~/.metal_runner_token
    if args.token_file: token, source = read_token(args.token_file, "--token-file"), f"--token-file {args.token_file}"
    else: token, source = held_token(None, None, addr)
  except TokenFileError as e: return fail(args, EXIT_AUTH, str(e))
  except (OSError, ValueError, RuntimeError) as e: return fail(args, EXIT_FAIL, str(e))
  t = time.perf_counter()
  try: r = Runner(addr, timeout=args.timeout, connect_timeout=args.timeout, token=token, token_source=source)
  except NotARunnerError as e: return fail(args, EXIT_NOT_RUNNER, str(e))
  except RunnerConnectionError as e:
    if (why := str(e.text)).startswith("cannot connect"): return fail(args, EXIT_UNREACHABLE, f"{addr} is unreachable: {why}")
    return fail(args, EXIT_NOT_RUNNER, f"{addr} closed the connection during the handshake: {why}")
  except RunnerError as e:
    if e.code == P.EAUTH and token is None:   # the library names its own ways to give a token (token=); this command has an option
      return fail(args, EXIT_AUTH, f"{addr}: the runner requires a token: pass --token-file FILE (or set METAL_RUNNER_TOKEN_FILE), the "
                                   "file the runner's --token-file names, or save that file as ~/.metal_runner_token")
    if e.code == P.EAUTH: return fail(args, EXIT_AUTH, f"{addr}: {e.text}")
    if e.code == P.EVERSION: return fail(args, EXIT_NOT_RUNNER, f"{addr} speaks another protocol version: {e.text}")
    return fail(args, EXIT_FAIL, f"{addr}: {e.reason()}")
  except ValueError as e: return fail(args, EXIT_USAGE, str(e))   # not HOST[:PORT]
  with r:
    d = describe(r, time.perf_counter() - t)
    try:
      if args.pings > 0: d.update(measure(r, args.pings, args.size, args.repeat))
    except RunnerError as e: return fail(args, EXIT_FAIL, f"{addr}: measuring failed: {e.reason()}")
  if args.json: print(json.dumps(d))
  else: show(d)
  return EXIT_OK

def add_parser(sub):
  """The probe command's parser, among the subcommands sub of python -m client (client/__main__.py)."""
  p = sub.add_parser("probe", help="show what a runner is and measure its round trip and copy rates",
                     description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("addr", metavar="HOST[:PORT]", help='the runner (port 6667 unless given), or "auto" for the first one advertised with DNS-SD')
  p.add_argument("--token-file",
                 help="the shared token (default: $METAL_RUNNER_TOKEN_FILE, else ~/.metal_runner_token if it exists); a runner that does not "
                      "prove it holds it is refused")
  p.add_argument("--json", action="store_true", help="print one JSON object (on failure: addr, error, exit)")
  p.add_argument("--pings", type=int, default=20, help="pings for the round trip (default 20; 0: no measurements)")
  p.add_argument("--size", type=size_arg, default=16 << 20, help="bytes to write and read back (default 16M, capped by the runner's maxbuf)")
  p.add_argument("--repeat", type=int, default=3, help="writes and reads, the median is shown (default 3)")
  p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the connection and for each reply (default 10)")
  return p
