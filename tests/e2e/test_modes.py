"""delta="sampled" / "off" and every=k give the verdicts of exact mode (issue 6).

Each scenario is built afresh with the same seed for every mode, so the training runs are
identical and only the way the change is measured differs. A tiny `sample` forces the
fingerprint and sampling paths onto these tiny models (by default tensors of at most 4096
elements are copied exactly, which would test nothing here).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn

import diagkit
from diagkit.measure.change import exact_probe as delta_module
from diagkit.measure.change import snapshot_pass
from diagkit.measure.change.fingerprint import Fingerprinter
from diagkit.run.diagnose.loop import loop_facts, step_function
from diagkit.run.target.target import Setup
from models import (MLP, EvenBranch, MaskedHead, NormNet, Reuse, SqrtAtZero, TiedLM,
                      WithDeadHead, ZeroGate, fixed_batch, freeze_fc1_weight_at_step_2, mse_loss,
                      sum_loss)

SAMPLE = 3


def _standard(model, opt, loss=mse_loss, steps=3, **kw):
    x = fixed_batch()
    return dict(model=model, optimizer=opt, batch_fn=lambda: x, loss_fn=loss, steps=steps, **kw)


def orphan():
    model = MLP()
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if n != "fc2.bias"], lr=0.01)
    return _standard(model, opt, loss=sum_loss, steps=4)


def dead_head():
    model = WithDeadHead()
    return _standard(model, torch.optim.AdamW(model.parameters(), lr=0.01))


def frozen_in_optimizer():
    model = MLP()
    model.fc1.weight.requires_grad_(False)
    return _standard(model, torch.optim.AdamW(model.parameters(), lr=0.01))


def frozen_but_changing():
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dict(model=model, optimizer=opt, steps=4,
                train_step=freeze_fc1_weight_at_step_2(model, opt, fixed_batch()))


def lr_zero():
    model = MLP()
    opt = torch.optim.AdamW([{"params": model.fc1.parameters(), "lr": 0.0},
                             {"params": model.fc2.parameters()}], lr=0.01)
    return _standard(model, opt)


def zero_gradient():
    model = ZeroGate()
    return _standard(model, torch.optim.SGD(model.parameters(), lr=0.05))


def nonfinite():
    model = SqrtAtZero()
    return _standard(model, torch.optim.SGD(model.parameters(), lr=0.05), loss=lambda m, b: m(b))


def masked_inf():
    model = MaskedHead()
    return _standard(model, torch.optim.SGD(model.fc.parameters(), lr=0.05),
                     loss=lambda m, b: m(b)[:, 0].sum(), steps=2)


def masked_inf_held():
    """The masked head with its inf mask held by the optimizer: snapshotted in exact mode
    (held by none, it is fingerprinted: docs/cost.md)."""
    model = MaskedHead()
    return _standard(model, torch.optim.SGD(model.parameters(), lr=0.05),
                     loss=lambda m, b: m(b)[:, 0].sum(), steps=2)


def norm_decay():
    model = NormNet()
    return _standard(model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))


def tied():
    model = TiedLM()
    tokens = torch.randint(0, 7, (4, 5), generator=torch.Generator().manual_seed(2))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
                batch_fn=lambda: tokens, loss_fn=lambda m, b: m(b).logsumexp(-1).mean(), steps=3)


def reused():
    model = Reuse()
    return _standard(model, torch.optim.SGD(model.parameters(), lr=0.05))


def branch():
    model = EvenBranch()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = fixed_batch()

    def train_step(i):
        opt.zero_grad()
        loss = model(x, use_extra=i % 2 == 0).pow(2).mean()
        loss.backward()
        opt.step()
        return loss
    return dict(model=model, optimizer=opt, train_step=train_step, steps=4)


class Odd(nn.Module):
    """Layouts the bucketed and fingerprinted paths must survive."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8, sparse=True)          # sparse gradients
        self.t = nn.Parameter(torch.randn(8, 6).t())         # non-contiguous
        self.bf = nn.Parameter(torch.randn(6, 6, dtype=torch.bfloat16))
        self.s1 = nn.Parameter(torch.tensor(0.5))            # 0-d, grouped together
        self.s2 = nn.Parameter(torch.tensor(1.5))
        self.b1 = nn.Parameter(torch.zeros(6))
        self.b2 = nn.Parameter(torch.zeros(6))

    def forward(self, idx):
        y = (self.emb(idx).mean(0) @ self.t.t()) * self.s1 * self.s2
        return (y + (y.to(torch.bfloat16) @ self.bf).float() + self.b1 + self.b2).pow(2).sum()


def odd_layouts():
    model = Odd()
    dense = [p for n, p in model.named_parameters() if n != "emb.weight"]
    opts = [torch.optim.SGD(dense, lr=0.01), torch.optim.SparseAdam([model.emb.weight], lr=0.01)]
    idx = torch.tensor([1, 2, 3])
    return dict(model=model, optimizer=opts, batch_fn=lambda: idx, loss_fn=lambda m, b: m(b),
                steps=3)


def in_two_optimizers():
    model = MLP()
    opts = [torch.optim.SGD(model.parameters(), lr=0.05),
            torch.optim.SGD([model.fc2.weight], lr=0.01)]  # fc2.weight held twice
    return _standard(model, opts)


class Siblings(nn.Module):
    """Same-shaped layers share a bucket; one of them sits out every other batch, so its
    group must fall back to one-by-one norms on those steps."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, batch):
        x, use_c = batch
        y = self.b(torch.tanh(self.a(x)))
        return (self.c(y) if use_c else y).pow(2).mean()


def partly_used_group():
    model = Siblings()
    x = fixed_batch()
    count = {"n": 0}

    def batch_fn():
        count["n"] += 1
        return x, count["n"] % 2 == 1
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
                batch_fn=batch_fn, loss_fn=lambda m, b: m(b), steps=4)


def demo(name):
    def build():
        setup = diagkit.load_target(f"diagkit.demos:{name}")
        return dict(model=setup, steps=3)
    build.__name__ = name
    return build


SCENARIOS = [orphan, dead_head, frozen_in_optimizer, frozen_but_changing, lr_zero,
             zero_gradient, nonfinite, masked_inf, norm_decay, tied, reused, branch, odd_layouts,
             in_two_optimizers, partly_used_group,
             demo("meta_memory"), demo("finetune_heads"), demo("clean")]


def run(build, **options):
    torch.manual_seed(0)
    kwargs = build()
    model = kwargs.pop("model")
    return diagkit.diagnose(model, **kwargs, **options)


@pytest.fixture(scope="module")
def exact_runs():
    return {build.__name__: run(build) for build in SCENARIOS}


@pytest.mark.parametrize("build", SCENARIOS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("mode", ["sampled", "off"])
def test_modes_give_the_verdicts_of_exact_mode(build, mode, exact_runs):
    exact = exact_runs[build.__name__]
    other = run(build, delta=mode, sample=SAMPLE)
    assert other.verdicts() == exact.verdicts()
    assert [f.code for f in other.findings] == [f.code for f in exact.findings]
    a, b = exact.steps, other.steps
    for column in ("changed", "used", "requires_grad", "carried_grad", "nonfinite"):
        assert a[column].tolist() == b[column].tolist(), column
    np.testing.assert_array_equal(a["grad_norm"].to_numpy(), b["grad_norm"].to_numpy())
    assert (b.loc[~b["changed"], "delta_norm"].fillna(0) == 0).all()
    assert other.meta["delta"] == mode
    if mode == "off":
        assert b["delta_norm"].isna().all() and b["update_ratio"].isna().all()
    else:
        small = b["name"].map(dict(zip(other.params["name"], other.params["numel"]))) <= SAMPLE
        # Snapshots here; in exact mode a frozen tensor no optimizer holds is fingerprinted
        # when observing begins and ends, never per step: its norm is NaN (not measured)
        # there, and compared where both measured it (float32 rounding of the norm: a small
        # one may sit in a bucket group here and in none there).
        both = small & a["delta_norm"].notna()
        np.testing.assert_allclose(a.loc[both, "delta_norm"], b.loc[both, "delta_norm"],
                                   rtol=1e-6)
        # Never 0 for a change: an estimate, or NaN where the change missed the sample.
        moved = b.loc[b["changed"], "delta_norm"]
        assert (moved.isna() | (moved > 0)).all()
        assert b.loc[~b["changed"] | small, "delta_norm"].notna().all()


HAND_WRITTEN = [s for s in SCENARIOS if s not in (frozen_but_changing, branch)]


@pytest.mark.parametrize("build", HAND_WRITTEN, ids=lambda b: b.__name__)
def test_unhooked_standard_loop_measures_what_hooks_measure(build, exact_runs):
    """The standard loop observes held tensors without hooks (`run.diagnose.loop.loop_facts`); the same loop
    handed over as a `train_step` gets a hook on every tensor. Both must record the same."""
    torch.manual_seed(0)
    kwargs = build()
    model, steps = kwargs.pop("model"), kwargs.pop("steps")
    setup = model if isinstance(model, Setup) else Setup(model=model, **kwargs)
    hand = Setup(model=setup.model, optimizers=setup.optimizers, lr_scheduler=setup.lr_scheduler,
                 train_step=step_function(setup))
    assert loop_facts(setup).held_grads_start_none
    assert not any(dataclasses.astuple(loop_facts(hand)))
    hooked = diagkit.diagnose(hand, steps=steps)
    pd.testing.assert_frame_equal(hooked.steps, exact_runs[build.__name__].steps)
    assert hooked.verdicts() == exact_runs[build.__name__].verdicts()


@pytest.mark.parametrize("build", [masked_inf_held, nonfinite], ids=lambda b: b.__name__)
def test_a_nan_change_is_decided_with_the_steps_read_back(build, monkeypatch):
    """A tensor holding inf or NaN makes before - after NaN. Known to hold them (from the norms
    read back at attach, then from step to step), it is decided element by element in `end()`
    while its value before still exists (`change_parts`), riding with the step's one read-back:
    no host reads of its own in `resolve()`. Forgetting what is known (so that it is decided
    from before - after alone: chunk by chunk in the snapshot pass of `end()` on the CPU
    (`measure.change.snapshot_pass`), else in `resolve()`) decides the same on these runs."""
    calls, phase = [], []

    def spy(name, real):
        def counted(*args, **kwargs):
            calls.append((name, phase[-1] if phase else None))
            return real(*args, **kwargs)
        return counted

    def in_phase(name, method):
        def wrapped(self, *args, **kwargs):
            phase.append(name)
            try:
                return method(self, *args, **kwargs)
            finally:
                phase.pop()
        return wrapped
    monkeypatch.setattr(delta_module, "change_parts",
                        spy("parts", delta_module.change_parts))
    monkeypatch.setattr(delta_module, "nonfinite_change",
                        spy("host", delta_module.nonfinite_change))
    monkeypatch.setattr(snapshot_pass, "nonfinite_change",
                        spy("pass", snapshot_pass.nonfinite_change))
    probe = delta_module.ExactProbe
    monkeypatch.setattr(probe, "end", in_phase("end", probe.end))
    monkeypatch.setattr(probe, "resolve_into", in_phase("resolve", probe.resolve_into))
    four = lambda: build() | {"steps": 4}  # noqa: E731
    queued = run(four)
    assert ("host", "resolve") not in calls, calls  # nothing decided on its own host read
    assert calls.count(("parts", "end")) >= 3, calls  # each step once it holds them: queued

    end = delta_module.ExactProbe.end

    def end_knowing_nothing(self, pending, tag="x"):
        self._careful = set()
        return end(self, pending, tag)
    monkeypatch.setattr(delta_module.ExactProbe, "end", end_knowing_nothing)
    calls.clear()
    direct = run(four)
    assert ("host", "resolve") in calls or ("pass", "end") in calls, calls
    pd.testing.assert_frame_equal(queued.steps, direct.steps)


def test_sampled_estimate_is_close_on_a_dense_update():
    """A dense update (every element moves): the sample's norm, scaled, is near the truth."""
    def build():
        torch.manual_seed(0)
        model = nn.Linear(64, 64)
        x = torch.randn(32, 64)
        return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                    batch_fn=lambda: x, loss_fn=lambda m, b: m(b).pow(2).mean(), steps=2)
    exact = run(build).steps.set_index(["step", "name"])["delta_norm"]
    sampled = run(build, delta="sampled", sample=1024).steps.set_index(["step", "name"])
    ratio = sampled["delta_norm"] / exact
    assert ((ratio > 0.8) & (ratio < 1.25)).all(), ratio


def test_every_k_observes_only_those_steps():
    def build():
        return orphan() | {"steps": 7}
    full = run(build)
    strided = run(build, every=3)
    assert sorted(strided.steps["step"].unique()) == [0, 3, 6]
    assert strided.meta["every"] == 3 and strided.meta["steps_observed"] == 3
    assert strided.verdicts() == full.verdicts()
    keep = full.steps[full.steps["step"].isin([0, 3, 6])].reset_index(drop=True)
    for column in ("used", "changed", "grad_norm", "delta_norm", "grad_total_norm"):
        np.testing.assert_array_equal(keep[column].to_numpy(),
                                      strided.steps[column].to_numpy(), err_msg=column)


def test_bad_mode_and_stride_are_one_line_errors():
    kwargs = orphan()
    model = kwargs.pop("model")
    for bad, message in ((dict(delta="fast"), "delta must be one of"),
                         (dict(every=0), "every must be a positive int"),
                         (dict(delta="sampled", sample=0), "sample must be a positive int")):
        with pytest.raises(diagkit.DiagkitError, match=message):
            diagkit.diagnose(model, **kwargs, **bad)


# ------------------------------------------------------------------ kernels
def test_fingerprint_sees_any_single_element_change_and_nothing_else():
    fp = Fingerprinter()
    fp.CHUNK = 64  # several chunks on a small tensor
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float64: torch.int64, torch.int64: torch.int64}
    for dtype, as_int in bits.items():
        t = (torch.randn(10, 30) * 100).to(dtype)
        base = [int(v) for v in fp(t)]
        assert [int(v) for v in fp(t.clone())] == base
        for pos in (0, 77, 299):
            for step in (1, -1, 1 << 10):  # the smallest change of one element, and others
                u = t.clone()
                u.view(as_int).view(-1)[pos] += step
                assert [int(v) for v in fp(u)] != base, (dtype, pos, step)
        swapped = t.clone().reshape(-1)
        swapped[[3, 200]] = swapped[[200, 3]]
        if not torch.equal(swapped, t.reshape(-1)):
            assert [int(v) for v in fp(swapped.reshape(10, 30))] != base  # position matters


def test_tiny_changes_below_float32_underflow_still_count():
    """A change of 1e-30 squares to 0 in float32: exact mode must still see it."""
    model = nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    x = torch.zeros(2, 3)

    def train_step(i):
        with torch.no_grad():
            model.weight[0, 1] += 1e-30
        return model(x).sum()
    diag = diagkit.diagnose(model, torch.optim.SGD(model.parameters(), lr=0.0),
                            train_step=train_step, steps=2)
    changed = diag.steps["changed"].tolist()
    assert changed == [True, True]
    np.testing.assert_allclose(diag.steps["delta_norm"], 1e-30, rtol=1e-6)


def test_tiny_gradient_is_not_reported_as_zero():
    w = nn.Parameter(torch.ones(4))

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = w

        def forward(self, x):
            return (self.w * 1e-30).sum()
    model = Tiny()
    diag = diagkit.diagnose(model, torch.optim.SGD(model.parameters(), lr=0.1),
                            batch_fn=lambda: None, loss_fn=lambda m, b: m(b), steps=2)
    np.testing.assert_allclose(diag.steps["grad_norm"], 2e-30, rtol=1e-6)
    assert "zero_gradient" not in diag.verdicts()["w"]
