"""The fixed vocabulary of verdicts (SPEC section 3), each a pure rule over the two tables.

A rule takes `(params, steps)` and returns a boolean Series aligned with `params`. Adding a
verdict is one decorated function here plus one test. A rule that raises does not stop the
others: `judge` reports it as an error, and the CLI and report show it as a finding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd

from .summary import collapse_ranks

Rule = Callable[[pd.DataFrame, pd.DataFrame], pd.Series]


@dataclasses.dataclass(frozen=True)
class Verdict:
    name: str
    severity: str
    meaning: str
    rule: Rule
    per_rank: bool = False  # sees every rank's rows; the others see one row per (step, tensor)


VERDICTS: dict[str, Verdict] = {}


def verdict(name: str, severity: str, meaning: str, per_rank: bool = False):
    def register(rule: Rule) -> Rule:
        VERDICTS[name] = Verdict(name, severity, meaning, rule, per_rank)
        return rule
    return register


# ------------------------------------------------------------------ helpers
def _per_tensor(params: pd.DataFrame, steps: pd.DataFrame, mask: pd.Series) -> pd.Series:
    """Count of steps (rows) where `mask` holds, per tensor, aligned with params."""
    counts = mask.groupby(steps["name"]).sum() if len(steps) else pd.Series(dtype=int)
    return params["name"].map(counts).fillna(0).astype(int)


def _rg_used_counts(params, steps):
    rg = steps["requires_grad"].astype(bool)
    used = steps["used"].astype(bool)
    return _per_tensor(params, steps, rg), _per_tensor(params, steps, rg & used)


def _has_elements(params):
    """An empty tensor can neither change nor carry a non-zero gradient: nothing to report."""
    return params["numel"].fillna(1) > 0


def _in_optimizer(params):
    return params["n_optimizers"] > 0


# ------------------------------------------------------------------ rules
@verdict("orphan", "error",
         "requires grad, receives gradients, held by no optimizer: never trained")
def orphan(params, steps):
    used_while_rg = _rg_used_counts(params, steps)[1]
    return (used_while_rg > 0) & ~_in_optimizer(params)


@verdict("unused", "warning",
         "requires grad, yet receives a gradient on none of the steps on which it requires grad")
def unused(params, steps):
    rg, used = _rg_used_counts(params, steps)
    return (rg > 0) & (used == 0)


@verdict("intermittent", "info",
         "receives gradients on some, but not all, of the steps on which it requires grad")
def intermittent(params, steps):
    rg, used = _rg_used_counts(params, steps)
    return (used > 0) & (used < rg)


@verdict("grad_not_cleared", "warning",
         "its first gradient of a step landed on a non-zero .grad: nothing zeroes it")
def grad_not_cleared(params, steps):
    return _per_tensor(params, steps, steps["carried_grad"].astype(bool)) > 0


@verdict("frozen_in_optimizer", "warning",
         "held by an optimizer while requires_grad is False (at the last step)")
def frozen_in_optimizer(params, steps):
    return _in_optimizer(params) & ~params["requires_grad"].astype(bool)


@verdict("frozen_but_changing", "error",
         "its value changed on a step on which it did not require grad")
def frozen_but_changing(params, steps):
    mask = steps["changed"].astype(bool) & ~steps["requires_grad"].astype(bool)
    return _per_tensor(params, steps, mask) > 0


@verdict("stalled", "error",
         "requires grad, held by an optimizer, receives gradients, yet never changed")
def stalled(params, steps):
    used = _per_tensor(params, steps, steps["used"].astype(bool))
    changed = _per_tensor(params, steps, steps["changed"].astype(bool))
    return (params["requires_grad"].astype(bool) & _in_optimizer(params)
            & (used > 0) & (changed == 0) & _has_elements(params))


@verdict("zero_gradient", "warning", "receives gradients, every one of them exactly zero")
def zero_gradient(params, steps):
    used = steps["used"].astype(bool)
    nonzero = used & ~(steps["grad_norm"] == 0)
    return ((_per_tensor(params, steps, used) > 0) & (_per_tensor(params, steps, nonzero) == 0)
            & _has_elements(params))


@verdict("nonfinite_grad", "error", "a gradient held NaN or Inf")
def nonfinite_grad(params, steps):
    return _per_tensor(params, steps, steps["nonfinite"].astype(bool)) > 0


@verdict("decay_on_norm_or_bias", "info",
         "weight decay > 0 on a bias or on a weight of a normalization module")
def decay_on_norm_or_bias(params, steps):
    is_bias = params["name"].str.endswith("bias")
    is_norm = params["module_type"].fillna("").str.contains("Norm", regex=False)
    return (params["weight_decay"].fillna(0) > 0) & (is_bias | is_norm)


@verdict("in_multiple_optimizers", "error", "held by more than one optimizer: stepped twice")
def in_multiple_optimizers(params, steps):
    return params["n_optimizers"] > 1


@verdict("not_in_model", "warning",
         "held by an optimizer but not a parameter of the model")
def not_in_model(params, steps):
    return _in_optimizer(params) & ~params["in_model"].astype(bool)


@verdict("rank_divergent", "error", "(distributed) its value differs between ranks after a step",
         per_rank=True)
def rank_divergent(params, steps):
    if "rank" not in steps or "checksum" not in steps:
        return pd.Series(False, index=params.index)
    spread = steps.groupby(["step", "name"])["checksum"].nunique(dropna=False)
    divergent = spread[spread > 1].index.get_level_values("name").unique()
    return params["name"].isin(divergent)


@verdict("rank_dependent_use", "warning",
         "(distributed) used on some ranks and not others in the same step", per_rank=True)
def rank_dependent_use(params, steps):
    if "rank" not in steps:
        return pd.Series(False, index=params.index)
    spread = steps.groupby(["step", "name"])["used"].nunique()
    mixed = spread[spread > 1].index.get_level_values("name").unique()
    return params["name"].isin(mixed)


# ------------------------------------------------------------------ judging
SEVERITY = {name: v.severity for name, v in VERDICTS.items()}


def judge(params: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.Series, list[tuple[str, str]]]:
    """Every verdict for every tensor, plus (verdict, error) for rules that crashed."""
    hits: dict[str, pd.Series] = {}
    errors: list[tuple[str, str]] = []
    per_step = collapse_ranks(steps)
    for name, v in VERDICTS.items():
        try:
            result = v.rule(params, steps if v.per_rank else per_step)
            hits[name] = pd.Series(result, index=params.index).fillna(False).astype(bool)
        except Exception as exc:  # a broken rule is a finding, never a crash
            errors.append((name, f"{type(exc).__name__}: {exc}"))
    names = list(hits)
    matrix = (np.column_stack([hits[n].to_numpy() for n in names]) if names
              else np.zeros((len(params), 0), dtype=bool))
    verdicts = [tuple(names[j] for j in np.flatnonzero(row)) or ("ok",) for row in matrix]
    return pd.Series(verdicts, index=params.index, dtype=object), errors
