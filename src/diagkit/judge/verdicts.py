"""The fixed vocabulary of verdicts (the README's table), and `judge`, which applies them.

Importing this module registers every rule, in the order of the README's table. A rule that
raises does not stop the others: `judge` reports it, and the findings show it as an error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core import severity
from ..measure.aggregate import fold_ranks
from . import rules_use, rules_change, rules_groups, rules_ranks  # noqa: F401  (registration)
from .verdict import REGISTRY, Verdict

VERDICTS: dict[str, Verdict] = REGISTRY


def severity_of(verdict: str) -> str:
    """'error' / 'warning' / 'info' of a verdict, 'ok' for ok, `severity.UNKNOWN` for a name
    this version does not know (a diagnosis saved by a newer one)."""
    if verdict == "ok":
        return "ok"
    v = VERDICTS.get(verdict)
    return v.severity if v is not None else severity.UNKNOWN


def worst_verdict_severity(verdicts) -> str:
    """The worst severity among one tensor's verdicts ('ok' when none applies)."""
    return severity.worst(severity_of(v) for v in verdicts if v != "ok") or "ok"


def judge(params: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.Series, list[tuple[str, str]]]:
    """Every verdict for every tensor, plus (verdict, error) for rules that crashed."""
    hits: dict[str, pd.Series] = {}
    errors: list[tuple[str, str]] = []
    per_step = fold_ranks(steps)
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
