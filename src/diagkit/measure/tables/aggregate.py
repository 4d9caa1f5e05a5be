"""Fold the tables: ranks into one row per (step, tensor), and steps into one row per tensor.

`fold_ranks` is the one way a distributed run's per-rank rows become one row: the judge's
rules, the advice, every table and figure and the explorer all read its result, so they agree.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...core.schema import PARAMS_COLUMNS, STEPS_COLUMNS


def join_rank_rows(by_rank: dict[int, list[dict]]) -> list[dict]:
    """Every rank's inventory rows as one list, joined by name.

    Under DDP or FSDP every rank holds the same tensors, and rank 0's rows stand for all (as
    they always have). Under pipeline parallelism each stage holds its own: every tensor then
    gets the row of the lowest rank that holds it (its own optimizer's memberships, lr and
    decay), with `stage` naming the ranks that hold it, so a tensor on the last stage is
    judged on that stage's facts. Its steps come from those ranks alone, so it is never
    compared across ranks that do not hold it (`judge.rules_ranks` compares rows of the same
    step and name). Sameness is decided on the model's and the optimizers' tensors: an
    unregistered tensor one rank found is not a stage."""
    ranks = sorted(by_rank)
    if not ranks:
        return []
    held = {r: {row["name"] for row in by_rank[r] if row["in_model"] or row["memberships"]}
            for r in ranks}
    if all(held[r] == held[ranks[0]] for r in ranks):
        return by_rank[ranks[0]]
    holders: dict[str, list[int]] = {}
    for r in ranks:
        for row in by_rank[r]:
            holders.setdefault(row["name"], []).append(r)
    joined, seen = [], set()
    for r in ranks:
        for row in by_rank[r]:
            if row["name"] not in seen:
                seen.add(row["name"])
                joined.append({**row, "stage": ",".join(map(str, holders[row["name"]]))})
    return joined


def build_params(rows: list[dict], steps: pd.DataFrame) -> pd.DataFrame:
    """Static facts (the inventory's rows) joined with aggregates over the observed steps."""
    params = pd.DataFrame(rows)
    params["optimizer"] = params["optimizer"].astype("Int64")
    params["group"] = params["group"].astype("Int64")
    agg = aggregate_steps(steps)
    params = params.merge(agg, how="left", left_on="name", right_index=True,
                          suffixes=("_static", ""))
    # Before any step ran, requires_grad and lr are what the inventory saw.
    for col in ("requires_grad", "lr"):
        params[col] = params[col].where(params[col].notna(), params[f"{col}_static"])
    params["requires_grad"] = params["requires_grad"].astype(bool)
    for col in ("steps", "rg_steps", "used_steps", "changed_steps", "carried_steps",
                "nonfinite_steps", "skipped_steps"):
        params[col] = params[col].fillna(0).astype(np.int64)
    params["verdicts"] = [()] * len(params)
    return params[list(PARAMS_COLUMNS)].reset_index(drop=True)


# How the ranks' rows of one (step, tensor) fold into one: "any rank" for facts about use and
# change, the lowest rank's value for measurements (DDP makes them equal where it syncs).
# `skipped` only when every rank skipped: a rank that took the step took it (and a non-finite
# gradient there is still a taken step's).
_RANK_FOLD = {"requires_grad": "any", "used": "any", "grad_norm": "first",
              "grad_total_norm": "first", "carried_grad": "any", "delta_norm": "first",
              "update_ratio": "first", "changed": "any", "lr": "first", "nonfinite": "any",
              "skipped": "all"}


def fold_ranks(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, tensor), whatever the number of ranks observed (see `_RANK_FOLD`)."""
    if "rank" not in steps.columns:
        return steps
    ordered = steps.sort_values(["step", "rank"], kind="stable")
    fold = {c: how for c, how in _RANK_FOLD.items() if c in steps.columns}
    folded = ordered.groupby(["step", "name"], sort=False).agg(fold).reset_index()
    return folded[[c for c in STEPS_COLUMNS if c in folded.columns]]


def aggregate_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Per tensor: counts of steps by fact, the last step's values, mean changes."""
    steps = fold_ranks(steps)
    if steps.empty:  # the first step failed: nothing observed, every count is zero
        columns = ["requires_grad", "lr", "steps", "rg_steps", "used_steps", "changed_steps",
                   "carried_steps", "nonfinite_steps", "skipped_steps", "grad_norm",
                   "grad_total_norm", "delta_norm", "update_ratio"]
        empty = pd.DataFrame({c: pd.Series(dtype=bool if c == "requires_grad" else float)
                              for c in columns})
        return empty.rename_axis("name")
    s = steps.sort_values("step", kind="stable")
    g = s.groupby("name", sort=False)
    used_grad = s["grad_norm"].where(s["used"])
    last = s.drop_duplicates("name", keep="last").set_index("name")
    out = pd.DataFrame({
        "requires_grad": last["requires_grad"],
        "lr": last["lr"],
        "steps": g["step"].nunique(),
        "rg_steps": g["requires_grad"].sum(),
        "used_steps": g["used"].sum(),
        "changed_steps": g["changed"].sum(),
        "carried_steps": g["carried_grad"].sum(),
        "nonfinite_steps": g["nonfinite"].sum(),
        "skipped_steps": (g["skipped"].sum() if "skipped" in s.columns
                          else g["step"].nunique() * 0),
        "grad_norm": used_grad.groupby(s["name"], sort=False).last(),
        "grad_total_norm": last["grad_total_norm"],
        "delta_norm": g["delta_norm"].mean(),
        "update_ratio": g["update_ratio"].mean(),
    })
    out.index.name = "name"
    return out
