"""The explorer's per-step data: the steps table as one wide table, step x (metric, name), built
once on first use (ranks folded as every presenter folds them). The state (`explorer_state`)
asks it which tensors have data for a metric, and for the series it plots. Never measures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..measure.tables.aggregate import fold_ranks

METRICS: dict[str, str] = {
    "grad_norm": "L2 norm of the step's own gradient",
    "grad_total_norm": "L2 norm of the .grad the optimizer sees",
    "delta_norm": "L2 norm of the step's change",
    "update_ratio": "change / norm of the value before",
}


class StepData:
    """step x (metric, name) over `steps`, built once; empty when no step was observed."""

    def __init__(self, steps: pd.DataFrame):
        self.steps = steps
        self._wide: pd.DataFrame | None = None

    def wide(self) -> pd.DataFrame:
        """step x (metric, name), built from the steps table once."""
        if self._wide is None:
            s = self.steps
            if not len(s) or "step" not in s or "name" not in s:
                self._wide = pd.DataFrame(
                    index=pd.Index([], name="step"),
                    columns=pd.MultiIndex.from_arrays([[], []], names=[None, "name"]))
            else:
                s = fold_ranks(s)  # one row per (step, tensor)
                cols = {m: (pd.to_numeric(s[m], errors="coerce").to_numpy(dtype=float)
                            if m in s else np.full(len(s), np.nan)) for m in METRICS}
                index = pd.MultiIndex.from_arrays(
                    [s["step"].to_numpy(), s["name"].astype(str).to_numpy(dtype=object)],
                    names=["step", "name"])
                self._wide = pd.DataFrame(cols, index=index).unstack("name").sort_index()
        return self._wide

    def has_data(self, metric: str) -> dict[str, bool]:
        """name -> whether `metric` has a value on any step."""
        wide = self.wide()
        if metric not in wide.columns.get_level_values(0):
            return {}
        return wide[metric].notna().any().to_dict()

    def series(self, metric: str, names: list[str]) -> pd.DataFrame:
        """`metric` per step (rows) for each of `names` (columns, in that order)."""
        wide = self.wide()
        if metric in wide.columns.get_level_values(0):
            table = wide[metric]
        else:
            table = pd.DataFrame(index=wide.index)
        out = table.reindex(columns=names)
        out.columns.name = "name"
        return out

    def metrics_with_data(self, names: list[str]) -> list[str]:
        """The metrics (in `METRICS`' order) with a value for any of `names`: what the user
        can switch to when the chosen metric has nothing to draw."""
        wide = self.wide()
        return [m for m in wide.columns.get_level_values(0).unique()
                if wide[m].reindex(columns=names).notna().to_numpy().any()]
