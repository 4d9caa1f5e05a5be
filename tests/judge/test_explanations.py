"""What the orphan and rank_divergent findings say is what the steps show: no `module.` blame
the names cannot support, no "never cleared" claim when something clears the .grad, no
"nan → nan" or "0 → 0", and the concrete cause of a divergence between ranks."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

import diagkit
from tables import T, tables
from diagkit.judge.findings import build_findings
from diagkit.judge.verdicts import judge


def findings(params, steps):
    params["verdicts"], errors = judge(params, steps)
    assert errors == []
    return build_findings(params, steps)


def one(found, code):
    (finding,) = [f for f in found if f.code == code]
    return finding


# ------------------------------------------------------------------ orphan
def test_an_orphan_whose_grad_piles_up_says_so_with_its_norms():
    f = one(findings(*tables(T("mem", held=False, carried_grad=[False, True, True],
                               grad_total_norm=[1.0, 2.0, 3.0]))), "orphan")
    assert "nothing clears its .grad" in f.message and "pile up" in f.message
    assert "(.grad norm 1 → 3 over 3 steps)" in f.message


def test_an_orphan_cleared_by_something_else_is_not_said_to_pile_up():
    f = one(findings(*tables(T("mem", held=False, carried_grad=False,
                               grad_total_norm=[1.0, 1.2, 0.9]))), "orphan")
    assert "never clears" not in f.message and "pile up across" not in f.message
    assert "nothing clears" not in f.message
    assert "something else clears it between steps, e.g. model.zero_grad()" in f.message


@pytest.mark.parametrize("norms", [[math.nan] * 3, [0.0] * 3, [math.nan, 0.0, math.nan]])
@pytest.mark.parametrize("carried", [True, False])
def test_no_nan_or_zero_trajectory_is_ever_printed(norms, carried):
    found = findings(*tables(T("mem", held=False, carried_grad=[False, carried, carried],
                               grad_total_norm=norms)))
    for f in found:
        assert "nan" not in f.message.lower() and "0 → 0" not in f.message
        assert "→" not in f.message


def test_a_trajectory_skips_the_steps_without_a_measured_norm():
    f = one(findings(*tables(T("mem", held=False, carried_grad=[False, True, True, True],
                               grad_total_norm=[math.nan, 2.0, 0.0, 4.0]))), "orphan")
    assert "(.grad norm 2 → 4 over 2 steps)" in f.message


def test_the_module_prefix_is_blamed_only_for_names_that_carry_it():
    wrapped = one(findings(*tables(T("module.meta.mem", held=False), T("module.meta.w"))),
                  "orphan")
    assert 'not n.startswith("module.meta")' in wrapped.message
    plain = one(findings(*tables(T("meta.mem", held=False), T("meta.w"))), "orphan")
    assert "module." not in plain.message + plain.fix and "startswith" not in plain.message


class WithMemory(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 2)
        self.memory = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return self.body(x) + self.memory


def _orphan_run(clear_with_model_zero_grad: bool):
    """A real run whose optimizer leaves `memory` out; the loop clears .grad with
    model.zero_grad() or only with optimizer.zero_grad()."""
    torch.manual_seed(0)
    model = WithMemory()
    opt = torch.optim.SGD(model.body.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)

    def train_step(_i):
        (model if clear_with_model_zero_grad else opt).zero_grad()
        loss = model(torch.randn(3, 4, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    return diagkit.diagnose(model, opt, train_step=train_step, steps=4)


def test_a_real_orphan_cleared_by_model_zero_grad():
    diag = _orphan_run(clear_with_model_zero_grad=True)
    assert diag.verdicts()["memory"] == {"orphan"}
    f = one(diag.findings, "orphan")
    assert "something else clears it between steps" in f.message
    assert "pile up across" not in f.message and "module." not in f.message


def test_a_real_orphan_only_optimizer_zero_grad_piles_up():
    diag = _orphan_run(clear_with_model_zero_grad=False)
    assert diag.verdicts()["memory"] == {"orphan", "grad_not_cleared"}
    f = one(diag.findings, "orphan")
    assert "pile up across steps (.grad norm" in f.message and "over 4 steps" in f.message


# ------------------------------------------------------------------ rank_divergent
def per_rank(params, steps, drifting: str):
    """Two ranks; `drifting`'s checksum differs on rank 1 from step 1 on."""
    steps = pd.concat([steps.assign(rank=r) for r in (0, 1)], ignore_index=True)
    steps["checksum"] = 1.0
    steps.loc[(steps["rank"] == 1) & (steps["name"] == drifting) & (steps["step"] >= 1),
              "checksum"] = 2.0
    return params, steps


def test_divergent_after_requires_grad_changed_names_the_step_and_rebuilding_ddp():
    f = one(findings(*per_rank(*tables(T("scale", requires_grad=[False, True, True],
                                         used=[False, True, True],
                                         changed=[False, True, True]), T("w")), "scale")),
            "rank_divergent")
    assert f.params == ("scale",)
    assert "requires_grad changed during the run (`scale` False → True at step 1)" in f.message
    assert "re-create DDP after changing it" in f.fix
    assert "DistributedDataParallel(model.module" in f.fix


def test_divergent_outside_the_model_says_ddp_never_averages_it():
    name = "<optimizer 0 group 1 #0>"
    f = one(findings(*per_rank(*tables(T(name, in_model=False, module=""), T("w")), name)),
            "rank_divergent")
    assert "not a parameter of the model DDP wraps" in f.message
    assert "Register it on the model" in f.fix


def test_divergent_while_trainable_and_averaged_is_a_change_outside_the_gradient():
    """Equal .grad norms on both ranks at every step: DDP averaged; no unfreezing guessed
    (the causes DDP's facts name: tests/judge/test_rank_causes.py)."""
    f = one(findings(*per_rank(*tables(T("w"), T("v")), "w")), "rank_divergent")
    assert "required grad on every observed step" in f.message
    assert "averaged across ranks on every observed step" in f.message
    assert "outside the gradient" in f.message and "unfrozen" not in f.message


def test_divergent_while_frozen_throughout_is_an_update_outside_the_gradient():
    f = one(findings(*per_rank(*tables(T("buf", requires_grad=False, used=False), T("w")),
                               "buf")), "rank_divergent")
    assert "never required grad" in f.message and "outside the gradient" in f.message
    assert "broadcast" in f.fix
