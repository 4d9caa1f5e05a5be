"""Verdicts of a distributed run: what differs between ranks on the same step.

`rank_differences` is the one analysis behind both rules and the report's per-rank view.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .verdict import verdict
from .wording import subject


def rank_differences(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (name, step) of a steps table with a `rank` column: `mixed` (used on some ranks,
    not others), `diverged` (the value checksums differ) and `spread` (the largest relative
    checksum spread, (max - min) / max |checksum|; inf when one rank's is NaN; 0 when equal)."""
    keys = [steps["name"].astype(str), steps["step"]]
    mixed = steps["used"].astype(bool).groupby(keys).nunique() > 1
    if "checksum" not in steps.columns:
        return pd.DataFrame({"mixed": mixed, "diverged": False, "spread": 0.0})
    cs = pd.to_numeric(steps["checksum"], errors="coerce")
    hi, lo = cs.groupby(keys).max(), cs.groupby(keys).min()
    diverged = cs.groupby(keys).nunique(dropna=False) > 1
    scale = np.maximum(hi.abs(), lo.abs())
    spread = ((hi - lo) / scale.where(scale > 0)).fillna(0.0)
    spread = spread.where(~(cs.isna().groupby(keys).any() & diverged), np.inf)
    return pd.DataFrame({"mixed": mixed, "diverged": diverged,
                         "spread": spread.where(diverged, 0.0)})


def _names_where(params: pd.DataFrame, steps: pd.DataFrame, column: str) -> pd.Series:
    if "rank" not in steps or (column == "diverged" and "checksum" not in steps):
        return pd.Series(False, index=params.index)
    found = rank_differences(steps)
    hit = found.index[found[column].to_numpy(dtype=bool)].get_level_values(0).unique()
    return params["name"].isin(hit)


@verdict("rank_divergent", "error",
         "(distributed) Its value differs between ranks after a step.", per_rank=True)
def rank_divergent(params, steps):
    return _names_where(params, steps, "diverged")


@rank_divergent.explains
def _explain_divergent(label, group, steps):
    message = (f"{subject(label, group)} holds different values on different ranks after a "
               "step: the ranks no longer train one model (a tensor outside DDP's gradient "
               "sync, or made trainable after DDP was built).")
    fix = ("Make every trainable tensor a parameter of the model before wrapping it in DDP "
           "(set requires_grad before DistributedDataParallel(model)), and keep tensors an "
           "optimizer steps inside the model.")
    return message, fix


@verdict("rank_dependent_use", "warning",
         "(distributed) Used on some ranks and not on others in the same step.", per_rank=True)
def rank_dependent_use(params, steps):
    return _names_where(params, steps, "mixed")


@rank_dependent_use.explains
def _explain_dependent(label, group, steps):
    message = (f"{subject(label, group)} received a gradient on some ranks and not on others "
               "in the same step: the forward branches on each rank's data, so DDP needs "
               "find_unused_parameters=True.")
    fix = ("Keep DDP(find_unused_parameters=True), or make the branch contribute on every rank, "
           "e.g. loss = loss + 0.0 * sum(p.sum() for p in <module>.parameters()).")
    return message, fix
