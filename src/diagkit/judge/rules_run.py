"""Verdicts about the run as a whole: whether anything in it can train at all.

A run-level rule flags every tensor or none; `judge` keeps it out of the tensors' verdicts
(it is the run's, in the params' attrs) and `build_findings` makes one finding of it, over
every tensor. Each rule is followed by its explanation (see `diagkit.judge.verdict`)."""

from __future__ import annotations

import pandas as pd

from ..core.format import human_bytes
from .verdict import has_optimizers, in_optimizer, rg_used_counts, verdict
from .wording import roots


def trainable(params: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """Per tensor: it can train in this run. It required grad and got a gradient on one same
    observed step, and an optimizer holds it (any tensor, in a run with no optimizer at all:
    its updates are hand-written). Before any observed step (a first step that failed) only
    the wiring can tell: it requires grad and an optimizer holds it."""
    held = in_optimizer(params) if has_optimizers() else True
    if not len(steps):
        return params["requires_grad"].astype(bool) & held
    return (rg_used_counts(params, steps)[1] > 0) & held


@verdict("nothing_trains", "error",
         ("(run level) Nothing in the run can train: no tensor requires grad, or no optimizer "
          "holds a tensor that does and gets gradients (an adapter loaded not trainable, a "
          "freeze loop that froze everything, groups filtered empty). One finding for the "
          "whole run, in no tensor's verdicts."),
         run_level=True)
def nothing_trains(params, steps):
    """A tensor held by an optimizer but never reached by the loss (a stray tensor beside a
    frozen model) trains nothing either: "holds a tensor that does" is read as one that can
    change the model's output, so it asks for a gradient too. With no optimizer at all
    (`watch(model)`, hand-written updates) membership means nothing: only "no tensor requires
    grad and gets gradients" is judged."""
    nothing = len(params) > 0 and not trainable(params, steps).any()
    return pd.Series(nothing, index=params.index, dtype=bool)


@nothing_trains.explains
def _explain_nothing_trains(label, group, steps):
    wants, reached = _wanted(group, steps)
    held = in_optimizer(group)
    model = group["in_model"].astype(bool)
    size = human_bytes(int(group["bytes"].sum()))
    if not wants.any():
        why = f"none of its {len(group)} tensors ({size}) requires grad"
    elif not reached.any():
        why = (f"{int(wants.sum())} tensor(s) require grad, but the loss reaches none of them "
               "(not one got a gradient)"
               + ("" if (wants & model).any()
                  else f", and none of the model's {int(model.sum())} tensors requires grad"))
    else:
        why = (f"{int(reached.sum())} tensor(s) require grad and get gradients, but no optimizer "
               "holds any of them (" + ("the optimizers' groups are empty" if not held.any()
                                        else "the optimizers hold only other tensors") + ")")
    stale = _stale_meta(group)
    message = (f"Nothing in this run can train: {why}, so no optimizer step can change what "
               "the model computes. " + (_STALE_CAUSE if stale else _causes(group)))
    if stale:
        return message, _STALE_FIX
    model = roots(group).whole()
    fix = ("Make what should train trainable, then build the optimizer from it: for an adapter, "
           "PeftModel.from_pretrained(base, path, is_trainable=True) (check with "
           f"{model}.print_trainable_parameters()); after a freeze loop, unfreeze the part to "
           f"train: for p in {model}.<part>.parameters(): p.requires_grad_(True); then "
           f"torch.optim.AdamW([p for p in {model}.parameters() if p.requires_grad], ...), "
           "built after both.")
    return message, fix


def _wanted(group: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per tensor: it required grad on an observed step, and it also got a gradient on one
    (before any observed step: it requires grad, for both)."""
    if not len(steps):
        rg = group["requires_grad"].astype(bool)
        return rg, rg
    rg, used = rg_used_counts(group, steps)
    return rg > 0, used > 0


_STALE_CAUSE = ("Cause: the optimizer was built before the model was materialised: it holds "
                "the tensors on the meta device, and to_empty() (or load_state_dict(..., "
                "assign=True)) gave the model new ones, which no optimizer holds.")
_STALE_FIX = ("Build the optimizer after materialising: model.to_empty(device=...); "
              "initialise or load the weights; then optimizer = torch.optim.AdamW("
              "[p for p in model.parameters() if p.requires_grad], ...).")


def _stale_meta(group: pd.DataFrame) -> bool:
    """The optimizers hold only tensors on the meta device that are not the model's (built
    before `to_empty()`), while the model's own tensors are real: docs/meta.md."""
    held = in_optimizer(group)
    if not held.any() or "device" not in group:
        return False
    meta = group["device"].astype(str) == "meta"
    return bool((meta[held] & ~group["in_model"].astype(bool)[held]).all()
                and (~meta[group["in_model"].astype(bool)]).any())


def _causes(group: pd.DataFrame) -> str:
    """The likely causes, the adapter's first when the model has adapter tensors."""
    adapter = (group["name"].str.contains(".lora_", regex=False).any()
               or group["module_type"].fillna("").str.contains("Lora", regex=False).any())
    causes = ["a freeze loop that froze everything (for p in model.parameters(): "
              "p.requires_grad_(False), with nothing unfrozen after)",
              "param groups filtered empty (a name or requires_grad filter that matches "
              "nothing)"]
    peft = ("a PEFT adapter loaded not trainable (PeftModel.from_pretrained(...) defaults to "
            "is_trainable=False)")
    causes.insert(0 if adapter else len(causes), peft)
    return "Likely: " + "; or ".join(causes) + "."
