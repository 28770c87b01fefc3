"""bench/llm_runners.py's upload, run under `python -m client run --runner a,b bench/upload_worker.py MODEL.gguf`: the placement by memory
of MODEL over the runners, then, timed, client/placement.py's upload of every run of the file, back to back, and a sync of each runner.
Prints one JSON line: seconds, the weights' bytes, what the client sent each runner meanwhile, and how many pieces it hashed."""
import json, mmap, pathlib, sys, time
from tinygrad import Device, Tensor
from client import placement
from client.file_digests import FileDigests

path = sys.argv[1]
kv, infos = placement.read_gguf(path)
devs = placement.runner_devices()
p = placement.plan_gguf(kv, infos, devs, 128, speed=False)
for d in devs: Device[d].synchronize()
sent0 = [placement.runner_of(d).stats()["bytes_sent"] for d in devs]
disk, digests, keep, w = Tensor(pathlib.Path(path)), FileDigests(path), [], 0
with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
  t = time.perf_counter()
  for d, ts in placement.runs(infos, p):
    a, b = ts[0].offset, max(x.offset + x.nbytes for x in ts)
    keep.append(placement.upload(disk, m, d, a, b, digests))
    w += b - a
  for d in devs: Device[d].synchronize()
  s = time.perf_counter() - t
digests.save()
print(json.dumps({"s": s, "weights": w, "sent": [placement.runner_of(d).stats()["bytes_sent"] - a for d, a in zip(devs, sent0)],
                  "hashed": digests.hashed}))
