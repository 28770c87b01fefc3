#!/usr/bin/env python3
"""Train a small MLP with TinyJit on synthetic data (made here, nothing downloaded), printing the loss and the time per step.

  python3 examples/train_mlp.py           # on a metal_runner: METAL_RUNNER=host:port, or a local runner started for the run
                                          # (device REMOTE for a runner with the CPU backend, METAL for a Metal one)
  python3 examples/train_mlp.py --local   # the same training on tinygrad's own CPU device, for comparison
"""
import argparse, pathlib, sys, time
import numpy as np
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

def make_data(n:int, w:np.ndarray, rng:np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  # the class of a point is the column of w it has the largest |projection| on: learnable, but not by a linear model
  x = rng.normal(size=(n, w.shape[0])).astype(np.float32)
  return x, np.abs(x @ w).argmax(axis=1).astype(np.int32)

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--local", action="store_true", help="train on tinygrad's CPU device instead of a runner")
  ap.add_argument("--steps", type=int, default=200)
  ap.add_argument("--batch", type=int, default=128)
  ap.add_argument("--hidden", type=int, default=128)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()

  if args.local: device = "CPU"
  else:
    import client.remote_metal
    device = client.remote_metal.runner_device()
  from tinygrad import Device, Tensor, TinyJit, nn
  from tinygrad.helpers import Context

  rng, dim, classes = np.random.default_rng(args.seed), 32, 8
  w = rng.normal(size=(dim, classes)).astype(np.float32)
  (X, Y), (Xt, Yt) = make_data(8192, w, rng), make_data(2048, w, rng)
  Tensor.manual_seed(args.seed)

  class MLP:
    def __init__(self):
      self.layers = [nn.Linear(dim, args.hidden), nn.Linear(args.hidden, args.hidden), nn.Linear(args.hidden, classes)]
      for l in self.layers: l.weight, l.bias = l.weight.to(device).realize(), l.bias.to(device).realize()
    def __call__(self, x:Tensor) -> Tensor: return self.layers[2](self.layers[1](self.layers[0](x).relu()).relu())

  model = MLP()
  opt = nn.optim.Adam(nn.state.get_parameters(model), lr=args.lr, device=device)

  @TinyJit
  def train_step(x:Tensor, y:Tensor) -> Tensor:
    with Context(TRAINING=1):
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y).backward()
      return loss.realize(*opt.schedule_step())

  @TinyJit
  def predict(x:Tensor) -> Tensor: return model(x).argmax(axis=1).realize()

  runner = getattr(Device[device], "runner", None)
  print(f"training on {device}" + (f" (runner {runner.addr}, {runner.info.backend} backend, {runner.info.name})" if runner else " (local)"))
  steps_t, t0 = [], time.perf_counter()
  for step in range(1, args.steps + 1):
    idx = rng.integers(0, len(X), args.batch)
    xb, yb = Tensor(X[idx], device=device), Tensor(Y[idx], device=device)
    st = time.perf_counter()
    loss = train_step(xb, yb).item()   # .item() waits for the step: the time is the whole step, device time included
    steps_t.append(time.perf_counter() - st)
    if step == 1 or step % 20 == 0 or step == args.steps:
      recent = steps_t[-20:] if step > 3 else steps_t  # the first calls run uncaptured, then capture the JIT
      print(f"step {step:4d}  loss {loss:.4f}  {1e3 * float(np.median(recent)):7.2f} ms/step")
  acc = float((np.concatenate([predict(Tensor(Xt[i:i+256], device=device)).numpy() for i in range(0, len(Xt), 256)]) == Yt).mean())
  print(f"test accuracy {acc:.3f}; median step {1e3 * float(np.median(steps_t[3:])):.2f} ms after the JIT capture; "
        f"total {time.perf_counter() - t0:.1f} s")

if __name__ == "__main__": main()
