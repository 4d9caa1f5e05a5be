"""`diagkit.watch` leaves training bitwise unchanged (every model of the zoo, each `delta=`
mode, every step or a sample of them), and reads each step as the optimizer saw it: frozen
tensors, a loss scaler's skipped step, a backward inside `step(closure)`, a GAN's later
backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

import diagkit
from models import (MLP, EvenBranch, NormNet, TiedLM, WithDeadHead, ZeroGate, fixed_batch,
                    mse_loss)
from watch_loops import plain_loop


ZOO = {
    "dead_head": lambda: (WithDeadHead(), lambda m: torch.optim.SGD(m.body.parameters(), lr=0.1,
                                                                    momentum=0.9), fixed_batch()),
    "norm_adamw": lambda: (NormNet(), lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
                           fixed_batch()),
    "tied_lm": lambda: (TiedLM(), lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
                        torch.arange(6) % 7),
    "zero_gate": lambda: (ZeroGate(), lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                          fixed_batch()),
    "orphan": lambda: (MLP(), lambda m: torch.optim.Adam(m.fc1.parameters(), lr=1e-2),
                       fixed_batch()),
}


def _train(case, watched: bool, delta="exact", every=1):
    torch.manual_seed(0)
    model, make_opt, batch = ZOO[case]()
    opt = make_opt(model)
    w = diagkit.watch(model, opt, steps=4, delta=delta, every=every) if watched else None
    losses = plain_loop(model, opt, 8, batch=batch, clip=1.0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    return losses, state, grads, opt.state_dict(), w


@pytest.mark.parametrize("case", sorted(ZOO))
@pytest.mark.parametrize("delta, every", [("exact", 1), ("sampled", 2)])
def test_training_is_bitwise_unchanged(case, delta, every):
    plain = _train(case, watched=False)
    watched = _train(case, watched=True, delta=delta, every=every)
    assert watched[4].done
    for a, b in zip(plain[0], watched[0]):
        assert torch.equal(a, b)
    assert plain[1].keys() == watched[1].keys()
    assert all(torch.equal(plain[1][k], watched[1][k]) for k in plain[1])
    assert all((plain[2][k] is None) == (watched[2][k] is None)
               and (plain[2][k] is None or torch.equal(plain[2][k], watched[2][k]))
               for k in plain[2])
    sa, sb = plain[3]["state"], watched[3]["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for name, value in sa[k].items():
            other = sb[k][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) \
                else value == other or (math.isnan(value) and math.isnan(other))


def test_frozen_tensors_keep_requires_grad_and_the_branch_model_runs():
    torch.manual_seed(0)
    model = EvenBranch()
    model.extra.weight.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=4)
    for i in range(4):
        opt.zero_grad()
        model(fixed_batch(), use_extra=i % 2 == 0).pow(2).mean().backward()
        opt.step()
    assert model.extra.weight.requires_grad is False
    v = w.diagnosis.verdicts()
    assert v["extra.bias"] == {"intermittent"}
    assert v["extra.weight"] == {"frozen_in_optimizer"}


def test_a_step_the_loss_scaler_skips_is_not_a_step():
    """GradScaler skips optimizer.step() when the scaled gradients overflowed: the observed step
    runs on to the next step actually taken, and the skipped backward is superseded."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    w = diagkit.watch(model, opt, steps=2)
    taken = 0
    for i in range(3):
        opt.zero_grad()
        loss = mse_loss(model, fixed_batch()) * (math.inf if i == 0 else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        taken += int(model.fc1.weight.grad.isfinite().all())
    assert taken == 2  # step 0 overflowed: the scaler skipped optimizer.step()
    diag = w.diagnosis
    assert diag.meta["optimizer_steps"] == 2 and sorted(diag.steps["step"].unique()) == [0, 1]
    assert set().union(*diag.verdicts().values()) == {"ok"}


def test_a_backward_inside_step_closure_is_read_as_the_optimizer_saw_it():
    """Lightning and LBFGS run forward and backward inside optimizer.step(closure), after its
    step pre-hook: the .grad it steps on (here clipped) is read when the step returns."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=3)

    def closure():
        opt.zero_grad()
        loss = mse_loss(model, fixed_batch())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        return loss
    for _ in range(3):
        opt.step(closure)
    s = w.diagnosis.steps
    clipped = s.groupby("step")["grad_total_norm"].apply(lambda x: float((x ** 2).sum() ** 0.5))
    assert clipped.to_numpy() == pytest.approx([0.05] * 3, rel=1e-4)
    assert (s["grad_norm"] > s["grad_total_norm"]).all()  # the fresh norm, before clipping
    assert set().union(*w.diagnosis.verdicts().values()) == {"ok"}


def test_gan_style_a_later_backward_does_not_rewrite_what_an_optimizer_saw():
    """D steps, then G's loss back-propagates through D again: D's .grad as optD saw it stays."""
    torch.manual_seed(0)
    g_net, d_net = nn.Linear(3, 4), nn.Linear(4, 1)
    opt_d = torch.optim.SGD(d_net.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(g_net.parameters(), lr=0.1)
    model = nn.ModuleDict({"g": g_net, "d": d_net})
    w = diagkit.watch(model, [opt_d, opt_g], steps=2)
    seen = []
    for _ in range(2):
        opt_d.zero_grad()
        d_net(g_net(torch.randn(5, 3)).detach()).mean().backward()
        seen.append(float(d_net.weight.grad.norm()))
        opt_d.step()
        opt_g.zero_grad()
        (-d_net(g_net(torch.randn(5, 3))).mean()).backward()  # lands on D's .grad too
        opt_g.step()
    s = w.diagnosis.steps
    total = s[s["name"] == "d.weight"].sort_values("step")["grad_total_norm"].to_numpy()
    assert total == pytest.approx(seen, rel=1e-6)
