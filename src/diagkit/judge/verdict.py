"""What a verdict is: its name, severity and meaning, the rule that decides it, and the
explanation (message and fix) of a finding made of it, declared together in one place.

Rules live in the `rules_*` modules, one small function per verdict, each followed by its
explanation; `diagkit.judge.verdicts` gathers them in the order of the README's table.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd

from ..core import severity as _severity

Rule = Callable[[pd.DataFrame, pd.DataFrame], pd.Series]
# explain(label, group, steps) -> (message, fix): `group` is the params rows of one finding,
# `label` its module subtree ('' for the whole model), `steps` the rank-folded steps table.
Explain = Callable[[str, pd.DataFrame, pd.DataFrame], tuple[str, str]]

REGISTRY: dict[str, "Verdict"] = {}
# The key, in the attrs of the params `judge` was given, of the run-level verdicts that hold.
RUN_VERDICTS = "run_verdicts"
# What a rule may need beyond the wiring, and how a meta dry run words its absence.
NEEDS = {None: "", "values": "needs values", "steps": "needs more than one step",
         "ranks": "needs a distributed run"}


@dataclasses.dataclass
class Verdict:
    """A verdict of the fixed vocabulary. `rule(params, steps)` returns a boolean Series
    aligned with `params`; `per_rank` rules see every rank's rows, the others one row per
    (step, tensor).

    `needs`: what the rule reads beyond the wiring ("values": a change, a gradient's norm or
    finiteness; "steps": more than one step; "ranks": a distributed run), or None when the
    wiring alone decides it. A dry run on the meta device (one pass, no values) runs only the
    rules that need nothing, and reports the others as not measured on meta."""

    name: str
    severity: str
    meaning: str
    rule: Rule
    per_rank: bool = False
    explain: Explain | None = None
    needs: str | None = None
    # It speaks of optimizer membership: with no optimizer at all (a hand-written update,
    # `watch(model)`) it means nothing, and is not judged.
    membership: bool = False
    # It speaks of the run, not of one tensor: its rule flags every row or none, `judge`
    # puts it on no tensor's verdicts but in `RUN_VERDICTS` of the params' attrs, and it makes
    # one finding for the whole run (`judge.findings`).
    run_level: bool = False

    def __post_init__(self):
        if self.severity not in _severity.LEVELS:
            raise ValueError(f"verdict {self.name!r}: unknown severity {self.severity!r}")
        if self.needs not in NEEDS:
            raise ValueError(f"verdict {self.name!r}: unknown needs {self.needs!r}")

    @property
    def on_meta(self) -> bool:
        """Whether a dry run on the meta device can decide it (it needs only the wiring)."""
        return self.needs is None

    def __call__(self, params: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
        return self.rule(params, steps)

    def explains(self, explain: Explain) -> Explain:
        """Decorator: the message and fix of this verdict's findings."""
        self.explain = explain
        return explain


def verdict(name: str, severity: str, meaning: str, per_rank: bool = False,
            needs: str | None = None, membership: bool = False, run_level: bool = False):
    """Decorator: register `rule` as the verdict `name`; returns the `Verdict` (callable)."""
    def register(rule: Rule) -> Verdict:
        REGISTRY[name] = v = Verdict(name, severity, meaning, rule, per_rank, needs=needs,
                                     membership=membership, run_level=run_level)
        return v
    return register


# ------------------------------------------------------------------ helpers for rules
# Within one `judge()` call: each steps row's tensor, as its row number in params (-1: none),
# keyed by the two tables' identities. The tables are held with it, so an id stays theirs.
_ROWS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("diagkit_rows", default=None)


# Within one `judge()` call: whether the run has an optimizer at all (False: a watch of
# hand-written updates, where no tensor can be held and none needs to be).
_OPTIMIZERS: contextvars.ContextVar[bool] = contextvars.ContextVar("diagkit_optimizers",
                                                                   default=True)


@contextlib.contextmanager
def optimizers_present(present: bool):
    """Rules judged inside know whether the run has an optimizer at all: without one, a rule
    of the run as a whole (`nothing_trains`) asks nothing of membership, rather than being
    left unjudged as the membership verdicts are."""
    token = _OPTIMIZERS.set(present)
    try:
        yield
    finally:
        _OPTIMIZERS.reset(token)


def has_optimizers() -> bool:
    """Whether the run being judged has an optimizer (True outside `judge`)."""
    return _OPTIMIZERS.get()


@contextlib.contextmanager
def shared_rows():
    """Rules judged inside share the name-to-row lookup `per_tensor` counts with: each rule
    asks for several counts, and a string groupby per count was most of the judging time
    (docs/cost.md, "The fixed cost of a call")."""
    token = _ROWS.set({})
    try:
        yield
    finally:
        _ROWS.reset(token)


def _rows(params: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray | None:
    """Each steps row's position in params (-1: a name params lacks), or None when the names
    of params are not unique (then `per_tensor` counts by name, as a groupby would)."""
    memo, key = _ROWS.get(), (id(params), id(steps))
    if memo is not None and key in memo:
        return memo[key][2]
    names = pd.Index(params["name"])
    rows = names.get_indexer(steps["name"]) if names.is_unique else None
    if memo is not None:
        memo[key] = (params, steps, rows)
    return rows


def per_tensor(params: pd.DataFrame, steps: pd.DataFrame, mask: pd.Series) -> pd.Series:
    """Count of steps (rows) where `mask` holds, per tensor, aligned with params."""
    rows = _rows(params, steps) if len(mask) == len(steps) else None
    if rows is None or not mask.index.equals(steps.index):
        counts = mask.groupby(steps["name"]).sum() if len(steps) else pd.Series(dtype=int)
        return params["name"].map(counts).fillna(0).astype(int)
    hit = rows[(rows >= 0) & mask.to_numpy(dtype=bool, na_value=False)]
    return pd.Series(np.bincount(hit, minlength=len(params)), index=params.index, dtype=int)


def rg_used_counts(params, steps):
    """(steps requiring grad, of those the steps it was used) per tensor."""
    rg = steps["requires_grad"].astype(bool)
    used = steps["used"].astype(bool)
    return per_tensor(params, steps, rg), per_tensor(params, steps, rg & used)


def skipped(steps: pd.DataFrame) -> pd.Series:
    """Per row: the tensor's optimizer skipped the step (a loss scaler's overflow). A table
    saved before the column existed has no skipped step."""
    if "skipped" not in steps.columns:
        return pd.Series(False, index=steps.index)
    return steps["skipped"].fillna(False).astype(bool)


def has_elements(params):
    """An empty tensor can neither change nor carry a non-zero gradient: nothing to report."""
    return params["numel"].fillna(1) > 0


def in_optimizer(params):
    return params["n_optimizers"] > 0
