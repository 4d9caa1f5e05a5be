"""T. `report_to`: what sending to the trackers costs the training loop (issue 38: "sending
happens off the training loop's critical path, measured in the bench").

    PYTHONPATH=src python benchmarks/trackers_time.py [--rounds 5] [--steps 300]

A small model (a few ms a step) under a whole-run watch (`steps=None, every=2` by default, a
stress case: a window judged every 16 steps, each sending its series; the orphan's alert once;
`--every 10` is nearer a real run, which observes one step in 100), in interleaved rounds of
three blocks of the same `steps` steps, each block under a fresh watch:
- `A`: `report_to` none; `A2`: the same again (the A/A control: what noise alone moves);
- `T`: `report_to=["tensorboard", "mlflow"]`, both real, on local stores in a scratch folder;
- `S`: one tracker that takes 50 ms a call, as a remote tracker over a slow network does
  (a `Sink` that sleeps: the only stand-in here, since nothing may reach a network).
Ratios are of the blocks' total times against `A`. The end (`stop()`, which waits for the
trackers) is timed apart: that wait is the user's, once, not the loop's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

SLOW_SECONDS = 0.05


def build():
    """A model with an orphan head (the seed's finding) and its SGD over the rest."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 8))
    opt = torch.optim.SGD(list(model[0].parameters()) + list(model[2].parameters()), lr=0.01)
    return model, opt


def slow_sink():
    from diagkit.run.trackers.sink import Sink

    class Slow(Sink):
        name = "slow"

        def scalars(self, values, step):
            time.sleep(SLOW_SECONDS)

        summary = table = lambda self, *a: time.sleep(SLOW_SECONDS)

        def alert(self, title, text, level, step=None):
            time.sleep(SLOW_SECONDS)
    return Slow()


def block(model, opt, steps: int, report_to=None, sinks=None, every: int = 2
          ) -> tuple[float, float]:
    """(seconds of the `steps` steps, seconds of `stop()`) under a fresh whole-run watch."""
    import diagkit
    from diagkit.run.trackers.context import Context
    from diagkit.run.trackers.watching import Trackers

    x, y = torch.randn(32, 64), torch.randn(32, 8)
    w = diagkit.watch(model, opt, steps=None, every=every, report_to=report_to, live=False)
    if sinks is not None:
        w.trackers = Trackers(sinks, Context())
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    loop = time.perf_counter() - start
    start = time.perf_counter()
    w.stop()
    return loop, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="diagkit-bench-trackers-"))
    os.environ["MLFLOW_TRACKING_URI"] = (scratch / "mlruns").as_uri()
    for name in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "MLFLOW_ALLOW_FILE_STORE"):
        os.environ[name] = "true"  # no telemetry; skinny has no sqlite store
    import mlflow
    from torch.utils.tensorboard import SummaryWriter
    mlflow.start_run()
    writer = SummaryWriter(str(scratch / "tb"))
    model, opt = build()
    block(model, opt, 20)  # warm-up: the allocator, the judge's imports
    n, every = args.steps, args.every
    variants = {"A": lambda: block(model, opt, n, every=every),
                "A2": lambda: block(model, opt, n, every=every),
                "T": lambda: block(model, opt, n, report_to=[writer, "mlflow"], every=every),
                "S": lambda: block(model, opt, n, sinks=[slow_sink()], every=every)}
    loops = {k: [] for k in variants}
    stops = {k: [] for k in variants}
    order = list(variants)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            loop, stop = variants[name]()
            loops[name].append(loop)
            stops[name].append(stop)
    mlflow.end_run()
    writer.close()
    med = statistics.median
    print(f"{args.rounds} rounds of {args.steps} steps, whole-run watch every={every}; "
          f"plain-watch step {1e3 * med(loops['A']) / args.steps:.2f} ms")
    print(f"{'variant':<44} {'loop / A (per round)':<40} stop() median")
    names = {"A": "A: no report_to", "A2": "A2: no report_to (A/A control)",
             "T": "T: tensorboard + mlflow (local stores)",
             "S": f"S: a tracker taking {1e3 * SLOW_SECONDS:.0f} ms a call"}
    for name in order:
        ratios = [t / a for t, a in zip(loops[name], loops["A"])]
        print(f"{names[name]:<44} {med(ratios):.3f}x ({', '.join(f'{x:.3f}' for x in ratios)})"
              f"{'':<4} {1e3 * med(stops[name]):.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
