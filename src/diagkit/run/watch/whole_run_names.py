"""A whole run's tensors keep one name each across the run (docs/whole-run.md, "Tensors
replaced mid-run"): names are by identity, as everything else in diagkit is.

A loop that replaces its head at step 150 (`model.head = nn.Linear(...)`) gives the name
`head.weight` to a new tensor. The old one is not the new one: its steps, its row and its
verdicts are renamed `<head.weight, replaced at step 150>` (or `removed`, when no tensor took
the name), so the table never merges the two (the old tensor's verdicts on the new one, its
steps counted as the new one's); if an optimizer still holds it, the inventory names it so
from then on (`measure.model.inventory.take_inventory`'s `former`), not `<optimizer 0 group 0 #2>`.
Angle brackets, as for any tensor the model cannot reach: it is nowhere in the model now.
"""

from __future__ import annotations

import dataclasses
import weakref

from ...core.schema import former_name
from ...measure.engines.fsdp1 import clean_name


class Names:
    """The names a whole run gave the tensors that left the model, by identity (weakly held:
    a tensor no one holds any more is forgotten)."""

    def __init__(self):
        self._left: dict[int, tuple[weakref.ref, str]] = {}

    def former(self, old, model, step: int) -> dict[int, str]:
        """Names by id for `take_inventory(..., former=)` at a change at `step`: what each
        tensor of `old` (the inventory before) is called if the model no longer holds it."""
        now = {clean_name(n) for n, _ in model.named_parameters()}
        left = {k: name for k, (ref, name) in self._left.items() if ref() is not None}
        for tensor, row in zip(old.tensors, old.rows):
            if row["in_model"] and id(tensor) not in left:
                how = "replaced" if row["name"] in now else "removed"
                left[id(tensor)] = former_name(row["name"], how, step)
        return left

    def renames(self, old, new, former: dict[int, str]) -> dict[str, str]:
        """Old name -> new name for every tensor of `old` whose name changed: one the new
        inventory holds under another name, or one gone whose name another tensor took."""
        now = {id(t): row["name"] for t, row in zip(new.tensors, new.rows)}
        taken = set(now.values())
        out = {}
        for tensor, row in zip(old.tensors, old.rows):
            name = now.get(id(tensor))
            if name is None and row["name"] in taken:
                name = former.get(id(tensor))
            if name is not None and name != row["name"]:
                out[row["name"]] = name
                if name.startswith("<") and id(tensor) in former:
                    self._hold(tensor, name)
        return out

    def _hold(self, tensor, name: str) -> None:
        try:
            self._left[id(tensor)] = (weakref.ref(tensor), name)
        except TypeError:  # a tensor type without weak references: named again next time
            pass


def rename_history(run, names: dict[str, str]) -> None:
    """Rename, by `names`, everything a whole run kept of its past windows: the latest rows,
    the verdicts, what zero_gradient could tell, the kept steps, the findings' tensors."""
    if not names:
        return
    def mapped(n):
        return names.get(n, n)
    run.rows = {mapped(k): ({**row, "name": mapped(k)} if k in names else row)
                for k, row in run.rows.items()}
    run.verdicts = {mapped(k): v for k, v in run.verdicts.items()}
    run.untold = set(map(mapped, run.untold))
    run.told = set(map(mapped, run.told))
    run.kept.rename(names)
    for span in run.timeline.spans:
        if any(n in names for n in span.finding.params):
            span.finding = dataclasses.replace(
                span.finding, params=tuple(map(mapped, span.finding.params)))
