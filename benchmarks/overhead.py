"""What observing a training step costs: time, memory, and the time to build a report.

Run with the project's venv (`make bench`, or `.venv/bin/python benchmarks/overhead.py`).
Prints a table with each measured ratio beside its goal and writes everything to JSON.

  A. per-step time, plain vs observed, interleaved A B A B, medians over repeats, one torch
     thread, on (a) a GPT-style model (~17M parameters) and (b) a model with ~500 small tensors.
     "Observed" is a `Recorder` built the way `diagkit.api.observe` builds it, and only the
     step itself (begin_step + the user's step + end_step) is timed; the one-off costs
     (inventory, Recorder + attach, SavedState capture and restore, detach, steps table,
     judging) are timed separately and reported as fixed costs.
  B. peak memory (ru_maxrss) of each variant, each in a fresh subprocess.
  C. the time to build the tables, the findings and the report pieces (plots + tables HTML)
     for synthetic tables of 2,000 tensors x 200 steps.

`--quick` shrinks everything to a few seconds (smoke use). `--profile` adds a cProfile of the
observed step (the hot spots are printed and stored in the JSON).
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

GOALS = {
    "step_ratio_gpt": 1.05,
    "step_ratio_small": 1.10,
    "extra_memory_per_param_byte": 1.0,   # plus a small constant
    "memory_constant_mb": 64.0,           # what "a small constant" is taken to be here
    "report_seconds": 30.0,
}

SIZES = {
    "full": {
        "gpt": dict(layers=6, d=384, heads=6, vocab=8000, batch=8, ctx=64),
        "small": dict(blocks=250, width=64, batch=32),
        "rounds": 7, "steps_per_block": {"gpt": 3, "small": 8},
        "mem_steps": 3,
        "report": dict(tensors=2000, steps=200),
    },
    "quick": {
        "gpt": dict(layers=2, d=64, heads=4, vocab=500, batch=4, ctx=16),
        "small": dict(blocks=50, width=32, batch=8),
        "rounds": 3, "steps_per_block": {"gpt": 3, "small": 3},
        "mem_steps": 2,
        "report": dict(tensors=200, steps=20),
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
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
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


def build(kind: str, cfg: dict):
    """model, optimizer, batch_fn, loss_fn (a fixed seed: every process builds the same)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if kind == "gpt":
        model = GPT(**cfg)
        batch_fn = lambda: torch.randint(cfg["vocab"], (cfg["batch"], cfg["ctx"] + 1),  # noqa: E731
                                         generator=gen)

        def loss_fn(m, seq):
            logits = m(seq[:, :-1])
            return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               seq[:, 1:].reshape(-1))
    else:
        model = ManySmall(**cfg)
        batch_fn = lambda: torch.randn(cfg["batch"], cfg["width"], generator=gen)  # noqa: E731

        def loss_fn(m, x):
            return m(x).pow(2).mean()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
    return model, opt, batch_fn, loss_fn


def param_facts(model) -> dict:
    ps = list(model.parameters())
    return {"tensors": len(ps), "numel": sum(p.numel() for p in ps),
            "bytes": sum(p.numel() * p.element_size() for p in ps)}


# ============================================================== A. step time
def _setup(model, opt, batch_fn, loss_fn):
    from diagkit.target import Setup
    return Setup(model=model, optimizer=opt, batch_fn=batch_fn, loss_fn=loss_fn)


def time_steps(kind: str, cfg: dict, rounds: int, k: int, profile: bool) -> dict:
    from diagkit.api import step_function, judge_run
    from diagkit.inventory import take_inventory
    from diagkit.recorder import Recorder
    from diagkit.state import SavedState

    model, opt, batch_fn, loss_fn = build(kind, cfg)
    setup = _setup(model, opt, batch_fn, loss_fn)
    step = step_function(setup)  # the exact loop diagnose() runs (SPEC 2.1)
    for i in range(2):  # warm-up: allocator, AdamW state, .grad buffers
        step(i)

    plain: list[float] = []
    observed: list[float] = []
    round_ratios: list[float] = []
    fixed: dict[str, list[float]] = {k_: [] for k_ in (
        "inventory", "recorder_attach", "saved_state_capture", "detach", "steps_table",
        "restore", "judge_run")}
    clock = time.perf_counter

    def observed_block(n: int, record: bool, prof: cProfile.Profile | None = None):
        t0 = clock()
        inv = take_inventory(model, setup.optimizers)
        t1 = clock()
        rec = Recorder(inv, setup.optimizers)
        rec.attach()
        t2 = clock()
        saved = SavedState(model, inv.tensors, setup.optimizers)
        t3 = clock()
        times = []
        try:
            for i in range(n):
                s = clock()
                if prof:
                    prof.enable()
                rec.begin_step()
                loss = step(i)
                rec.end_step(loss)
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
        diag = judge_run(inv.rows, table, None, {})
        t8 = clock()
        if record:
            for key, dt in (("inventory", t1 - t0), ("recorder_attach", t2 - t1),
                            ("saved_state_capture", t3 - t2), ("detach", t5 - t4),
                            ("steps_table", t6 - t5), ("restore", t7 - t6),
                            ("judge_run", t8 - t7)):
                fixed[key].append(dt)
        assert len(diag.params) == len(inv.tensors)
        return times

    observed_block(1, record=False)  # warm-up of the observed path too

    for _ in range(rounds):
        a = []
        for i in range(k):
            s = clock()
            step(i)
            a.append(clock() - s)
        b = observed_block(k, record=True)
        plain += a
        observed += b
        round_ratios.append(statistics.median(b) / statistics.median(a))

    out = {
        "model": param_facts(model), "config": cfg, "rounds": rounds, "steps_per_block": k,
        "plain_step_s": {"median": statistics.median(plain), "min": min(plain),
                         "all": plain},
        "observed_step_s": {"median": statistics.median(observed), "min": min(observed),
                            "all": observed},
        "ratio_of_medians": statistics.median(observed) / statistics.median(plain),
        "median_of_round_ratios": statistics.median(round_ratios),
        "round_ratios": round_ratios,
        "fixed_costs_s": {key: statistics.median(v) for key, v in fixed.items() if v},
    }
    if profile:
        prof = cProfile.Profile()
        observed_block(k, record=False, prof=prof)
        out["profile_top"] = _profile_top(prof, k)
    return out


def _profile_top(prof: cProfile.Profile, steps: int, top: int = 15) -> list[dict]:
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():
        where = f"{Path(file).name}:{line}({func})" if line else func
        rows.append({"function": where, "calls_per_step": nc / steps,
                     "tottime_ms_per_step": 1e3 * tt / steps,
                     "cumtime_ms_per_step": 1e3 * ct / steps})
    rows.sort(key=lambda r: r["tottime_ms_per_step"], reverse=True)
    ours = sorted((r for r in rows if r["function"].startswith("recorder.py")),
                  key=lambda r: r["cumtime_ms_per_step"], reverse=True)
    return {"by_own_time": rows[:top], "recorder_by_cumtime": ours[:8]}


# ============================================================== B. memory
def memory_child(kind: str, cfg: dict, variant: str, steps: int) -> dict:
    """Runs in a fresh interpreter: build, one warm-up plain step, then `steps` steps of the
    variant; report the peak resident set (ru_maxrss, KiB on Linux)."""
    torch.set_num_threads(1)
    import diagkit
    from diagkit.api import step_function, observe

    model, opt, batch_fn, loss_fn = build(kind, cfg)
    setup = _setup(model, opt, batch_fn, loss_fn)
    step = step_function(setup)
    step(0)  # AdamW state and .grad exist, as in the middle of a training run
    warm_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    warm_hwm = _vm_hwm_kib()
    if variant == "plain":
        for i in range(steps):
            step(i)
    elif variant == "observe":  # hooks + recorder only: exact mode, no restore copies
        observe(setup, steps, restore=False)
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


def measure_memory(kind: str, cfg: dict, steps: int) -> dict:
    # Each variant in its own fresh interpreter; they run side by side (peak RSS is per
    # process, so running them together changes nothing but the wall time).
    out = {}
    procs = {variant: subprocess.Popen(
        [sys.executable, __file__, "--_memory-child",
         json.dumps({"kind": kind, "cfg": cfg, "variant": variant, "steps": steps})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for variant in ("plain", "observe", "diagnose")}
    for variant, proc in procs.items():
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"memory child {kind}/{variant} failed:\n{stderr[-3000:]}")
        out[variant] = json.loads(stdout.strip().splitlines()[-1])
    param_bytes = out["plain"]["param_bytes"]
    base = out["plain"]["peak_kib"] * 1024
    for variant in ("observe", "diagnose"):
        extra = out[variant]["peak_kib"] * 1024 - base
        out[variant]["extra_bytes"] = extra
        out[variant]["extra_per_param_byte"] = extra / param_bytes
    return out


# ============================================================== C. report build time
def synthetic_tables(n_tensors: int, n_steps: int, seed: int = 0):
    """Inventory-like rows and a steps table with the schema's columns; a few tensors are
    mis-wired (orphan, unused, decay on bias/norm) so that findings are not empty."""
    from diagkit.schema import STEPS_COLUMNS

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
            "device": "cpu", "in_model": True, "requires_grad": True,
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

    from diagkit import plots, tables
    from diagkit.diagnosis import Diagnosis
    from diagkit.findings import build_advice, build_findings
    from diagkit.summary import build_params
    from diagkit.verdicts import judge

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

    params = timed("summary.build_params", lambda: build_params(rows, steps))
    verdicts, errors = timed("verdicts.judge", lambda: judge(params, steps))
    params["verdicts"] = verdicts
    findings = timed("findings.build_findings",
                     lambda: build_findings(params, steps, errors, None))
    advice = timed("findings.build_advice", lambda: build_advice(params, steps))
    diag = Diagnosis(params=params, steps=steps, findings=findings, advice=advice)
    timed("tables.verdict_banner", lambda: tables.verdict_banner(diag))
    timed("tables.findings_table", lambda: tables.findings_table(findings))
    timed("tables.wiring_table.to_html", lambda: tables.wiring_table(params).to_html())
    timed("tables.module_rollup", lambda: tables.module_rollup(params).to_html())
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, fn in (("grad_norm_figure", lambda: plots.grad_norm_figure(steps, params)),
                     ("update_ratio_figure", lambda: plots.update_ratio_figure(steps, params)),
                     ("wiring_matrix_figure", lambda: plots.wiring_matrix_figure(params))):
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
def _mark(value: float, goal: float) -> str:
    return "met" if value <= goal else "NOT met"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    ap.add_argument("--profile", action="store_true", help="cProfile the observed step")
    ap.add_argument("--out", default="out/bench.json", help="JSON output path")
    ap.add_argument("--skip", action="append", default=[], choices=["time", "memory", "report"])
    ap.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_child:
        spec = json.loads(args.memory_child)
        print(json.dumps(memory_child(spec["kind"], spec["cfg"], spec["variant"],
                                      spec["steps"])))
        return 0

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
        result["step_time"] = {}
        for kind in ("gpt", "small"):
            print(f"[time] {kind} ...", file=sys.stderr, flush=True)
            r = time_steps(kind, sz[kind], sz["rounds"], sz["steps_per_block"][kind],
                           args.profile)
            result["step_time"][kind] = r
            goal = GOALS[f"step_ratio_{kind}"]
            lines.append((f"step time observed/plain, {kind} ({r['model']['tensors']} tensors, "
                          f"{r['model']['numel'] / 1e6:.1f}M params)",
                          f"{r['ratio_of_medians']:.3f}x "
                          f"(plain {1e3 * r['plain_step_s']['median']:.1f} ms, observed "
                          f"{1e3 * r['observed_step_s']['median']:.1f} ms; per-round median "
                          f"{r['median_of_round_ratios']:.3f}x)",
                          f"<= {goal:.2f}x", _mark(r["ratio_of_medians"], goal)))
            fc = r["fixed_costs_s"]
            lines.append((f"  fixed costs per diagnosis, {kind} (not in the ratio)",
                          ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in fc.items()), "-", "-"))
    if "memory" not in args.skip:
        result["memory"] = {}
        for kind in ("gpt", "small"):
            print(f"[memory] {kind} ...", file=sys.stderr, flush=True)
            m = measure_memory(kind, sz[kind], sz["mem_steps"])
            result["memory"][kind] = m
            pb = m["plain"]["param_bytes"]
            const = GOALS["memory_constant_mb"] * 2**20
            for variant in ("observe", "diagnose"):
                extra = m[variant]["extra_bytes"]
                goal_bytes = GOALS["extra_memory_per_param_byte"] * pb + const
                lines.append((f"extra peak RSS, {kind}, {variant}"
                              + (" (restore=False)" if variant == "observe"
                                 else " (restore=True)"),
                              f"{extra / 2**20:.1f} MiB = {m[variant]['extra_per_param_byte']:.2f}"
                              f"x params ({pb / 2**20:.1f} MiB; plain peak "
                              f"{m['plain']['peak_kib'] / 1024:.0f} MiB, VmHWM)",
                              f"<= 1.0x params + {GOALS['memory_constant_mb']:.0f} MiB",
                              _mark(extra, goal_bytes)))
    if "report" not in args.skip:
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
    result["wall_s"] = time.perf_counter() - started

    widths = [max(len(row[i]) for row in lines) for i in range(4)] if lines else [0] * 4
    header = ("measure", "measured", "goal", "status")
    widths = [max(w, len(h)) for w, h in zip(widths, header)]
    print(f"diagkit overhead benchmark ({mode}, {result['date']}, "
          f"{result['machine']['cpus']} CPUs, torch {torch.__version__}, 1 thread)")
    for row in [header] + lines:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if args.profile and "step_time" in result:
        for kind, r in result["step_time"].items():
            prof = r.get("profile_top", {})
            print(f"\ncProfile of the observed step, {kind} (top by own time, per step):")
            for p in prof.get("by_own_time", []):
                print(f"  {p['tottime_ms_per_step']:8.2f} ms own {p['cumtime_ms_per_step']:8.2f}"
                      f" ms cum {p['calls_per_step']:8.0f} calls  {p['function']}")
            print(f"cProfile, {kind}: diagkit recorder functions by cumulative time, per step:")
            for p in prof.get("recorder_by_cumtime", []):
                print(f"  {p['tottime_ms_per_step']:8.2f} ms own {p['cumtime_ms_per_step']:8.2f}"
                      f" ms cum {p['calls_per_step']:8.0f} calls  {p['function']}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(out_path)
    print(f"\nwrote {out_path} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
