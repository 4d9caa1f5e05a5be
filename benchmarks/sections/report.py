"""C. The time to build the tables, the findings and the report pieces (plots + tables HTML)
for synthetic tables of 2,000 tensors x 200 steps.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bench_common import Bench

NAME = "report"
GOALS = {"report_seconds": 30.0}


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


def run(bench: Bench) -> None:
    """The total beside the goal, then each piece's seconds (`result["report"]`)."""
    print("[report] ...", file=sys.stderr, flush=True)
    cfg = bench.sizes["report"]
    rep = time_report(cfg["tensors"], cfg["steps"], bench.out_path.parent / "bench_figures")
    bench.result["report"] = rep
    lines = bench.lines
    lines.append((f"report build, {rep['tensors']} tensors x {rep['steps']} steps",
                  f"{rep['total_s']:.2f} s ({rep['findings']} findings)",
                  f"< {GOALS['report_seconds']:.0f} s",
                  "met" if rep["total_s"] < GOALS["report_seconds"] else "NOT met"))
    for label, v in rep["seconds"].items():
        lines.append((f"  {label}", f"{v:.3f} s", "-", "-"))
