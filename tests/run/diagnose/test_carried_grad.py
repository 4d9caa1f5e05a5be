"""`grad_not_cleared` is judged on the .grad the optimizer steps on (issue 21, section 5).

Ordinary programs run under `watch` and `diagnose(train_step=...)` unchanged: a gradient that
lands on an old .grad and is then discarded by a `zero_grad` before the optimizer steps (the
canonical DCGAN loop's G pass through D; an actor-critic's critic pass through the actor's
trunk) is not carried. The real orphan (the first seed) and a loop that never clears .grad
still are.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import diagkit
from diagkit.demos.metamem import meta_memory
from models import MLP, ActorCritic, EvenBranch, GanPair, fixed_batch, mse_loss

ALL_OK = {"ok"}


def gan(seed=0):
    torch.manual_seed(seed)
    pair = GanPair()
    return (pair, torch.optim.Adam(pair.D.parameters(), lr=1e-3),
            torch.optim.Adam(pair.G.parameters(), lr=1e-3))


def dcgan_loop(pair, optD, optG, iterations, *, set_to_none=True, zero_d=True, seen=None):
    """The PyTorch DCGAN example's loop: D on real and fake, D steps, then G's loss through D
    (D's .grad gets G's gradient, which the next `netD.zero_grad()` discards)."""
    g = torch.Generator().manual_seed(1)
    crit = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(6, 1), torch.zeros(6, 1)
    for _ in range(iterations):
        real, noise = torch.randn(6, 4, generator=g), torch.randn(6, 3, generator=g)
        if zero_d:
            pair.D.zero_grad(set_to_none=set_to_none)
        crit(pair.D(real), ones).backward()
        fake = pair.G(noise)
        crit(pair.D(fake.detach()), zeros).backward()
        if seen is not None:  # what optD steps on
            seen.append({n: float(p.grad.norm()) for n, p in pair.D.named_parameters()})
        optD.step()
        pair.G.zero_grad(set_to_none=set_to_none)
        crit(pair.D(fake), ones).backward()
        optG.step()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_dcgan_watched_on_d_is_clean_and_measures_what_d_steps_on(set_to_none):
    pair, optD, optG = gan()
    w = diagkit.watch(pair.D, optD, steps=4)
    seen = []
    dcgan_loop(pair, optD, optG, 5, set_to_none=set_to_none, seen=seen)
    diag = w.diagnosis
    assert diag.verdicts() == {n: ALL_OK for n, _ in pair.D.named_parameters()}
    s = diag.steps
    assert not s["carried_grad"].any()
    for step in range(4):  # step k: the rest of iteration k-1 (G through D), then iteration k
        rows = s[s["step"] == step].set_index("name")
        for name, norm in seen[step].items():
            assert rows.loc[name, "grad_norm"] == pytest.approx(norm, rel=1e-5)
            assert rows.loc[name, "grad_total_norm"] == pytest.approx(norm, rel=1e-5)


def test_dcgan_both_networks_watch_and_diagnose_are_clean():
    pair, optD, optG = gan()
    w = diagkit.watch(pair, [optD, optG], steps=3)
    dcgan_loop(pair, optD, optG, 3)
    assert set(map(frozenset, w.diagnosis.verdicts().values())) == {frozenset(ALL_OK)}
    pair, optD, optG = gan()
    diag = diagkit.diagnose(pair, [optD, optG], steps=3,
                            train_step=lambda i: dcgan_loop(pair, optD, optG, 1))
    assert set(map(frozenset, diag.verdicts().values())) == {frozenset(ALL_OK)}


def test_dcgan_that_forgets_d_zero_grad_is_still_caught():
    """The same loop without `netD.zero_grad()`: D steps on G's gradient and the last ones."""
    pair, optD, optG = gan()
    w = diagkit.watch(pair.D, optD, steps=4)
    dcgan_loop(pair, optD, optG, 5, zero_d=False)
    diag = w.diagnosis
    assert all("grad_not_cleared" in v for v in diag.verdicts().values())
    carried = diag.steps.groupby("step")["carried_grad"].all()
    assert carried.tolist() == [False, True, True, True]


def test_a_discarded_gradient_on_a_tensor_the_step_does_not_reach_again():
    """`extra` gets a post-step pass's gradient on top of its last one, then `zero_grad()`
    resets it and the next iteration never reaches it: the optimizer steps on no .grad of
    it, so nothing was carried into a step (checked as the optimizer steps)."""
    torch.manual_seed(0)
    model = EvenBranch()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = fixed_batch()
    w = diagkit.watch(model, opt, steps=4)
    for i in range(5):
        opt.zero_grad()
        model(x, i % 2 == 0).pow(2).mean().backward()
        opt.step()
        model(x, True).sum().backward()  # after the step: discarded by the next zero_grad
    diag = w.diagnosis
    assert diag.verdicts() == {n: ALL_OK for n, _ in model.named_parameters()}
    assert not diag.steps["carried_grad"].any()


def actor_critic(one_optimizer=False):
    torch.manual_seed(0)
    ac = ActorCritic()
    if one_optimizer:
        return ac, [torch.optim.Adam(ac.parameters(), lr=1e-3)]
    # The actor's optimizer trains the trunk; the critic's only its head.
    return ac, [torch.optim.Adam([*ac.trunk.parameters(), *ac.actor.parameters()], lr=1e-3),
                torch.optim.Adam(ac.critic.parameters(), lr=1e-3)]


def ac_loop(ac, opts, iterations):
    """Critic first, then actor. With two optimizers the critic's loss reaches the trunk too,
    landing on the actor's last .grad; `opt_actor.zero_grad()` discards both before the trunk
    steps. With one, both losses are backpropagated and stepped together."""
    g = torch.Generator().manual_seed(2)
    for _ in range(iterations):
        obs, returns = torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
        actions = torch.randint(0, 3, (6,), generator=g)
        if len(opts) == 2:
            opt_actor, opt_critic = opts
            opt_critic.zero_grad()
            F.mse_loss(ac(obs)[1], returns).backward()
            opt_critic.step()
            opt_actor.zero_grad()
            logp, value = ac(obs)
            adv = (returns - value).detach()
            (-(logp.gather(1, actions[:, None]).squeeze(1) * adv).mean()).backward()
            opt_actor.step()
        else:
            opts[0].zero_grad()
            logp, value = ac(obs)
            adv = (returns - value).detach()
            (-(logp.gather(1, actions[:, None]).squeeze(1) * adv).mean()).backward(
                retain_graph=True)
            F.mse_loss(value, returns).backward()
            opts[0].step()


@pytest.mark.parametrize("one_optimizer", [False, True])
def test_shared_trunk_actor_critic_is_clean(one_optimizer):
    ac, opts = actor_critic(one_optimizer)
    w = diagkit.watch(ac, opts, steps=3)
    ac_loop(ac, opts, 4)
    assert w.diagnosis.verdicts() == {n: ALL_OK for n, _ in ac.named_parameters()}
    ac, opts = actor_critic(one_optimizer)
    diag = diagkit.diagnose(ac, opts, steps=3, train_step=lambda i: ac_loop(ac, opts, 1))
    assert diag.verdicts() == {n: ALL_OK for n, _ in ac.named_parameters()}
    assert not diag.steps["carried_grad"].any()


def seed_orphan():
    setup = meta_memory(steps=3)
    model, opt, batch_fn, loss_fn = (setup[k] for k in ("model", "optimizer", "batch_fn",
                                                         "loss_fn"))

    def train_step(i):
        opt.zero_grad()
        loss_fn(model, batch_fn()).backward()
        opt.step()
    return model, opt, train_step


def mem_tokens(verdicts):
    (name,) = [n for n in verdicts if n.endswith("mem_tokens")]
    return verdicts[name]


def test_seed_orphan_stays_grad_not_cleared():
    model, opt, train_step = seed_orphan()
    w = diagkit.watch(model, opt, steps=3)
    for i in range(3):
        train_step(i)
    assert mem_tokens(w.diagnosis.verdicts()) == {"orphan", "grad_not_cleared"}
    model, opt, train_step = seed_orphan()
    diag = diagkit.diagnose(model, opt, steps=3, train_step=train_step)
    assert mem_tokens(diag.verdicts()) == {"orphan", "grad_not_cleared"}


def test_a_loop_that_never_clears_grad_is_caught():
    """A real accumulation bug: no zero_grad at all, each step adds onto the last."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = fixed_batch()

    def train_step(i):
        mse_loss(model, x).backward()
        opt.step()
    w = diagkit.watch(model, opt, steps=3)
    for i in range(3):
        train_step(i)
    diag = diagkit.diagnose(model, opt, steps=3, train_step=train_step)
    for d in (w.diagnosis, diag):
        assert all(v == {"grad_not_cleared"} for v in d.verdicts().values()), d.verdicts()
