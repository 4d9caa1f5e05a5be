"""What the explorer's pickers offer: the verdicts present (with counts), the module subtrees,
the tensors that pass the filters (capped, with a note when capped or empty). Plain functions
over the state's tables (`explorer_state` calls them); presents only, never measures.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from ..core import severity
from ..judge.verdicts import severity_of


class Options(NamedTuple):
    """What the tensor picker offers: (label, name) pairs, how many matched, and a note."""

    choices: list[tuple[str, str]]
    total: int
    note: str


def verdict_choices(masks: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """(label with count, verdict) for every verdict present (`masks`: verdict -> which
    tensors carry it), most severe first."""
    present = sorted(masks, key=lambda v: (v == "ok", -severity.rank(severity_of(v)), v))
    return [(f"{v} ({int(masks[v].sum()):,})", v) for v in present]


def module_choices(modules: pd.Series) -> list[str]:
    """Every module subtree that holds a tensor (`modules`: each tensor's module), shortest
    first."""
    found = set()
    for module in pd.unique(modules):
        parts = module.split(".") if module else []
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(found, key=lambda m: (m.count("."), m))


def options(rows: np.ndarray, selected: list[str], index: dict[str, int], label, names,
            most: int) -> Options:
    """The tensor picker's choices: the rows passing the filters (`rows`, problems first; at
    most `most`), plus any selected tensor not among them; `label(i)` names row i."""
    shown = list(rows[:most])
    listed = {names[i] for i in shown}
    shown += [index[n] for n in selected if n not in listed and n in index]
    choices = [(label(i), names[i]) for i in shown]
    total = len(rows)
    if total == 0:
        note = "no tensor matches the filters"
    elif total > most:
        note = (f"the picker lists the first {most:,} of {total:,} matching tensors "
                f"(problems first); narrow the filters to reach the others")
    else:
        note = ""
    return Options(choices, total, note)
