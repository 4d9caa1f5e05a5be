"""CUDA checks for the recorder (run on a GPU machine; CI has none), sized for < 3 min on an H200.

    PYTHONPATH=src PYTHONUNBUFFERED=1 python3 benchmarks/cuda_check.py     # cuda when present
    PYTHONPATH=src python3 benchmarks/cuda_check.py --device cpu --quick   # smoke test on a CPU

A. The integer fingerprints are identical on CPU and GPU (integer sums do not depend on
   summation order), for several dtypes and a tensor spanning many chunks.
B. A mis-wired model gets the same verdicts in the three delta modes on the device as in
   exact mode on the CPU.
C. An observed step of `Observer` (the `diagnose` path) makes at most one host synchronisation.
D. Issue 35 (benchmarks/cuda_checks_issue35.py, cuda_checks_compile.py), in the device's dtype
   (bf16 on CUDA): items 1, 2, 5 and 5b; the LoRA model's extra device memory per delta mode
   (item 3; goal in exact mode: <= 1x the trained bytes + 64 MiB); host syncs per observed and
   unobserved step of a whole-run watch (goal: 0 in hooks, <= 1 per observed step, 0 per
   unobserved step); dynamo's counters under watch on a compiled model (item 4) and its
   per-step ratio, plain against watched.

Prints one PASS / FAIL / SKIP / INFO line each; a check that raises is a FAIL with its reason,
never the end of the script. Exits 1 if any fails. With $OUT (or --out) set, writes
cuda_check.json (every figure and line) and cuda_check.txt (the lines) there after each section,
so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

STARTED = time.perf_counter()

import torch  # noqa: E402
from torch import nn  # noqa: E402

import diagkit  # noqa: E402
import cuda_checks_compile  # noqa: E402
import cuda_checks_issue35 as issue35  # noqa: E402


class Ctx:
    """The run's settings and its report: lines printed and kept, figures, failures."""

    def __init__(self, args):
        self.device, self.quick, self.cuda = args.device, args.quick, args.device == "cuda"
        self.dtype = getattr(torch, args.dtype) if args.dtype else default_dtype(args.device)
        self.backend = args.backend or ("inductor" if self.cuda else "aot_eager")
        self.budget, self.out = args.budget, Path(args.out) if args.out else None
        self.lines, self.failures = [], 0
        self.figures = {"device": self.device, "dtype": str(self.dtype), "quick": self.quick,
                        "torch": torch.__version__, "cuda": torch.version.cuda,
                        "gpu": torch.cuda.get_device_name() if self.cuda else None,
                        "checks": []}

    def say(self, text):
        print(text, flush=True)
        self.lines.append(text)

    def check(self, name, ok, detail=""):
        self.failures += not ok
        self.figures["checks"].append({"name": name, "status": "PASS" if ok else "FAIL",
                                       "detail": detail})
        self.say(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")

    def skip(self, name, why):
        self.figures["checks"].append({"name": name, "status": "SKIP", "detail": why})
        self.say(f"SKIP  {name}  {why}")

    def info(self, text):
        self.say(f"INFO  {text}")

    def figure(self, key, value):
        self.figures[key] = value

    def left(self) -> float:
        return self.budget - (time.perf_counter() - STARTED)

    def section(self, name, fn, need_s):
        """Run one section; an exception is a FAIL with its reason and where it came from."""
        if self.left() < need_s:
            return self.skip(name, f"time budget: {self.left():.0f} s left, needs ~{need_s} s")
        t = time.perf_counter()
        try:
            fn(self)
        except Exception as exc:
            tail = traceback.extract_tb(exc.__traceback__)[-2:]
            at = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tail)
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.check(f"{name} (raised)", False, f"{type(exc).__name__}: {first[:300]} [{at}]")
        self.figures.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 2)
        self.save()

    def save(self):
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self.figures["elapsed_s"] = round(time.perf_counter() - STARTED, 2)
        self.figures["lines"] = self.lines
        (self.out / "cuda_check.json").write_text(json.dumps(self.figures, indent=1,
                                                             default=str))
        (self.out / "cuda_check.txt").write_text("\n".join(self.lines) + "\n")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    """bf16 where the device computes it (a Linear's forward and backward), else float32."""
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    try:
        layer = nn.Linear(8, 8).to(device=device, dtype=torch.bfloat16)
        layer(torch.randn(2, 8, device=device, dtype=torch.bfloat16)).sum().backward()
        return torch.bfloat16
    except Exception:
        return torch.float32


# ---------------------------------------------------------------------------- A, B, C
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        self.head = nn.Linear(64, 8)
        self.unused = nn.Linear(64, 64)
        self.orphan = nn.Parameter(torch.zeros(64))

    def forward(self, x):
        return self.head(self.body(x) + self.orphan)


def misfired(device: str, delta: str):
    torch.manual_seed(0)
    model = Net().to(device)
    opt = torch.optim.AdamW([p for n, p in model.named_parameters() if n != "orphan"], lr=1e-3)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).to(device)

    def train_step(i):
        opt.zero_grad()  # zeroes only what it holds: the orphan's .grad grows (the seed bug)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss
    return diagkit.diagnose(model, opt, train_step=train_step, steps=3, delta=delta,
                            sample=64)


def fingerprints(ctx):
    if not ctx.cuda:
        return ctx.skip("A fingerprint equal on CPU and GPU", "CUDA-only")
    from diagkit.measure.change.fingerprint import Fingerprinter
    fp = Fingerprinter()
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        t = torch.randn(3 * fp.CHUNK + 17, generator=torch.Generator().manual_seed(3)).to(dtype)
        cpu, gpu = [int(v) for v in fp(t)], [int(v) for v in fp(t.cuda())]
        ctx.check(f"A fingerprint equal on CPU and GPU, {dtype}", cpu == gpu, f"{cpu} vs {gpu}")


def verdicts(ctx):
    cpu = misfired("cpu", "exact").verdicts()
    for delta in issue35.MODES:
        diag = misfired(ctx.device, delta)
        ctx.check(f"B {ctx.device} verdicts, delta={delta}, equal CPU exact",
                  diag.verdicts() == cpu,
                  str({k: sorted(v) for k, v in diag.verdicts().items() if v != {"ok"}}))


def observer_syncs(ctx):
    if not ctx.cuda:
        return ctx.skip("C host syncs per observed Observer step", "CUDA-only")
    from diagkit.measure.model.inventory import take_inventory
    from diagkit.measure.step.observer import Observer
    from diagkit.run.diagnose.loop import step_function
    from diagkit.run.target.target import Setup
    torch.manual_seed(0)
    model = Net().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device="cuda")
    step = step_function(Setup(model=model, optimizer=opt, batch_fn=lambda: x,
                               loss_fn=lambda m, b: m(b).pow(2).mean()))
    step(0)
    for delta in issue35.MODES:
        rec = Observer(take_inventory(model, [opt]), [opt], delta=delta, sample=64)
        rec.attach()
        counts = []
        try:
            for i in range(3):
                with issue35.Syncs() as s:
                    rec.begin_step(i, consecutive=i > 0)
                    rec.end_step(step(i))
                counts.append(s.count(("",)))
        finally:
            rec.detach()
        ctx.check(f"C host syncs per observed Observer step, delta={delta}", max(counts) <= 1,
                  str(counts))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=default_device())
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    p.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], default=None,
                   help="default: bf16 where the device computes it, else float32")
    p.add_argument("--backend", default=None, help="torch.compile backend (default: inductor "
                   "on cuda, aot_eager on cpu)")
    p.add_argument("--budget", type=float, default=170.0,
                   help="seconds from start; a section that would not fit is a SKIP")
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder (default: $OUT)")
    ctx = Ctx(p.parse_args(argv))
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames
    ctx.info(f"device {ctx.device} ({ctx.figures['gpu'] or 'no GPU'}), dtype {ctx.dtype}, "
             f"torch {torch.__version__}, compile backend {ctx.backend}, quick={ctx.quick}, "
             f"imports {time.perf_counter() - STARTED:.1f} s")
    for name, fn, need in [("A fingerprints", fingerprints, 5), ("B verdicts", verdicts, 10),
                           ("C Observer syncs", observer_syncs, 5), *issue35.SECTIONS,
                           ("4 compiled GPT", cuda_checks_compile.compile_figures, 60)]:
        ctx.section(name, fn, need)
    fails = [c["name"] for c in ctx.figures["checks"] if c["status"] == "FAIL"]
    ctx.info(f"{ctx.failures} failed of {len(ctx.figures['checks'])} in "
             f"{time.perf_counter() - STARTED:.1f} s" + (f": {fails}" if fails else ""))
    ctx.save()
    return 1 if ctx.failures else 0


if __name__ == "__main__":
    sys.exit(main())
