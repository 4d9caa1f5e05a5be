"""Hand-built `params` / `steps` tables with every documented column.

A verdict test states only what matters for it:

    params, steps = tables(T("enc.weight", used=[True, False, True]),
                           T("head.bias", held=False, requires_grad=False))

Per-step columns (those of schema.STEPS_COLUMNS) take a list (one value per step) or a scalar
(the same on every step); static columns (schema.PARAMS_COLUMNS) take a scalar. The per-tensor
aggregates (steps, rg_steps, used_steps, ...) and `requires_grad` at the last step are computed
from the per-step values, so the two tables always agree.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from diagkit.core.schema import PARAMS_COLUMNS, STEPS_COLUMNS

N_STEPS = 3
STEP_DEFAULTS = {
    "requires_grad": True,
    "used": True,
    "grad_norm": 1.0,
    "grad_total_norm": 1.0,
    "carried_grad": False,
    "delta_norm": 0.01,
    "update_ratio": 0.001,
    "changed": True,
    "lr": 0.1,
    "nonfinite": False,
    "skipped": False,
}
_PER_STEP = set(STEPS_COLUMNS) - {"step", "name"}


class T:
    """One tensor: its static facts and its per-step observations."""

    def __init__(self, name: str, *, held: bool = True, n_steps: int | None = None, **values):
        self.name = name
        self.held = held
        self.values = values
        lengths = {len(v) for k, v in values.items() if k in _PER_STEP and isinstance(v, list)}
        assert len(lengths) <= 1, f"per-step lists of different lengths for {name}: {lengths}"
        self.n_steps = n_steps if n_steps is not None else (lengths.pop() if lengths else N_STEPS)

    def step_rows(self) -> list[dict]:
        per_step = {}
        for col in _PER_STEP:
            v = self.values.get(col, STEP_DEFAULTS[col] if (col != "lr" or self.held) else math.nan)
            per_step[col] = v if isinstance(v, list) else [v] * self.n_steps
        rows = []
        for i in range(self.n_steps):
            row = {"step": i, "name": self.name}
            row.update({col: per_step[col][i] for col in _PER_STEP})
            unused = not row["used"]
            for col in ("grad_norm",):  # no gradient on the step: NaN unless stated
                if unused and not isinstance(self.values.get(col), list):
                    row[col] = math.nan
            rows.append(row)
        return rows

    def param_row(self, rows: list[dict]) -> dict:
        name = self.name
        module = name.rsplit(".", 1)[0] if "." in name else ""
        held = self.held
        row = {
            "name": name,
            "aliases": (),
            "module": module,
            "module_type": "Linear",
            "shape": (4,),
            "numel": 4,
            "bytes": 16,
            "dtype": "torch.float32",
            "device": "cpu",
            "placement": "",
            "in_model": True,
            "requires_grad": bool(rows[-1]["requires_grad"]) if rows
            else bool(self.values.get("requires_grad", True)),
            "optimizer": 0 if held else pd.NA,
            "group": 0 if held else pd.NA,
            "memberships": ((0, 0),) if held else (),
            "n_optimizers": 1 if held else 0,
            "lr": 0.1 if held else math.nan,
            "weight_decay": 0.0 if held else math.nan,
            "steps": len(rows),
            "rg_steps": sum(bool(r["requires_grad"]) for r in rows),
            "used_steps": sum(bool(r["used"]) for r in rows),
            "changed_steps": sum(bool(r["changed"]) for r in rows),
            "carried_steps": sum(bool(r["carried_grad"]) for r in rows),
            "nonfinite_steps": sum(bool(r["nonfinite"]) for r in rows),
            "skipped_steps": sum(bool(r["skipped"]) for r in rows),
            "grad_norm": next((r["grad_norm"] for r in reversed(rows) if r["used"]), math.nan),
            "grad_total_norm": rows[-1]["grad_total_norm"] if rows else math.nan,
            "delta_norm": float(np.mean([r["delta_norm"] for r in rows])) if rows else math.nan,
            "update_ratio": float(np.mean([r["update_ratio"] for r in rows])) if rows
            else math.nan,
            "verdicts": (),
        }
        if "bytes" not in self.values and "numel" in self.values:
            row["bytes"] = 4 * self.values["numel"]
        for key, value in self.values.items():
            if key in PARAMS_COLUMNS and not isinstance(value, list):
                row[key] = value
        return row


def tables(*tensors: T) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(params, steps) with exactly the documented columns, in the documented order."""
    step_rows, param_rows = [], []
    for t in tensors:
        rows = t.step_rows()
        step_rows += rows
        param_rows.append(t.param_row(rows))
    params = pd.DataFrame(param_rows, columns=list(PARAMS_COLUMNS))
    params["optimizer"] = params["optimizer"].astype("Int64")
    params["group"] = params["group"].astype("Int64")
    steps = pd.DataFrame(step_rows, columns=list(STEPS_COLUMNS))
    steps = steps.sort_values(["step"], kind="stable").reset_index(drop=True)
    return params, steps


def verdict_sets(params: pd.DataFrame, steps: pd.DataFrame) -> dict[str, set[str]]:
    """judge() the tables; fail the test if any rule crashed."""
    from diagkit.judge.verdicts import judge
    verdicts, errors = judge(params, steps)
    assert errors == []
    return {n: set(v) for n, v in zip(params["name"], verdicts)}
