"""Mixed precision on real code paths: `torch.autocast` (bf16, fp16 on the CPU), a real
`torch.amp.GradScaler("cpu")` whose skipped steps are the scaler doing its job, and parameters
kept in bfloat16 whose updates round to zero."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import diagkit
from models import MLP, fixed_batch, mse_loss

STEPS = 8
# float16 overflows above 65504: a scale of 2**20 overflows the first backwards; the scaler
# halves it on each skip until the gradients fit (five skips for this model and batch).
INIT_SCALE = 2.0 ** 20
SKIPS = 5


def verdicts_seen(diag) -> set[str]:
    return set().union(*diag.verdicts().values())


class ScaledFp16:
    """A float16-autocast step under a GradScaler, noting which steps the scaler skipped (its
    scale drops exactly on those)."""

    def __init__(self, init_scale=INIT_SCALE, loss_factor=lambda i: 1.0, set_to_none=True):
        torch.manual_seed(0)
        self.model = MLP()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        self.loss_factor, self.set_to_none = loss_factor, set_to_none
        self.skipped: list[int] = []
        self.calls = 0

    def __call__(self, i=None):
        i = self.calls if i is None else i
        self.calls += 1
        self.opt.zero_grad(set_to_none=self.set_to_none)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = mse_loss(self.model, fixed_batch()).float() * self.loss_factor(i)
        self.scaler.scale(loss).backward()
        before = self.scaler.get_scale()
        self.scaler.step(self.opt)
        self.scaler.update()
        if self.scaler.get_scale() < before:
            self.skipped.append(i)
        return loss.detach()


def test_diagnose_marks_the_steps_the_loss_scaler_skipped():
    step = ScaledFp16()
    diag = diagkit.diagnose(step.model, step.opt, train_step=step, steps=STEPS)
    assert step.skipped == list(range(SKIPS))  # the scaler really skipped them
    s = diag.steps
    assert sorted(s.loc[s["skipped"], "step"].unique()) == step.skipped
    assert s.groupby("step")["skipped"].all().sum() == SKIPS  # every tensor of those steps
    assert not s.loc[s["skipped"], "changed"].any() and s.loc[~s["skipped"], "changed"].all()
    assert s.loc[s["skipped"], "nonfinite"].all()  # the scaled gradients overflowed
    assert verdicts_seen(diag) == {"ok"}  # no nonfinite_grad, no stalled
    assert diag.meta["skipped_optimizer_steps"] == SKIPS
    assert (diag.params["skipped_steps"] == SKIPS).all()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_watch_merges_skipped_steps_into_the_next_taken_and_counts_them(set_to_none):
    step = ScaledFp16(set_to_none=set_to_none)
    w = diagkit.watch(step.model, step.opt, steps=STEPS - SKIPS)
    for _ in range(STEPS):
        step()
    diag = w.diagnosis
    assert step.skipped == list(range(SKIPS))
    assert diag.meta["optimizer_steps"] == STEPS - SKIPS  # a skipped step is not a step
    assert diag.meta["skipped_optimizer_steps"] == SKIPS
    s = diag.steps
    # The overflowed backwards ran in step 0, yet its gradient is the taken one's: no leak.
    assert not s["skipped"].any() and not s["nonfinite"].any()
    assert s["grad_norm"].map(math.isfinite).all()
    assert verdicts_seen(diag) == {"ok"}


def test_a_nonfinite_gradient_after_unscaling_on_a_taken_step_is_nonfinite_grad():
    """The loop unscales, then calls optimizer.step() itself: the scaler cannot skip, and the
    step is taken on an infinite gradient."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)

    def train_step(i):
        opt.zero_grad()
        loss = mse_loss(model, fixed_batch()) * (math.inf if i == 1 else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        opt.step()  # not scaler.step(opt)
        scaler.update()
        return loss.detach()
    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=3)
    assert not diag.steps["skipped"].any()
    assert verdicts_seen(diag) >= {"nonfinite_grad"}
    f = next(f for f in diag.findings if f.code == "nonfinite_grad")
    # Step 1 stepped on inf: the weights are NaN, so step 2's gradient is too.
    assert "on step(s) 1, 2, which its optimizer took" in f.message


def test_every_step_skipped_is_a_finding():
    """A loss that always overflows: the scaler skips every step and nothing ever trains."""
    step = ScaledFp16(loss_factor=lambda i: math.inf)
    diag = diagkit.diagnose(step.model, step.opt, train_step=step, steps=3)
    assert step.skipped == [0, 1, 2] and diag.steps["skipped"].all()
    assert {v for vs in diag.verdicts().values() for v in vs} == {"nonfinite_grad"}
    f = next(f for f in diag.findings if f.code == "nonfinite_grad")
    assert "skipped every one of the 3 observed step(s)" in f.message
    assert "GradScaler(init_scale" in f.fix


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_just_works(dtype):
    """Parameters stay float32 under autocast, their gradients too: nothing to report."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    def loss_fn(m, batch):
        with torch.autocast("cpu", dtype=dtype):
            out = m(batch)
        assert out.dtype == dtype
        return out.float().pow(2).mean()
    diag = diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=loss_fn, steps=3)
    assert (diag.params["dtype"] == "torch.float32").all()
    assert diag.verdicts() == {n: {"ok"} for n in diag.params["name"]}
    assert diag.findings == [] and diag.meta["skipped_optimizer_steps"] == 0
    w = diagkit.watch(model, opt, steps=3)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model, fixed_batch()).backward()
        assert model.fc1.weight.grad.dtype == torch.float32
        opt.step()
    assert verdicts_seen(w.diagnosis) == {"ok"}


def bf16_model(lr):
    torch.manual_seed(0)
    model = MLP().to(torch.bfloat16)  # no float32 master copy
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def bf16_loss(model, batch):
    return model(batch.bfloat16()).float().pow(2).mean()


def test_bf16_parameters_whose_updates_round_to_zero_are_named_with_the_reason():
    model, opt = bf16_model(lr=1e-6)
    diag = diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=bf16_loss, steps=3)
    assert diag.verdicts() == {n: {"stalled"} for n in diag.params["name"]}
    assert (diag.steps["grad_norm"] > 0).all() and not diag.steps["changed"].any()
    (f,) = diag.findings
    assert f.code == "stalled" and set(f.params) == set(diag.params["name"])
    assert "kept in bfloat16 with no float32 master copy" in f.message
    assert "half an ulp" in f.message and "lr = 1e-06" in f.message
    assert "torch.autocast" in f.fix


def test_bf16_parameters_with_updates_large_enough_train():
    model, opt = bf16_model(lr=0.1)
    diag = diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=bf16_loss, steps=3)
    assert verdicts_seen(diag) == {"ok"}


def test_a_diagnosis_saved_before_the_skipped_column_loads_with_no_step_skipped(tmp_path):
    import pandas as pd
    step = ScaledFp16()
    diag = diagkit.diagnose(step.model, step.opt, train_step=step, steps=2)
    diag.save(tmp_path / "d")
    steps_file = tmp_path / "d" / "steps.parquet"
    pd.read_parquet(steps_file).drop(columns="skipped").to_parquet(steps_file)
    loaded = diagkit.load(tmp_path / "d")
    assert "skipped" in loaded.steps.columns and not loaded.steps["skipped"].any()
    assert loaded.steps["skipped"].dtype == bool


def test_watch_a_tensor_only_the_skipped_backward_reached_is_not_nonfinite():
    """The overflowed iteration also ran a branch the taken one did not: its gradient, from a
    backward whose step was skipped, is no gradient of the recorded step."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"main": nn.Linear(4, 2), "aux": nn.Linear(4, 2)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    w = diagkit.watch(model, opt, steps=2)
    for i in range(3):
        opt.zero_grad()
        x = fixed_batch()
        loss = model["main"](x).pow(2).mean()
        if i == 0:  # overflows: the scaler skips this step
            loss = (loss + model["aux"](x).pow(2).mean()) * math.inf
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    diag = w.diagnosis
    assert diag.meta["skipped_optimizer_steps"] == 1 and diag.meta["optimizer_steps"] == 2
    assert not diag.steps["nonfinite"].any()
    assert "nonfinite_grad" not in verdicts_seen(diag)


def test_grad_total_norm_is_the_unscaled_gradient_the_optimizer_sees():
    """GradScaler's unscale_ rewrites .grad in place without bumping its version: the norm the
    observer took as backward ended (scaled) is not what the optimizer steps on. A skip late in
    the watch, once the loop looked standard for a while, is still seen and counted."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    w = diagkit.watch(model, opt, steps=6)
    seen = []
    for i in range(7):
        opt.zero_grad()
        loss = mse_loss(model, fixed_batch()) * (math.inf if i == 4 else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        if i != 4:
            seen.append(math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model.parameters())))
        scaler.step(opt)
        scaler.update()
    diag = w.diagnosis
    s = diag.steps
    total = s.groupby("step")["grad_total_norm"].apply(lambda x: float((x ** 2).sum() ** 0.5))
    assert total.to_numpy() == pytest.approx(seen, rel=1e-4)
    fresh = s.groupby("step")["grad_norm"].apply(lambda x: float((x ** 2).sum() ** 0.5))
    assert fresh.iloc[0] == pytest.approx(seen[0] * 2 ** 10, rel=1e-4)  # backward's: scaled
    assert diag.meta["skipped_optimizer_steps"] == 1 and diag.meta["optimizer_steps"] == 6
    assert verdicts_seen(diag) == {"ok"}
