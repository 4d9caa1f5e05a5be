"""Meta tensors in a real watch (docs/meta.md, "Meta tensors in a real run"): the optimizer built
before `to_empty()` holds them; they are inventoried and judged on the wiring alone, their value
columns not measured (NaN, <NA>), and no value of theirs is ever read (a read raised before)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import diagkit
from diagkit.judge.verdicts import VERDICTS

VALUE_NORMS = ("grad_norm", "grad_total_norm", "delta_norm", "update_ratio")
VALUE_COUNTS = ("changed_steps", "carried_steps", "nonfinite_steps")


def built_on_meta():
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def materialised(model):
    """The big-model init: real storage, then each module's own initialisation."""
    torch.manual_seed(0)
    model.to_empty(device="cpu")
    for module in model:
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model


def tensor_verdicts(diag) -> dict[str, set[str]]:
    """Each tensor's own verdicts (a run-level verdict speaks of the whole run)."""
    return {name: {v for v in vs if not getattr(VERDICTS.get(v), "run_level", False)}
            for name, vs in diag.verdicts().items()}


def meta_rows(diag) -> pd.DataFrame:
    return diag.params[diag.params["device"] == "meta"]


def assert_not_measured(rows: pd.DataFrame) -> None:
    """Value columns of tensors on meta: NaN norms, <NA> counts (as a dry run's)."""
    assert len(rows)
    for column in VALUE_NORMS:
        assert rows[column].isna().all(), column
    for column in VALUE_COUNTS:
        assert rows[column].isna().all(), column


@pytest.mark.parametrize("delta", ["exact", "sampled", "off"])
def test_an_optimizer_built_before_to_empty_holds_meta_tensors_not_in_model(delta):
    """The issue's reproduction: watch() raised a torch error out of the user's program."""
    model = built_on_meta()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # holds the meta tensors
    materialised(model)
    w = diagkit.watch(model, opt, steps=3, delta=delta)
    for _ in range(3):
        loss = model(torch.randn(2, 16)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    diag = w.diagnosis
    assert diag.failure is None and diag.meta["steps_observed"] == 3
    verdicts = tensor_verdicts(diag)
    real = ["0.weight", "0.bias", "2.weight", "2.bias"]
    # optimizer.zero_grad() clears only what it holds: the orphans' .grad piles up too
    assert {n: verdicts.pop(n) for n in real} == {n: {"orphan", "grad_not_cleared"}
                                                  for n in real}
    assert verdicts == {f"<optimizer 0 group 0 #{k}>": {"not_in_model", "unused"}
                        for k in range(4)}
    assert_not_measured(meta_rows(diag))
    assert not diag.params.loc[diag.params["device"] == "cpu", "grad_norm"].isna().any()
    stale = next(f for f in diag.findings if f.code == "not_in_model")
    assert "optimizer was built before the model was materialised" in stale.message
    assert stale.fix.startswith("Build the optimizer after materialising")
    # nothing in the run trains, and the run-level finding names this cause, not a freeze
    # loop or an adapter (judge/rules_run.py)
    [nothing] = [f for f in diag.findings if f.code == "nothing_trains"]
    assert "optimizer was built before the model was materialised" in nothing.message
    assert "freeze loop" not in nothing.message and "PeftModel" not in nothing.fix
    assert nothing.fix.startswith("Build the optimizer after materialising")


@pytest.mark.parametrize("steps", [3, None])
def test_a_step_on_meta_is_judged_on_the_wiring_alone(steps):
    """A whole step on meta (a dry step inside the user's loop): autograd reaches the meta
    tensors, so `used` is measured; nothing of their values is read (their gradients' norms
    were read back from meta and failed the watch), and no verdict that needs values is
    guessed from flags that were not measured (`stalled` was)."""
    model = built_on_meta()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    w = diagkit.watch(model, opt, steps=steps)
    for _ in range(3):  # no zero_grad: each .grad lands on the last one (carried, on values)
        model(torch.randn(2, 16, device="meta")).sum().backward()
        opt.step()
    diag = w.stop()
    assert diag.failure is None and diag.meta["steps_observed"] == 3
    assert set().union(*tensor_verdicts(diag).values()) == {"ok"}
    assert (diag.params["used_steps"] == 3).all()
    assert_not_measured(diag.params)
    flags = diag.steps[["carried_grad", "changed", "nonfinite"]].astype(bool)
    assert not flags.to_numpy().any()  # never guessed True


def test_real_and_meta_modules_in_one_watch():
    """One watch over a real module and a meta one, each trained by its own optimizer: the read
    back mixes devices, and the real tensors are measured as without the meta ones."""
    torch.manual_seed(0)
    real = nn.Linear(4, 3)
    dry = built_on_meta()
    opts = [torch.optim.SGD(real.parameters(), lr=0.1), torch.optim.SGD(dry.parameters(), lr=0.1)]
    w = diagkit.watch({"real": real, "dry": dry}, opts, steps=2)
    for _ in range(2):
        for o in opts:
            o.zero_grad()
        real(torch.randn(2, 4)).sum().backward()
        dry(torch.randn(2, 16, device="meta")).sum().backward()
        for o in opts:
            o.step()
    diag = w.diagnosis
    assert diag.failure is None
    assert set().union(*tensor_verdicts(diag).values()) == {"ok"}
    assert_not_measured(meta_rows(diag))
    measured = diag.params[diag.params["device"] == "cpu"]
    assert len(measured) == 2 and (measured["changed_steps"] == 2).all()
    assert np.isfinite(measured["grad_norm"].astype(float)).all()


def test_diagnose_restores_a_run_whose_optimizer_holds_meta_tensors():
    """`diagnose` saves everything it touches to put it back: a meta tensor has no values to
    copy (its host copy raised)."""
    model = built_on_meta()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    materialised(model)
    before = [p.detach().clone() for p in model.parameters()]
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: torch.randn(2, 16),
                            loss_fn=lambda m, batch: m(batch).sum(), steps=2)
    assert diag.failure is None
    assert "not_in_model" in set().union(*tensor_verdicts(diag).values())
    assert_not_measured(meta_rows(diag))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert all(p.is_meta for g in opt.param_groups for p in g["params"])
    assert math.isnan(float(meta_rows(diag)["delta_norm"].iloc[0]))
