"""CUDA correctness checks for the recorder (run on a GPU machine; CI has none).

1. The integer fingerprints are identical on CPU and GPU (integer sums do not depend on
   summation order), for several dtypes and a tensor spanning many chunks.
2. A GPU model mis-wired like the `meta_memory` demo gets the same verdicts in the three
   delta modes, and the same verdicts as the same model on CPU.
3. An observed step makes one host transfer (counted with torch's sync debug mode).

Prints one line per check and exits 1 if any fails.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch import nn

import diagkit
from diagkit.measure.fingerprint import Fingerprinter


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        self.head = nn.Linear(64, 8)
        self.unused = nn.Linear(64, 64)
        self.orphan = nn.Parameter(torch.zeros(64))

    def forward(self, x):
        return self.head(self.body(x) + self.orphan)


def run(device: str, delta: str):
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


def main() -> int:
    failures = 0

    def check(name, ok, detail=""):
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)

    fp = Fingerprinter()
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        t = torch.randn(3 * fp.CHUNK + 17, generator=torch.Generator().manual_seed(3)).to(dtype)
        cpu = [int(v) for v in fp(t)]
        gpu = [int(v) for v in fp(t.cuda())]
        check(f"fingerprint equal on CPU and GPU, {dtype}", cpu == gpu, f"{cpu} vs {gpu}")

    cpu = run("cpu", "exact").verdicts()
    for delta in ("exact", "sampled", "off"):
        diag = run("cuda", delta)
        check(f"GPU verdicts, delta={delta}, equal CPU exact", diag.verdicts() == cpu,
              str({k: sorted(v) for k, v in diag.verdicts().items() if v != {"ok"}}))

    from diagkit.measure.inventory import take_inventory
    from diagkit.measure.observer import Observer
    from diagkit.run.loop import step_function
    from diagkit.run.target import Setup
    torch.manual_seed(0)
    model = Net().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device="cuda")
    step = step_function(Setup(model=model, optimizer=opt, batch_fn=lambda: x,
                               loss_fn=lambda m, b: m(b).pow(2).mean()))
    step(0)
    for delta in ("exact", "sampled", "off"):
        rec = Observer(take_inventory(model, [opt]), [opt], delta=delta, sample=64)
        rec.attach()
        counts = []
        try:
            for i in range(3):
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("warn")
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    rec.begin_step(i, consecutive=i > 0)
                    loss = step(i)
                    rec.end_step(loss)
                torch.cuda.set_sync_debug_mode("default")
                counts.append(sum("synchroniz" in str(w.message) for w in caught))
        finally:
            rec.detach()
        check(f"host syncs per observed step, delta={delta}", max(counts) <= 1, str(counts))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
