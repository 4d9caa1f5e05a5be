"""What observing a training step costs: time, memory, and the time to build a report.

Run with the project's venv (`make bench`, or `.venv/bin/python benchmarks/overhead.py`).
Prints a table with each measured ratio beside its goal and writes everything to JSON.

  A. per-step time, plain vs observed, interleaved A B A B, medians over repeats, one torch
     thread, on (a) a GPT-style model (~17M parameters) and (b) a model with ~500 small tensors.
     "Observed" is an `Observer` built the way `diagkit.run.diagnose.pipeline.observe` builds it, and only the
     step itself (begin_step + the user's step + end_step) is timed; the one-off costs
     (inventory, Observer + attach, SavedState capture and restore, detach, steps table,
     judging) are timed separately and reported as fixed costs.
  B. peak memory (VmHWM) of each variant, each in a fresh subprocess.
  C. the time to build the tables, the findings and the report pieces (plots + tables HTML)
     for synthetic tables of 2,000 tensors x 200 steps.
  D. the steps table of a long run (2,000 tensors) observed every step vs every 100th.
  F. `diagkit.watch` in the user's own loop: watched vs plain steps, and after it detached
     (benchmarks/watch_time.py).
  G. the same on the GPT sharded by FSDP2 (`fully_shard`, world 1 on gloo) against that sharded
     model's plain step (benchmarks/fsdp_time.py).
  H. `import diagkit` over `import torch`, in the same fresh process (medians over a few
     processes), which heavy modules it loaded, and the first use of `diagkit.watch`.
  I. the whole-run watch (`steps=None, every=100`): the whole block's time against plain,
     its unobserved steps, the wiring check per step on 500 and 5,000 tensors, and peak RSS
     over a long run of a tiny model (benchmarks/whole_run_time.py).
  J. `diagkit.watch(engine)` on the GPT under a DeepSpeed ZeRO-3 engine (world 1 on gloo,
     DeepSpeed's CPU accelerator) against that engine's plain step (benchmarks/zero_time.py).
  K. the live view in a real Jupyter kernel: watch with and without it (live_time.py).
  L. the whole call: `diagnose(steps=10)` against 10 plain steps, fixed cost included, with an
     A/A control, and the fixed cost per call (whole_call_time.py).
  M. `diagkit.watch` under DDP and FSDP2 at world 2 (gloo, a process per rank) against the
     same engine's plain step (group_time.py).
  N. `diagkit check` of the 70B LLaMA + LoRA demo with `--meta`: wall time and peak RSS of a
     fresh process (meta_time.py).
  O. a LoRA fine-tune (r=8 on q/v, peft) of an 8-layer Llama: extra peak RSS per delta mode,
     watched step against plain (A/A control), and the 70B LoRA plan's snapshot bytes on meta
     (lora_time.py; issue 35).
  P. the GPT under `torch.compile` (inductor): watched step against plain (A/A control), a
     whole-run watch's observed and unobserved steps, and dynamo's counters before and after
     observing (compile_time.py; issue 35).
  E. with --device cuda: the ~350M-parameter GPT on the GPU (step ratio per delta mode, host
     syncs and device bytes allocated per observed step, peak device memory per mode).

Step time is measured for each delta mode (exact, sampled, off); the goal applies to exact.

`--quick` shrinks everything to a few seconds (smoke use). `--only SECTION` (repeatable) runs
those sections alone (every other one skipped), e.g. `--only lora`. `--profile` adds a cProfile of the
observed step (the hot spots are printed and stored in the JSON).
"""

from __future__ import annotations

import argparse
import importlib.util
import contextlib
import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

GOALS = {
    "step_ratio_gpt": 1.03,               # issue 25 (1.05x before)
    "step_ratio_small": 1.05,             # issue 25 (1.10x before)
    "step_ratio_gpu": 1.03,               # (a)-large, ~350M parameters, on a GPU
    "extra_memory_per_param_byte": 1.0,   # plus a small constant
    "memory_constant_mb": 64.0,           # what "a small constant" is taken to be here
    "report_seconds": 30.0,
    "import_seconds_over_torch": 1.0,   # import diagkit, after import torch
    "whole_run_ratio": 1.01,            # steps=None, every=100, over the run
    "step_ratio_zero": 1.05,            # watch under a process group: issue 25's goal
    "step_ratio_group": 1.05,           # DDP / FSDP2 under a process group (issue 25)
    "whole_call_ratio": 1.05,           # diagnose(steps=10) / 10 plain steps, fixed cost in
    "change_check_fraction": 0.002,     # Wiring.changes on 5,000 tensors / a plain step
}
HEAVY = ("pandas", "pyarrow", "matplotlib", "ipywidgets", "papermill", "torch.distributed.tensor")

SIZES = {
    "full": {
        "gpt": dict(layers=6, d=384, heads=6, vocab=8000, batch=8, ctx=64),
        "small": dict(blocks=250, width=64, batch=32),
        # More rounds steady a median on a noisy host: (a) ~9 s each, (b) ~1 s each.
        "rounds": {"gpt": 11, "small": 15, "group": 7},
        "steps_per_block": {"gpt": 3, "small": 8},
        "mem_steps": 3,
        "report": dict(tensors=2000, steps=200),
        "stride": dict(tensors=2000, steps=1000, every=100, full_steps=20),
        "import_runs": 5,
        "whole": {"gpt": (3, 100), "small": (3, 400), "every": 100, "check": (500, 5000),
                  "long_steps": 200_000},
        "call": {"gpt": (5, 10), "small": (15, 10)},
    },
    "quick": {
        "gpt": dict(layers=2, d=64, heads=4, vocab=500, batch=4, ctx=16),
        "small": dict(blocks=50, width=32, batch=8),
        "rounds": {"gpt": 3, "small": 3, "group": 2}, "steps_per_block": {"gpt": 3, "small": 3},
        "mem_steps": 2,
        "report": dict(tensors=200, steps=20),
        "stride": dict(tensors=200, steps=100, every=10, full_steps=5),
        "import_runs": 2,
        "whole": {"gpt": (1, 30), "small": (1, 40), "every": 10, "check": (50, 500),
                  "long_steps": 2_000},
        "call": {"gpt": (2, 3), "small": (2, 3)},
    },
    "cuda": {
        "gpt_large": dict(layers=24, d=1024, heads=16, vocab=32000, batch=8, ctx=256),
        "rounds": {"gpt_large": 5}, "steps_per_block": {"gpt_large": 3},
        "mem_steps": 3,
    },
}


# ============================================================== models
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, vocab, ctx, **_):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class ManySmall(nn.Module):
    """A residual stack of small Linear layers: ~2 tensors per block, tiny compute each."""

    def __init__(self, blocks, width, **_):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x


def build(kind: str, cfg: dict, device: str = "cpu"):
    """model, optimizer, batch_fn, loss_fn (a fixed seed: every process builds the same)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if kind.startswith("gpt"):
        model = GPT(**cfg).to(device)
        batch_fn = lambda: torch.randint(cfg["vocab"], (cfg["batch"], cfg["ctx"] + 1),  # noqa: E731
                                         generator=gen).to(device)

        def loss_fn(m, seq):
            logits = m(seq[:, :-1])
            return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               seq[:, 1:].reshape(-1))
    else:
        model = ManySmall(**cfg)
        batch_fn = lambda: torch.randn(cfg["batch"], cfg["width"], generator=gen).to(device)  # noqa: E731

        def loss_fn(m, x):
            return m(x).pow(2).mean()
    model = model.to(device)
    return model, two_group_adamw(model), batch_fn, loss_fn


def two_group_adamw(model) -> torch.optim.AdamW:
    """The bench's optimizer: AdamW with decay on matrices and none on vectors, built from the
    model's parameters as they are now (after any wrapping or sharding)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)


def param_facts(model) -> dict:
    ps = list(model.parameters())
    return {"tensors": len(ps), "numel": sum(p.numel() for p in ps),
            "bytes": sum(p.numel() * p.element_size() for p in ps)}


# ============================================================== A. step time
def _setup(model, opt, batch_fn, loss_fn):
    from diagkit.run.target.target import Setup
    return Setup(model=model, optimizer=opt, batch_fn=batch_fn, loss_fn=loss_fn)


MODES = ("exact", "sampled", "off")


def time_steps(kind: str, cfg: dict, rounds: int, k: int, profile: bool,
               device: str = "cpu") -> dict:
    from diagkit.measure.model.inventory import take_inventory
    from diagkit.measure.step.observer import Observer
    from diagkit.measure.model.restore import SavedState
    from diagkit.run.diagnose.loop import loop_facts, step_function
    from diagkit.run.diagnose.pipeline import Observation, judge_observation

    model, opt, batch_fn, loss_fn = build(kind, cfg, device)
    setup = _setup(model, opt, batch_fn, loss_fn)
    user_step = step_function(setup)  # the exact loop diagnose() runs (SPEC 2.1)
    cuda = device.startswith("cuda")

    def step(i):
        loss = user_step(i)
        if cuda:  # a step is done when the device is; the observed path syncs on its own
            torch.cuda.synchronize()
        return loss

    for i in range(2):  # warm-up: allocator, AdamW state, .grad buffers
        step(i)

    plain: list[float] = []
    observed: dict[str, list[float]] = {m: [] for m in MODES}
    round_ratios: dict[str, list[float]] = {m: [] for m in MODES}
    syncs: dict[str, list[int]] = {m: [] for m in MODES}
    extra_alloc: dict[str, list[float]] = {m: [] for m in MODES}
    fixed: dict[str, list[float]] = {k_: [] for k_ in (
        "inventory", "observer_attach", "saved_state_capture", "detach", "steps_table",
        "restore", "judge_run")}
    walks: list[tuple[float, int, int]] = []  # (seconds, walks, steps) of each timed block
    # Seconds inside begin_step + end_step of each observed step: the observer's own calls,
    # additive, so far steadier than a ratio of step times on a shared host (its hooks and
    # the optimizer-time reads inside the step are not in it).
    own: dict[str, list[float]] = {m: [] for m in MODES}
    clock = time.perf_counter

    def observed_block(n: int, record: bool, saved, prof: cProfile.Profile | None = None,
                       mode: str = "exact"):
        t0 = clock()
        inv = take_inventory(model, setup.optimizers)
        t1 = clock()
        rec = Observer(inv, setup.optimizers, delta=mode, loop=loop_facts(setup))  # as observe()
        rec.attach()
        t2 = clock()
        times = []
        try:
            for i in range(n):
                s = clock()
                if prof:
                    prof.enable()
                if cuda:
                    alloc0 = torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0)
                    torch.cuda.set_sync_debug_mode("warn")
                with warnings.catch_warnings(record=True) as caught:
                    if cuda:
                        warnings.simplefilter("always")
                    b0 = clock()
                    rec.begin_step(i, consecutive=True)  # as run_steps: attach, then step 0
                    b1 = clock()
                    loss = user_step(i)
                    e0 = clock()
                    rec.end_step(loss)
                    own[mode].append((b1 - b0) + (clock() - e0))
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
                    syncs[mode].append(sum("synchroniz" in str(w.message) for w in caught))
                    extra_alloc[mode].append(torch.cuda.memory_stats().get(
                        "allocated_bytes.all.allocated", 0) - alloc0)
                if prof:
                    prof.disable()
                times.append(clock() - s)
        finally:
            t4 = clock()
            rec.detach()
            t5 = clock()
        table = rec.steps_table()
        t6 = clock()
        saved.restore()  # put the model back: each block starts from the same training state
        t7 = clock()
        if not record:  # judged in the warm-up blocks only: pandas work between timed blocks
            diag = judge_observation(Observation(inv.rows, table, None, {}))  # would stir the heap
            assert len(diag.params) == len(inv.tensors)
            fixed["judge_run"].append(clock() - t7)
        if record:  # the graph walk that finds unregistered tensors (first step of the block)
            walks.append((rec.unregistered.walk_seconds, rec.unregistered.walks, n))
        if record and mode == "exact":
            for key, dt in (("inventory", t1 - t0), ("observer_attach", t2 - t1),
                            ("detach", t5 - t4),
                            ("steps_table", t6 - t5), ("restore", t7 - t6)):
                fixed[key].append(dt)
        return times

    tensors = take_inventory(model, setup.optimizers).tensors

    def capture():
        t = clock()
        saved = SavedState(model, tensors, setup.optimizers)
        fixed["saved_state_capture"].append(clock() - t)
        return saved

    # One restore point for the whole measurement, alive during every plain and observed block
    # alike (as it is during a diagnose(restore=True)): its ~5x host copies then weigh on both
    # sides, and each block starts from the same training state. A fresh one per round moved
    # the heap: the next blocks ran +15-40 ms per step on (a), observed ones more than plain.
    saved = capture()
    for mode in MODES:
        observed_block(1, record=False, saved=saved, mode=mode)  # warm-up of the observed paths
    for i in range(k + 1):  # and of the plain path, after the judging above
        step(i)
    saved.restore()
    for m in MODES:
        own[m].clear()
        syncs[m].clear()
        extra_alloc[m].clear()
    plain_alloc = []
    first_plain: list[float] = []
    first_observed: dict[str, list[float]] = {m: [] for m in MODES}

    def plain_block():
        a = []
        for i in range(k + 1):
            if cuda:
                alloc0 = torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0)
            s = clock()
            step(i)
            a.append(clock() - s)
            if cuda:
                plain_alloc.append(torch.cuda.memory_stats().get(
                    "allocated_bytes.all.allocated", 0) - alloc0)
        return a

    for r in range(rounds):
        # The order alternates (plain first, then last) so a drift within a round favours
        # neither side.
        order = ["plain", *MODES] if r % 2 == 0 else [*MODES, "plain"]
        blocks = {}
        for name in order:
            if name == "plain":
                blocks[name] = plain_block()
                saved.restore()
            else:
                blocks[name] = observed_block(k + 1, record=True, saved=saved, mode=name)
        # Each block's first step pays one-off costs (fresh buffers, caches refilled after the
        # setup or the restore): kept apart, the ratio is over the steady-state steps.
        a = blocks["plain"]
        first_plain.append(a[0])
        a = a[1:]
        plain += a
        for mode in MODES:
            b = blocks[mode]
            first_observed[mode].append(b[0])
            b = b[1:]
            observed[mode] += b
            round_ratios[mode].append(statistics.median(b) / statistics.median(a))

    out = {
        "model": param_facts(model), "config": cfg, "rounds": rounds, "steps_per_block": k,
        "device": device,
        "plain_step_s": {"median": statistics.median(plain), "min": min(plain),
                         "all": plain},
        "modes": {m: {"observed_step_s": {"median": statistics.median(observed[m]),
                                          "min": min(observed[m]), "all": observed[m]},
                      "ratio_of_medians": statistics.median(observed[m]) / statistics.median(plain),
                      "median_of_round_ratios": statistics.median(round_ratios[m]),
                      "round_ratios": round_ratios[m],
                      "first_step_of_block_s": statistics.median(first_observed[m]),
                      "begin_end_s": statistics.median(own[m]),
                      **({"host_syncs_per_step": max(syncs[m]),
                          "allocated_bytes_per_step_median": statistics.median(extra_alloc[m])}
                         if cuda else {})}
                  for m in MODES},
        "fixed_costs_s": {key: statistics.median(v) for key, v in fixed.items() if v},
        "first_plain_step_of_block_s": statistics.median(first_plain),
        "graph_walk": {
            "seconds_per_walk": statistics.median(s / w for s, w, _ in walks if w) if any(
                w for _, w, _ in walks) else 0.0,
            "walks": sum(w for _, w, _ in walks), "observed_steps": sum(n for *_, n in walks),
            "seconds_per_observed_step": sum(s for s, _, _ in walks)
            / max(1, sum(n for *_, n in walks))},
    }
    out["fixed_costs_s"]["first_step_extra"] = (out["modes"]["exact"]["first_step_of_block_s"]
                                                - out["first_plain_step_of_block_s"])
    if cuda:
        out["plain_allocated_bytes_per_step_median"] = statistics.median(plain_alloc)
    out["ratio_of_medians"] = out["modes"]["exact"]["ratio_of_medians"]
    if profile:
        prof = cProfile.Profile()
        observed_block(k, record=False, saved=capture(), prof=prof)
        out["profile_top"] = _profile_top(prof, k)
    return out


MEASURE_FILES = {"observer.py", "gradients.py", "step_state.py", "exact_probe.py",
                 "sampled_probe.py", "buckets.py", "readback.py", "kernels.py", "fingerprint.py"}


def _profile_top(prof: cProfile.Profile, steps: int, top: int = 15) -> list[dict]:
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():
        where = f"{Path(file).name}:{line}({func})" if line else func
        rows.append({"function": where, "calls_per_step": nc / steps,
                     "tottime_ms_per_step": 1e3 * tt / steps,
                     "cumtime_ms_per_step": 1e3 * ct / steps})
    rows.sort(key=lambda r: r["tottime_ms_per_step"], reverse=True)
    ours = sorted((r for r in rows if r["function"].split(":")[0] in MEASURE_FILES),
                  key=lambda r: r["cumtime_ms_per_step"], reverse=True)
    return {"by_own_time": rows[:top], "observer_by_cumtime": ours[:8]}


# ============================================================== B. memory
def memory_child(kind: str, cfg: dict, variant: str, steps: int) -> dict:
    """Runs in a fresh interpreter: build, one warm-up plain step, then `steps` steps of the
    variant; report the peak resident set (ru_maxrss, KiB on Linux)."""
    torch.set_num_threads(1)
    import diagkit
    from diagkit.run.diagnose.loop import step_function
    from diagkit.run.diagnose.pipeline import observe

    model, opt, batch_fn, loss_fn = build(kind, cfg)
    setup = _setup(model, opt, batch_fn, loss_fn)
    step = step_function(setup)
    step(0)  # AdamW state and .grad exist, as in the middle of a training run
    warm_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    warm_hwm = _vm_hwm_kib()
    if variant == "plain":
        for i in range(steps):
            step(i)
    elif variant == "observe":  # hooks + observer only: exact mode, no restore copies
        observe(setup, steps, restore=False)
    elif variant in ("sampled", "off"):  # the bounded modes, no restore copies
        observe(setup, steps, restore=False, delta=variant)
    elif variant == "diagnose":  # what users call: restore=True, then judging
        diagkit.diagnose(model, opt, batch_fn=batch_fn, loss_fn=loss_fn, steps=steps)
    else:
        raise SystemExit(f"unknown variant {variant}")
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": variant, "ru_maxrss_kib": peak_kib, "ru_maxrss_after_warmup_kib": warm_kib,
            "hwm_kib": _vm_hwm_kib(), "hwm_after_warmup_kib": warm_hwm,
            "peak_kib": _vm_hwm_kib() or peak_kib,
            "param_bytes": param_facts(model)["bytes"]}


def _vm_hwm_kib() -> int | None:
    """This process's own peak RSS. Linux carries ru_maxrss across fork+exec (a child spawned
    by a 1 GiB parent reports >= 1 GiB), while VmHWM belongs to the new address space."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


MEMORY_VARIANTS = ("plain", "observe", "sampled", "off", "diagnose")


def measure_memory(kind: str, cfg: dict, steps: int, repeats: int = 3) -> dict:
    """Peak RSS per variant, each run in its own fresh interpreter, `repeats` times.

    The lowest peak of the repeats is kept: a peak can only be pushed up by the allocator's
    slack (malloc arenas, fragmentation: +-20 MiB between runs of the same variant), never
    below what the variant needs, so the minimum is the steadiest estimate.
    """
    runs: dict[str, list[dict]] = {v: [] for v in MEMORY_VARIANTS}
    for _ in range(repeats):
        # The variants of one repeat run side by side (peak RSS is per process).
        procs = {variant: subprocess.Popen(
            [sys.executable, __file__, "--_memory-child",
             json.dumps({"kind": kind, "cfg": cfg, "variant": variant, "steps": steps})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for variant in MEMORY_VARIANTS}
        for variant, proc in procs.items():
            stdout, stderr = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"memory child {kind}/{variant} failed:\n{stderr[-3000:]}")
            runs[variant].append(json.loads(stdout.strip().splitlines()[-1]))
    out = {variant: {**min(rs, key=lambda r: r["peak_kib"]),
                     "peak_kib_all": [r["peak_kib"] for r in rs]}
           for variant, rs in runs.items()}
    param_bytes = out["plain"]["param_bytes"]
    base = out["plain"]["peak_kib"] * 1024
    for variant in MEMORY_VARIANTS[1:]:
        extra = out[variant]["peak_kib"] * 1024 - base
        out[variant]["extra_bytes"] = extra
        out[variant]["extra_per_param_byte"] = extra / param_bytes
    return out


def cuda_memory(kind: str, cfg: dict, steps: int) -> dict:
    """Peak device memory of each variant, in this process (the allocator's own peak)."""
    from diagkit.run.diagnose.loop import step_function
    from diagkit.run.diagnose.pipeline import observe

    model, opt, batch_fn, loss_fn = build(kind, cfg, "cuda")
    setup = _setup(model, opt, batch_fn, loss_fn)
    step = step_function(setup)
    step(0)
    out = {"param_bytes": param_facts(model)["bytes"]}
    for variant in ("plain", "exact", "sampled", "off"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        if variant == "plain":
            for i in range(steps):
                step(i)
        else:
            observe(setup, steps, restore=False, delta=variant)
        torch.cuda.synchronize()
        out[variant] = torch.cuda.max_memory_allocated() - base
    for variant in ("exact", "sampled", "off"):
        out[f"{variant}_extra_bytes"] = out[variant] - out["plain"]
        out[f"{variant}_extra_per_param_byte"] = out[f"{variant}_extra_bytes"] / out["param_bytes"]
    return out


# ============================================================== D. long runs: every=k
class ManyTiny(nn.Module):
    """`n` tensors of 4 elements: a long run's steps table is tensors x observed steps rows."""

    def __init__(self, n):
        super().__init__()
        self.ps = nn.ParameterList(nn.Parameter(torch.randn(4)) for _ in range(n))

    def forward(self, x):
        return (torch.stack(list(self.ps)) * x).square().mean()


def stride_tables(tensors: int, steps: int, every: int, full_steps: int, out_dir: Path) -> dict:
    """Steps-table size in memory and on disk, observing every step vs every k-th."""
    import diagkit

    torch.manual_seed(0)
    model = ManyTiny(tensors)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
    x = torch.randn(tensors, 4)
    out = {"tensors": tensors}
    for label, n_steps, k in (("every_1", full_steps, 1), (f"every_{every}", steps, every)):
        t0 = time.perf_counter()
        diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=lambda m, b: m(b),
                                steps=n_steps, every=k, restore=False)
        seconds = time.perf_counter() - t0
        folder = out_dir / f"bench_stride_{label}"
        diag.save(folder)
        disk = sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith("steps"))
        rows = len(diag.steps)
        out[label] = {"steps": n_steps, "every": k, "rows": rows, "seconds": seconds,
                      "memory_bytes": int(diag.steps.memory_usage(deep=True).sum()),
                      "disk_bytes": disk, "observed_steps": diag.meta["steps_observed"]}
    # Rows grow linearly with observed steps: project both to a 10,000-step run from the
    # bytes per row measured above (running 10,000 steps of 2,000 tensors takes minutes here).
    out["projected"] = {}
    for label in ("every_1", f"every_{every}"):
        run = out[label]
        rows = (PROJECTED_STEPS + run["every"] - 1) // run["every"] * tensors
        out["projected"][label] = {
            "steps": PROJECTED_STEPS, "rows": rows,
            "memory_bytes": run["memory_bytes"] / run["rows"] * rows,
            "disk_bytes": run["disk_bytes"] / run["rows"] * rows}
    return out


PROJECTED_STEPS = 10_000


# ============================================================== C. report build time
def synthetic_tables(n_tensors: int, n_steps: int, seed: int = 0):
    """Inventory-like rows and a steps table with the schema's columns; a few tensors are
    mis-wired (orphan, unused, decay on bias/norm) so that findings are not empty."""
    from diagkit.core.schema import STEPS_COLUMNS

    rng = np.random.default_rng(seed)
    per_layer = 8
    rows = []
    for k in range(n_tensors):
        layer, j = divmod(k, per_layer)
        sub, mtype = [("attn.qkv", "Linear"), ("attn.proj", "Linear"), ("mlp.fc", "Linear"),
                      ("ln", "LayerNorm")][j // 2]
        kind = ("weight", "bias")[j % 2]
        module = f"encoder.layers.{layer}.{sub}" if layer % 50 != 49 else f"aux.{layer}.{sub}"
        shape = (64, 64) if kind == "weight" and sub != "ln" else (64,)
        numel = int(np.prod(shape))
        orphan = k % 97 == 5
        membership = () if orphan else ((0, 0),)
        rows.append({
            "name": f"{module}.{kind}", "aliases": (), "module": module,
            "module_type": mtype,
            "shape": shape, "numel": numel, "bytes": numel * 4, "dtype": "torch.float32",
            "device": "cpu", "placement": "", "stage": "", "in_model": True,
            "requires_grad": True,
            "memberships": membership, "n_optimizers": len({i for i, _ in membership}),
            "optimizer": membership[0][0] if membership else None,
            "group": membership[0][1] if membership else None,
            "lr": 1e-3 if membership else float("nan"),
            "weight_decay": 0.01 if membership else float("nan"),
        })
    names = np.array([r["name"] for r in rows], dtype=object)
    unused = np.array([r["module"].startswith("aux.") for r in rows])
    orphan = np.array([not r["memberships"] for r in rows])
    n = n_tensors
    used = np.tile(~unused, n_steps)
    grad = rng.lognormal(-3, 1, n * n_steps)
    grad_total = np.where(np.tile(orphan, n_steps),
                          grad * np.repeat(np.arange(1, n_steps + 1), n), grad)
    delta = np.where(np.tile(orphan | unused, n_steps), 0.0, rng.lognormal(-7, 1, n * n_steps))
    data = {
        "step": np.repeat(np.arange(n_steps, dtype=np.int64), n),
        "name": np.tile(names, n_steps),
        "requires_grad": np.ones(n * n_steps, dtype=bool),
        "used": used,
        "grad_norm": np.where(used, grad, np.nan),
        "grad_total_norm": np.where(used, grad_total, np.nan),
        "carried_grad": np.tile(orphan, n_steps) & (np.repeat(np.arange(n_steps), n) > 0),
        "delta_norm": delta,
        "update_ratio": delta / 2.0,
        "changed": delta != 0,
        "lr": np.tile(np.where(orphan, np.nan, 1e-3), n_steps),
        "nonfinite": np.zeros(n * n_steps, dtype=bool),
    }
    steps = pd.DataFrame(data, columns=list(STEPS_COLUMNS))
    return rows, steps


def time_report(n_tensors: int, n_steps: int, out_dir: Path) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from diagkit.core.result import Diagnosis
    from diagkit.judge.advice import build_advice
    from diagkit.judge.findings import build_findings
    from diagkit.judge.verdicts import judge
    from diagkit.measure.tables.aggregate import build_params
    from diagkit.present import matrix, plots, sections, tables

    t = {}
    clock = time.perf_counter
    s = clock()
    rows, steps = synthetic_tables(n_tensors, n_steps)
    t["synthesise (not counted)"] = clock() - s

    def timed(label, fn):
        s = clock()
        value = fn()
        t[label] = clock() - s
        return value

    params = timed("aggregate.build_params", lambda: build_params(rows, steps))
    verdicts, errors = timed("verdicts.judge", lambda: judge(params, steps))
    params["verdicts"] = verdicts
    findings = timed("findings.build_findings",
                     lambda: build_findings(params, steps, errors, None))
    advice = timed("advice.build_advice", lambda: build_advice(params, steps))
    diag = Diagnosis(params=params, steps=steps, findings=findings, advice=advice)
    timed("sections.verdict_banner", lambda: sections.verdict_banner(diag))
    timed("sections.findings_table", lambda: sections.findings_table(findings))
    timed("tables.wiring_table.to_html", lambda: tables.wiring_table(params).to_html())
    timed("tables.module_rollup", lambda: tables.module_rollup(params).to_html())
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, fn in (("grad_norm_figure", lambda: plots.grad_norm_figure(steps, params)),
                     ("update_ratio_figure", lambda: plots.update_ratio_figure(steps, params)),
                     ("wiring_matrix_figure", lambda: matrix.wiring_matrix_figure(params))):
        def draw(fn=fn, name=name):
            fig = fn()
            fig.savefig(out_dir / f"{name}.png", dpi=100)
            plt.close(fig)
        timed(f"plots.{name} + savefig", draw)
    total = sum(v for k, v in t.items() if "not counted" not in k)
    verdict_counts = pd.Series([v for vs in params["verdicts"] for v in vs]).value_counts()
    return {"tensors": n_tensors, "steps": n_steps, "rows": len(steps), "seconds": t,
            "total_s": total, "findings": len(findings),
            "verdict_counts": verdict_counts.to_dict()}


# ============================================================== main
_IMPORT_CHILD = """
import json, sys, time
t0 = time.perf_counter(); import torch
t1 = time.perf_counter(); import diagkit
t2 = time.perf_counter(); loaded = [m for m in HEAVY if m in sys.modules]
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch loads torch._dynamo
t3 = time.perf_counter(); diagkit.watch
t4 = time.perf_counter()
print(json.dumps({"torch_s": t1 - t0, "diagkit_s": t2 - t1, "first_optimizer_s": t3 - t2,
                  "watch_first_use_s": t4 - t3, "loaded_by_import": loaded}))
"""


def time_import(runs: int) -> dict:
    """H: each run a fresh interpreter (nothing cached in sys.modules, the OS file cache warm
    after the first): `import torch`, then `import diagkit`, then, as in a program that built
    its optimizer (torch's first optimizer imports torch._dynamo and DTensor itself), the
    first use of `diagkit.watch`."""
    child = f"HEAVY = {HEAVY!r}\n" + _IMPORT_CHILD
    got = [json.loads(subprocess.run([sys.executable, "-c", child], capture_output=True,
                                     text=True, check=True).stdout) for _ in range(runs + 1)]
    got = got[1:]  # the first run warms the file cache
    med = {k: statistics.median(g[k] for g in got)
           for k in ("torch_s", "diagkit_s", "first_optimizer_s", "watch_first_use_s")}
    return {**med, "runs": len(got), "loaded_by_import": got[-1]["loaded_by_import"],
            "all": got}


def _mark(value: float, goal: float) -> str:
    return "met" if value <= goal else "NOT met"


SECTIONS = ["time", "watch", "fsdp", "zero", "memory", "report", "stride", "import", "whole",
            "live", "call", "group", "meta", "lora", "compile"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    ap.add_argument("--profile", action="store_true", help="cProfile the observed step")
    ap.add_argument("--out", default="out/bench.json", help="JSON output path")
    ap.add_argument("--skip", action="append", default=[], choices=SECTIONS)
    ap.add_argument("--only", action="append", default=[], choices=SECTIONS,
                    help="run only this section (repeatable): every other one is skipped")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the ~350M-parameter GPT variant on the GPU (time and memory)")
    ap.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.only:
        args.skip = sorted(set(args.skip) | (set(SECTIONS) - set(args.only)))

    if args.memory_child:
        spec = json.loads(args.memory_child)
        print(json.dumps(memory_child(spec["kind"], spec["cfg"], spec["variant"],
                                      spec["steps"])))
        return 0

    if args.device == "cuda":
        return main_cuda(args)
    torch.set_num_threads(1)
    mode = "quick" if args.quick else "full"
    sz = SIZES[mode]
    out_path = Path(args.out)
    result = {
        "mode": mode,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "goals": GOALS,
    }
    started = time.perf_counter()
    lines = []
    if "time" not in args.skip:
        with _guarded(lines, "time", result, out_path):
            result["step_time"] = {}
            for kind in ("gpt", "small"):
                print(f"[time] {kind} ...", file=sys.stderr, flush=True)
                r = time_steps(kind, sz[kind], sz["rounds"][kind], sz["steps_per_block"][kind],
                               args.profile)
                result["step_time"][kind] = r
                lines += _step_lines(kind, r, GOALS[f"step_ratio_{kind}"])
                fc = r["fixed_costs_s"]
                lines.append((f"  fixed costs per diagnosis, {kind} (not in the ratio)",
                              ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in fc.items()), "-", "-"))
                own = r["modes"]["exact"]["begin_end_s"]
                lines.append((f"  observer's own calls per step, {kind} (begin_step + end_step, "
                              "exact; not its hooks)",
                              f"{1e3 * own:.2f} ms = {100 * own / r['plain_step_s']['median']:.2f} % "
                              "of the plain step (median)", "-", "-"))
                gw = r["graph_walk"]
                lines.append((f"  graph walk for unregistered tensors, {kind} (in the first step)",
                              f"{1e3 * gw['seconds_per_walk']:.2f} ms per walk (median), {gw['walks']} walks "
                              f"in {gw['observed_steps']} observed steps = "
                              f"{1e3 * gw['seconds_per_observed_step']:.3f} ms per observed step "
                              f"vs plain step {1e3 * r['plain_step_s']['median']:.1f} ms", "-", "-"))
    if "call" not in args.skip:
        with _guarded(lines, "call", result, out_path):
            from whole_call_time import time_whole_call, whole_call_lines
            result["whole_call"] = {}
            for kind in ("gpt", "small"):
                print(f"[call] {kind} ...", file=sys.stderr, flush=True)
                rounds, n = sz["call"][kind]
                r = result["whole_call"][kind] = time_whole_call(build, kind, sz[kind], rounds, n)
                lines += whole_call_lines(kind, r, GOALS["whole_call_ratio"])
    if "watch" not in args.skip:
        with _guarded(lines, "watch", result, out_path):
            from watch_time import time_watch, watch_lines
            result["watch_time"] = {}
            for kind in ("gpt", "small"):
                print(f"[watch] {kind} ...", file=sys.stderr, flush=True)
                r = time_watch(build, kind, sz[kind], sz["rounds"][kind],
                               sz["steps_per_block"][kind])
                result["watch_time"][kind] = r
                lines += watch_lines(kind, r, GOALS[f"step_ratio_{kind}"])
    if "fsdp" not in args.skip:
        with _guarded(lines, "fsdp", result, out_path):
            from fsdp_time import fsdp_lines, time_fsdp
            print("[fsdp] gpt ...", file=sys.stderr, flush=True)
            r = time_fsdp(build, "gpt", sz["gpt"], sz["rounds"]["gpt"], sz["steps_per_block"]["gpt"])
            result["fsdp_watch_time"] = {"gpt": r}
            lines += fsdp_lines("gpt", r, GOALS["step_ratio_group"])
    if "group" not in args.skip:
        with _guarded(lines, "group", result, out_path):
            from group_time import ENGINES, group_lines, time_group
            result["group_watch_time"] = {}
            for engine in ENGINES:
                print(f"[group] gpt under {engine}, world 2 ...", file=sys.stderr, flush=True)
                r = time_group(engine, "gpt", sz["gpt"], sz["rounds"]["group"],
                               sz["steps_per_block"]["gpt"])
                result["group_watch_time"][engine] = r
                lines += group_lines("gpt", r, GOALS["step_ratio_group"])
    if "zero" not in args.skip and importlib.util.find_spec("deepspeed") is None:
        lines.append(("DeepSpeed ZeRO-3 (J)", "skipped: deepspeed is not installed", "-", "-"))
    elif "zero" not in args.skip:
        with _guarded(lines, "zero", result, out_path):
            from zero_time import time_zero, zero_lines
            print("[zero] gpt ...", file=sys.stderr, flush=True)
            r = time_zero(build, "gpt", sz["gpt"], sz["rounds"]["gpt"], sz["steps_per_block"]["gpt"])
            result["zero_watch_time"] = {"gpt": r}
            lines += zero_lines("gpt", r, GOALS["step_ratio_zero"])
    if "memory" not in args.skip:
        with _guarded(lines, "memory", result, out_path):
            result["memory"] = {}
            for kind in ("gpt", "small"):
                print(f"[memory] {kind} ...", file=sys.stderr, flush=True)
                m = measure_memory(kind, sz[kind], sz["mem_steps"], repeats=1 if args.quick else 3)
                result["memory"][kind] = m
                pb = m["plain"]["param_bytes"]
                const = GOALS["memory_constant_mb"] * 2**20
                labels = {"observe": "exact (restore=False)", "sampled": "sampled (restore=False)",
                          "off": "off (restore=False)",
                          "diagnose": "diagnose, exact + restore=True (host copies, by design)"}
                for variant, label in labels.items():
                    extra = m[variant]["extra_bytes"]
                    goal_bytes = GOALS["extra_memory_per_param_byte"] * pb + const
                    if variant == "diagnose":
                        goal_text, status = "- (restore copies values, grads, optimizer state)", "-"
                    else:
                        goal_text = f"<= 1.0x params + {GOALS['memory_constant_mb']:.0f} MiB"
                        status = _mark(extra, goal_bytes)
                    lines.append((f"extra peak RSS, {kind}, {label}",
                                  f"{extra / 2**20:.1f} MiB = {m[variant]['extra_per_param_byte']:.2f}"
                                  f"x params ({pb / 2**20:.1f} MiB; plain peak "
                                  f"{m['plain']['peak_kib'] / 1024:.0f} MiB, VmHWM, lowest of "
                                  f"{len(m['plain']['peak_kib_all'])} runs)",
                                  goal_text, status))
    if "report" not in args.skip:
        with _guarded(lines, "report", result, out_path):
            print("[report] ...", file=sys.stderr, flush=True)
            rep = time_report(sz["report"]["tensors"], sz["report"]["steps"],
                              out_path.parent / "bench_figures")
            result["report"] = rep
            lines.append((f"report build, {rep['tensors']} tensors x {rep['steps']} steps",
                          f"{rep['total_s']:.2f} s ({rep['findings']} findings)",
                          f"< {GOALS['report_seconds']:.0f} s",
                          "met" if rep["total_s"] < GOALS["report_seconds"] else "NOT met"))
            for label, v in rep["seconds"].items():
                lines.append((f"  {label}", f"{v:.3f} s", "-", "-"))
    if "stride" not in args.skip:
        with _guarded(lines, "stride", result, out_path):
            print("[stride] ...", file=sys.stderr, flush=True)
            cfg = sz["stride"]
            st = stride_tables(cfg["tensors"], cfg["steps"], cfg["every"], cfg["full_steps"],
                               out_path.parent)
            result["stride"] = st
            for label, run in st["projected"].items():
                real = st[label]
                lines.append((f"steps table, {st['tensors']} tensors x {PROJECTED_STEPS:,} steps, "
                              f"{label.replace('_', '=')}",
                              f"{run['rows']:,} rows, {run['memory_bytes'] / 2**20:.1f} MiB in memory, "
                              f"{run['disk_bytes'] / 2**20:.1f} MiB parquet (bytes/row from a real "
                              f"{real['steps']}-step run: {real['rows']:,} rows, {real['seconds']:.0f} s)",
                              "small with every=k" if label != "every_1" else "-",
                              "met" if label != "every_1" and run["memory_bytes"] < 64 * 2**20
                              else "-"))
    if "import" not in args.skip:
        with _guarded(lines, "import", result, out_path):
            lines += _import_lines(sz, result)
    if "whole" not in args.skip:
        with _guarded(lines, "whole", result, out_path):
            lines += _whole_run_lines(sz, result)
    if "meta" not in args.skip and importlib.util.find_spec("transformers") is None:
        lines.append(("the 70B meta check (N)", "skipped: transformers is not installed",
                      "-", "-"))
    elif "meta" not in args.skip:
        with _guarded(lines, "meta", result, out_path):
            from meta_time import meta_lines, time_meta
            print("[meta] the 70B LLaMA + LoRA demo, --meta ...", file=sys.stderr, flush=True)
            result["meta"] = time_meta(runs=1 if args.quick else 3)
            lines += meta_lines(result["meta"])
    if "lora" not in args.skip and importlib.util.find_spec("peft") is None:
        lines.append(("the LoRA Llama (O)", "skipped: peft is not installed", "-", "-"))
    elif "lora" not in args.skip:
        with _guarded(lines, "lora", result, out_path):
            lines += _lora_lines(args.quick, result)
    if "compile" not in args.skip:
        with _guarded(lines, "compile", result, out_path):
            from compile_time import compile_lines, time_compiled
            print("[compile] the GPT under torch.compile ...", file=sys.stderr, flush=True)
            result["compile"] = time_compiled(build, sz["gpt"], rounds=2 if args.quick else 5)
            lines += compile_lines(result["compile"], GOALS["step_ratio_gpt"])
    if "live" not in args.skip:
        with _guarded(lines, "live", result, out_path):
            from live_time import live_lines, time_live
            print("[live] gpt, small in a kernel ...", file=sys.stderr, flush=True)
            result["live_view"] = time_live(sz, mode)
            lines += live_lines(result["live_view"])
    result["wall_s"] = time.perf_counter() - started
    _print_and_save(result, lines, out_path, args.profile)
    return 0


@contextlib.contextmanager
def _guarded(lines: list, section: str, result: dict, out_path: Path):
    """One section of the bench: if it fails, its failure is a row of the table (and its
    traceback is on stderr), and the other sections still run; what was measured so far is
    written to `out_path` after every section, so a late failure loses nothing."""
    try:
        yield
    except Exception as exc:
        traceback.print_exc()
        lines.append((f"section {section!r} FAILED", f"{type(exc).__name__}: {exc}"[:300],
                      "-", "NOT met"))
        result.setdefault("failed_sections", []).append(section)
    finally:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.with_suffix(out_path.suffix + ".partial").write_text(
            json.dumps({**result, "lines": lines}, indent=1, default=str))


def _import_lines(sz: dict, result: dict) -> list[tuple]:
    """Section H, the same on the CPU and the GPU run: `import diagkit` over `import torch`,
    what it loads, and the first use of `diagkit.watch` (kept in `result["import"]`)."""
    print("[import] ...", file=sys.stderr, flush=True)
    imp = result["import"] = time_import(sz["import_runs"])
    goal = GOALS["import_seconds_over_torch"]
    return [("import diagkit, over import torch (same process)",
             f"{imp['diagkit_s']:.3f} s (import torch {imp['torch_s']:.2f} s; medians "
             f"of {imp['runs']} fresh processes)", f"< {goal:.0f} s", _mark(imp["diagkit_s"], goal)),
            ("  heavy modules loaded by import diagkit",
             ", ".join(imp["loaded_by_import"]) or "none", "none",
             "met" if not imp["loaded_by_import"] else "NOT met"),
            ("  first use of diagkit.watch, after the first optimizer was built",
             f"{imp['watch_first_use_s']:.2f} s (the observing code, pandas; the "
             f"optimizer itself {imp['first_optimizer_s']:.2f} s)", "-", "-")]


def _lora_lines(quick: bool, result: dict) -> list[tuple]:
    """Section O: the LoRA fine-tune's memory, step time and 70B plan (`result["lora"]`)."""
    from lora_time import lora_lines, lora_memory, plan_70b, time_lora
    r = result["lora"] = {}
    print("[lora] memory per mode ...", file=sys.stderr, flush=True)
    r["memory"] = lora_memory(quick)
    print("[lora] step time ...", file=sys.stderr, flush=True)
    r["time"] = time_lora(quick, rounds=2 if quick else 5)
    print("[lora] the 70B plan on meta ...", file=sys.stderr, flush=True)
    r["plan_70b"] = plan_70b()
    return lora_lines(r, GOALS["memory_constant_mb"])


def _whole_run_lines(sz: dict, result: dict) -> list[tuple]:
    """Section I: the whole-run watch (kept in `result["whole_run"]`)."""
    from whole_run_time import (long_run_memory, time_change_check, time_whole_run,
                                whole_run_lines)
    cfg, r = sz["whole"], {"time": {}}
    for kind in ("gpt", "small"):
        print(f"[whole] {kind} ...", file=sys.stderr, flush=True)
        rounds, n = cfg[kind]
        r["time"][kind] = time_whole_run(build, kind, sz[kind], rounds, n, cfg["every"])
    r["check"] = [time_change_check(t) for t in cfg["check"]]
    print("[whole] long run ...", file=sys.stderr, flush=True)
    r["memory"] = long_run_memory(cfg["long_steps"])
    result["whole_run"] = r
    return whole_run_lines(r, GOALS["whole_run_ratio"])


def _step_lines(kind: str, r: dict, goal: float | None) -> list[tuple]:
    lines = []
    for mode, m in r["modes"].items():
        extra = ""
        if "host_syncs_per_step" in m:
            extra = (f"; host syncs/step {m['host_syncs_per_step']}, device bytes allocated/step "
                     f"{m['allocated_bytes_per_step_median'] / 2**20:.2f} MiB vs plain "
                     f"{r['plain_allocated_bytes_per_step_median'] / 2**20:.2f} MiB")
        lines.append((f"step time observed/plain, {kind} ({r['model']['tensors']} tensors, "
                      f"{r['model']['numel'] / 1e6:.1f}M params), delta={mode}",
                      f"{m['ratio_of_medians']:.3f}x "
                      f"(plain {1e3 * r['plain_step_s']['median']:.1f} ms, observed "
                      f"{1e3 * m['observed_step_s']['median']:.1f} ms; per-round median "
                      f"{m['median_of_round_ratios']:.3f}x{extra})",
                      f"<= {goal:.2f}x" if goal and mode == "exact" else "-",
                      _mark(m["ratio_of_medians"], goal) if goal and mode == "exact" else "-"))
    return lines


def main_cuda(args) -> int:
    """The ~350M-parameter GPT on the GPU: step time per mode, syncs, allocations, memory."""
    if not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    sz = SIZES["cuda"]
    out_path = Path(args.out)
    result = {"mode": "cuda",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "cuda": torch.version.cuda, "platform": platform.platform()},
              "goals": GOALS}
    started = time.perf_counter()
    lines = []
    print("[time] gpt_large on cuda ...", file=sys.stderr, flush=True)
    r = time_steps("gpt_large", sz["gpt_large"], sz["rounds"]["gpt_large"],
                   sz["steps_per_block"]["gpt_large"],
                   args.profile, device="cuda")
    result["step_time"] = {"gpt_large": r}
    lines += _step_lines("gpt_large", r, GOALS["step_ratio_gpu"])
    print("[memory] gpt_large on cuda ...", file=sys.stderr, flush=True)
    m = cuda_memory("gpt_large", sz["gpt_large"], sz["mem_steps"])
    result["memory"] = {"gpt_large": m}
    for variant in ("exact", "sampled", "off"):
        extra = m[f"{variant}_extra_bytes"]
        lines.append((f"extra peak device memory, gpt_large, delta={variant}",
                      f"{extra / 2**20:.1f} MiB = {m[f'{variant}_extra_per_param_byte']:.3f}x params "
                      f"({m['param_bytes'] / 2**30:.2f} GiB)",
                      f"<= 1.0x params + {GOALS['memory_constant_mb']:.0f} MiB",
                      _mark(extra, m["param_bytes"] + GOALS["memory_constant_mb"] * 2**20)))
    if "import" not in args.skip:
        lines += _import_lines(sz, result)
    if "whole" not in args.skip:
        lines += _whole_run_lines(sz, result)
    result["wall_s"] = time.perf_counter() - started
    _print_and_save(result, lines, out_path, args.profile)
    return 0


def _print_and_save(result: dict, lines: list, out_path: Path, profile: bool) -> None:
    mode = result["mode"]
    if mode == "quick":  # the goals are for the full sizes: a smoke run judges nothing
        lines = [(*row[:3], "- (quick sizes)" if row[3] in ("met", "NOT met") else row[3])
                 for row in lines]

    widths = [max(len(row[i]) for row in lines) for i in range(4)] if lines else [0] * 4
    header = ("measure", "measured", "goal", "status")
    widths = [max(w, len(h)) for w, h in zip(widths, header)]
    where = (result["machine"].get("gpu") if mode == "cuda"
             else f"{result['machine']['cpus']} CPUs, 1 torch thread")
    print(f"diagkit overhead benchmark ({mode}, {result['date']}, {where}, "
          f"torch {torch.__version__})")
    for row in [header] + lines:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if profile and "step_time" in result:
        for kind, r in result["step_time"].items():
            prof = r.get("profile_top", {})
            print(f"\ncProfile of the observed step, {kind} (top by own time, per step):")
            for p in prof.get("by_own_time", []):
                print(f"  {p['tottime_ms_per_step']:8.2f} ms own {p['cumtime_ms_per_step']:8.2f}"
                      f" ms cum {p['calls_per_step']:8.0f} calls  {p['function']}")
            print(f"cProfile, {kind}: diagkit measuring functions by cumulative time, per step:")
            for p in prof.get("observer_by_cumtime", []):
                print(f"  {p['tottime_ms_per_step']:8.2f} ms own {p['cumtime_ms_per_step']:8.2f}"
                      f" ms cum {p['calls_per_step']:8.0f} calls  {p['function']}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(out_path)
    out_path.with_suffix(out_path.suffix + ".partial").unlink(missing_ok=True)  # (`_guarded`)
    print(f"\nwrote {out_path} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
