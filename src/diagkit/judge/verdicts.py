"""The fixed vocabulary of verdicts (the README's table), and `judge`, which applies them.

Importing this module registers every rule, in the order of the README's table. A rule that
raises does not stop the others: `judge` reports it, and the findings show it as an error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core import severity
from ..measure.tables.aggregate import fold_ranks
from . import (rules_run, rules_use, rules_change, rules_groups,  # noqa: F401  (registration)
               rules_ranks)
from .verdict import (NEEDS, REGISTRY, RUN_VERDICTS, Verdict, optimizers_present,
                      shared_rows)

VERDICTS: dict[str, Verdict] = REGISTRY
# Why a membership verdict is not judged: `meta["not_judged"]` maps each such verdict to it.
NO_OPTIMIZER = "no optimizer"


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


def bytes_per_verdict(params: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """verdict -> (tensors, bytes) over `params`' verdicts, worst severity first, then the most
    bytes: what the report's banner and `check`'s text lead with."""
    sizes = pd.to_numeric(params["bytes"], errors="coerce").fillna(0).astype(np.int64)
    counts: dict[str, list[int]] = {}
    for vs, size in zip(params["verdicts"], sizes):
        for v in vs:
            c = counts.setdefault(v, [0, 0])
            c[0] += 1
            c[1] += int(size)
    order = sorted(counts, key=lambda v: (-severity.rank(severity_of(v)), -counts[v][1], v))
    return {v: (counts[v][0], counts[v][1]) for v in order}


def not_judged_without_optimizer() -> dict[str, str]:
    """The verdicts a run with no optimizer does not judge (they speak of membership)."""
    return {name: NO_OPTIMIZER for name, v in VERDICTS.items() if v.membership}


def not_measured_on_meta() -> dict[str, str]:
    """The verdicts a dry run on the meta device cannot decide, each with why (its rule's
    `needs`, declared next to the rule): reported as not measured, never guessed."""
    return {name: NEEDS[v.needs] for name, v in VERDICTS.items() if not v.on_meta}


def judge(params: pd.DataFrame, steps: pd.DataFrame, *, meta: bool = False,
          optimizers: bool = True) -> tuple[pd.Series, list[tuple[str, str]]]:
    """Every verdict for every tensor, plus (verdict, error) for rules that crashed. `meta`:
    a dry run on the meta device, where only the rules that need no values run;
    `optimizers=False`: no optimizer at all (hand-written updates), where the membership
    verdicts mean nothing and are not judged. The run-level verdicts that hold are set on
    `params.attrs[RUN_VERDICTS]`, where `build_findings` reads them: a run-level verdict is
    no tensor's, so it is in no tensor's tuple."""
    hits: dict[str, pd.Series] = {}
    errors: list[tuple[str, str]] = []
    run_level: list[str] = []
    per_step = fold_ranks(steps)
    with shared_rows(), optimizers_present(optimizers):
        for name, v in VERDICTS.items():
            if (meta and not v.on_meta) or (v.membership and not optimizers):
                continue
            try:
                result = v.rule(params, steps if v.per_rank else per_step)
                flags = pd.Series(result, index=params.index).fillna(False).astype(bool)
            except Exception as exc:  # a broken rule is a finding, never a crash
                errors.append((name, f"{type(exc).__name__}: {exc}"))
                continue
            if not v.run_level:
                hits[name] = flags
            elif flags.any():
                run_level.append(name)
    params.attrs[RUN_VERDICTS] = tuple(run_level)
    names = list(hits)
    matrix = (np.column_stack([hits[n].to_numpy() for n in names]) if names
              else np.zeros((len(params), 0), dtype=bool))
    verdicts = [tuple(names[j] for j in np.flatnonzero(row)) or ("ok",) for row in matrix]
    return pd.Series(verdicts, index=params.index, dtype=object), errors
