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
         ("(distributed) Its value differs between ranks after a step: DDP does not average "
          "its gradient (a tensor outside the model, or made trainable after DDP was built)."),
         per_rank=True,
         needs="values")
def rank_divergent(params, steps):
    return _names_where(params, steps, "diverged")


@rank_divergent.explains
def _explain_divergent(label, group, steps):
    """The concrete cause the steps point to. DDP averages the gradients of the parameters of
    the model it wraps that required grad when it was built, and no others: a tensor outside
    the model, or made trainable after DDP was built, trains on each rank's own gradient."""
    head = f"{subject(label, group)} holds different values on different ranks after a step"
    rebuild = ("Set requires_grad before DistributedDataParallel(model) is built, or re-create "
               "DDP after changing it (model = DistributedDataParallel(model.module, ...)).")
    changed = _requires_grad_changes(group, steps)
    if changed:
        where = ", ".join(f"`{n}` {'False → True' if now else 'True → False'} at step {k}"
                          for n, (k, now) in list(changed.items())[:3])
        return (f"{head}: its requires_grad changed during the run ({where}), after DDP was "
                "built, and DDP keeps the set of tensors it averages from the moment it was "
                "built.", rebuild)
    if not group["in_model"].astype(bool).all():
        return (f"{head}: an optimizer steps it, but it is not a parameter of the model DDP "
                "wraps (a tensor passed to forward as an argument?), so DDP never averages its "
                "gradient.",
                "Register it on the model before wrapping it in DDP (self.scale = "
                "nn.Parameter(...) in __init__, used in forward), so that DDP averages its "
                "gradient; build the optimizer from model.parameters().")
    if not _required_grad(group, steps):
        return (f"{head}, although it never required grad in the observed steps: something "
                "changes it outside the gradient, differently on each rank (an in-place update "
                "from the rank's data?).",
                "Make that update the same on every rank (e.g. torch.distributed.broadcast("
                "p.data, src=0) after it), or stop updating a tensor that should stay fixed.")
    return (f"{head}, although it required grad on every observed step: DDP does not average its "
            "gradient, most likely because it did not require grad yet when DDP was built (it "
            "was unfrozen after wrapping, before these steps); otherwise something changes it "
            "outside the gradient, differently on each rank.", rebuild)


def _requires_grad_changes(group: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """{name: (first step at which its requires_grad changed, the new value)} for the tensors
    of `group` whose requires_grad changed between observed steps."""
    s = steps[steps["name"].isin(set(group["name"]))].sort_values("step", kind="stable")
    changes = {}
    for name, rows in s.groupby("name", sort=False):
        rg = rows["requires_grad"].astype(bool).to_numpy()
        flips = np.flatnonzero(rg[1:] != rg[:-1])
        if len(flips):
            changes[name] = (int(rows["step"].iloc[flips[0] + 1]), bool(rg[flips[0] + 1]))
    return changes


def _required_grad(group: pd.DataFrame, steps: pd.DataFrame) -> bool:
    s = steps[steps["name"].isin(set(group["name"]))]
    return bool(s["requires_grad"].astype(bool).any()) if len(s) else bool(
        group["requires_grad"].any())


@verdict("rank_dependent_use", "warning",
         "(distributed) Used on some ranks and not on others in the same step.", per_rank=True,
         needs="ranks")
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
