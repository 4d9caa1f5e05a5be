"""SPEC 2.1: with restore=True a diagnosis leaves everything bitwise as it found it.

Model values and buffers, every `.grad` (None stays None), requires_grad flags, module modes,
optimizer state and hyperparameters, the scheduler, the RNG streams; the same tensor objects;
and no hook left behind. With restore=False the training steps really happened.
"""

from __future__ import annotations

import copy
import random
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn

import diagkit


# --------------------------------------------------------------------------- model
class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(6, 3)
        self.frozen = nn.Linear(3, 3)  # frozen from the start, not in the optimizer
        for p in self.frozen.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.fc2(self.drop(torch.relu(self.bn(self.fc1(x))))))


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def noisy_batch_fn():
    """Draws from every RNG stream the restore must put back."""
    x = torch.randn(8, 4)
    x = x * (1.0 + random.random()) + float(np.random.rand())
    return x


def mse(model, batch):
    return model(batch).pow(2).mean()


def warmed_up(seed=0, opt_cls=torch.optim.Adam, **opt_kw):
    """A model and an optimizer with real state, as in the middle of a notebook."""
    torch.manual_seed(seed)
    model = BNNet()
    opt = opt_cls(trainable(model), lr=1e-2, **opt_kw)
    for _ in range(2):
        opt.zero_grad()
        mse(model, torch.randn(8, 4)).backward()
        opt.step()
    # Grads in every state: a fresh non-None grad, a None grad, leftovers from the last step.
    model.fc1.weight.grad = torch.randn_like(model.fc1.weight)
    model.fc1.bias.grad = None
    return model, opt


# --------------------------------------------------------------------------- capture/compare
def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).clone()


def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str):
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(bits(a), bits(b)), f"{what}: values differ"


def capture(model, opts, sched=None):
    return {
        "param_objs": dict(model.named_parameters(remove_duplicate=False)),
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
        "buffer_objs": dict(model.named_buffers()),
        "grad_objs": {n: p.grad for n, p in model.named_parameters()},
        "grads": {n: None if p.grad is None else p.grad.detach().clone()
                  for n, p in model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "group_params": [[[p for p in g["params"]] for g in opt.param_groups] for opt in opts],
        "hyper": [[{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                   for g in opt.param_groups] for opt in opts],
        "state_objs": [{id(p): dict(s) for p, s in opt.state.items()} for opt in opts],
        "state": [{id(p): {k: (v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v))
                           for k, v in s.items()} for p, s in opt.state.items()} for opt in opts],
        "sched": None if sched is None else copy.deepcopy(sched.state_dict()),
        "torch_rng": torch.get_rng_state().clone(),
        "py_rng": random.getstate(),
        "np_rng": np.random.get_state(),
    }


def assert_same(before, model, opts, sched=None):
    after_objs = dict(model.named_parameters(remove_duplicate=False))
    assert after_objs.keys() == before["param_objs"].keys()
    for n, p in after_objs.items():
        assert p is before["param_objs"][n], f"parameter object {n} replaced"
    for n, p in model.named_parameters():
        assert_bitwise(p, before["params"][n], f"param {n}")
        assert p.requires_grad == before["requires_grad"][n], f"requires_grad of {n}"
        if before["grads"][n] is None:
            assert p.grad is None, f"{n}.grad should be None again"
        else:
            assert p.grad is not None, f"{n}.grad lost"
            assert p.grad is before["grad_objs"][n], f"{n}.grad object replaced"
            assert_bitwise(p.grad, before["grads"][n], f"grad {n}")
    assert dict(model.named_buffers()).keys() == before["buffers"].keys()
    for n, b in model.named_buffers():
        assert b is before["buffer_objs"][n], f"buffer object {n} replaced"
        assert_bitwise(b, before["buffers"][n], f"buffer {n}")
    assert {n: m.training for n, m in model.named_modules()} == before["training"]

    for i, opt in enumerate(opts):
        assert len(opt.param_groups) == len(before["hyper"][i])
        for j, g in enumerate(opt.param_groups):
            assert len(g["params"]) == len(before["group_params"][i][j])
            for p, q in zip(g["params"], before["group_params"][i][j]):
                assert p is q, f"optimizer {i} group {j} holds a different tensor object"
            hyper = {k: v for k, v in g.items() if k != "params"}
            assert hyper == before["hyper"][i][j], f"optimizer {i} group {j} hyperparameters"
        state = {id(p): s for p, s in opt.state.items() if s}
        assert state.keys() == before["state"][i].keys(), f"optimizer {i} state keys"
        for pid, s in state.items():
            saved = before["state"][i][pid]
            assert s.keys() == saved.keys()
            for k, v in s.items():
                if torch.is_tensor(v):
                    assert v is before["state_objs"][i][pid][k], f"state {k} object replaced"
                    assert_bitwise(v, saved[k], f"optimizer {i} state {k}")
                else:
                    assert v == saved[k]
    if sched is not None:
        assert sched.state_dict() == before["sched"]
    assert torch.equal(torch.get_rng_state(), before["torch_rng"])
    assert random.getstate() == before["py_rng"]
    np_now, np_then = np.random.get_state(), before["np_rng"]
    assert np_now[0] == np_then[0] and np.array_equal(np_now[1], np_then[1])
    assert np_now[2:] == np_then[2:]


def assert_no_diagkit_hooks(tensors, opts):
    for t in tensors:
        assert not t._backward_hooks, f"backward hook left on {tuple(t.shape)}"
        assert not getattr(t, "_post_accumulate_grad_hooks", None), "post-accumulate hook left"
    for opt in opts:
        assert not opt._optimizer_step_pre_hooks, "optimizer step pre-hook left"
        assert not opt._optimizer_step_post_hooks, "optimizer step post-hook left"


# --------------------------------------------------------------------------- restore=True
def test_restore_standard_loop_adam_batchnorm_scheduler():
    model, opt = warmed_up()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with warnings.catch_warnings():  # the warm-up steps ran before the scheduler existed
        warnings.simplefilter("ignore", UserWarning)
        sched.step()  # mid-schedule already
    model.drop.eval()  # mixed modes; the loss_fn below flips it

    def loss_fn(m, batch):
        m.train()
        return mse(m, batch)

    before = capture(model, [opt], sched)
    lr_before = opt.param_groups[0]["lr"]
    assert model.fc1.bias.grad is None and model.fc1.weight.grad is not None
    assert any(torch.is_tensor(v) for s in opt.state.values() for v in s.values())

    diag = diagkit.diagnose(model, opt, batch_fn=noisy_batch_fn, loss_fn=loss_fn, steps=3,
                            lr_scheduler=sched)

    # The run really trained: values, lr and BatchNorm statistics moved during it.
    st = diag.steps
    assert st.loc[st["name"] == "fc1.weight", "changed"].all()
    np.testing.assert_allclose(st.loc[st["name"] == "fc1.weight", "lr"],
                               [lr_before, lr_before / 2, lr_before / 4])
    assert diag.meta["restored"] is True
    assert_same(before, model, [opt], sched)
    assert opt.param_groups[0]["lr"] == lr_before
    assert model.bn.num_batches_tracked.item() == 2


def test_restore_train_step_mid_run_freeze_mode_switch_in_place_grads():
    model, opt = warmed_up(opt_cls=torch.optim.SGD, momentum=0.9)
    model.fc2.weight.grad = torch.full_like(model.fc2.weight, 0.25)  # zeroed in place below

    def train_step(i):
        opt.zero_grad(set_to_none=False)
        if i == 1:
            model.fc1.weight.requires_grad_(False)  # mid-run freeze
        if i == 2:
            model.bn.eval()
            model.frozen.weight.requires_grad_(True)  # mid-run unfreeze of a frozen tensor
        loss = mse(model, noisy_batch_fn())
        loss.backward()
        for g in opt.param_groups:
            g["lr"] *= 0.5  # the user's own ad-hoc schedule
        opt.step()
        return loss

    before = capture(model, [opt])
    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=3)
    st = diag.steps
    assert st.loc[st["name"] == "fc1.weight", "requires_grad"].tolist() == [True, False, False]
    assert st.loc[st["name"] == "frozen.weight", "requires_grad"].tolist() == [False, False,
                                                                             True]
    assert_same(before, model, [opt])
    assert model.fc1.weight.requires_grad and not model.frozen.weight.requires_grad
    assert model.bn.training


def test_restore_with_two_optimizers_and_fresh_state():
    """Optimizers without state yet come back without state; SGD momentum buffers too."""
    torch.manual_seed(0)
    model = BNNet()
    opt_a = torch.optim.Adam(list(model.fc1.parameters()) + list(model.bn.parameters()), lr=1e-2)
    opt_b = torch.optim.SGD(model.fc2.parameters(), lr=0.1, momentum=0.9)
    before = capture(model, [opt_a, opt_b])
    assert not opt_a.state and not opt_b.state
    diagkit.diagnose(model, [opt_a, opt_b], batch_fn=noisy_batch_fn, loss_fn=mse, steps=2)
    assert_same(before, model, [opt_a, opt_b])
    assert not any(opt_a.state.values()) and not any(opt_b.state.values())


def test_restore_after_failing_step():
    model, opt = warmed_up()
    before = capture(model, [opt])

    def train_step(i):
        opt.zero_grad()
        loss = mse(model, noisy_batch_fn())
        loss.backward()
        if i == 2:
            model.fc1.weight.requires_grad_(False)
            raise RuntimeError("boom at step 2")  # after backward, before the step
        opt.step()
        return loss

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=4)
    assert diag.failure is not None and diag.failure.step == 2
    assert_same(before, model, [opt])
    assert_no_diagkit_hooks(list(model.parameters()), [opt])


# --------------------------------------------------------------------------- restore=False
def test_restore_false_leaves_the_trained_state():
    model, opt = warmed_up()
    before = capture(model, [opt])
    diag = diagkit.diagnose(model, opt, batch_fn=noisy_batch_fn, loss_fn=mse, steps=3,
                            restore=False)
    assert diag.meta["restored"] is False
    for n in ("fc1.weight", "fc1.bias", "fc2.weight", "bn.weight"):
        p = dict(model.named_parameters())[n]
        assert not torch.equal(p.detach(), before["params"][n]), f"{n} did not change"
    for n in ("frozen.weight", "frozen.bias"):  # frozen and not in the optimizer
        assert torch.equal(dict(model.named_parameters())[n].detach(), before["params"][n])
    assert not torch.equal(model.bn.running_mean, before["buffers"]["bn.running_mean"])
    assert model.bn.num_batches_tracked.item() == 2 + 3
    assert model.fc1.bias.grad is not None  # the last step's grad is left in place
    step_t = next(iter(opt.state.values()))["step"]
    assert float(step_t) == 2 + 3
    assert not torch.equal(torch.get_rng_state(), before["torch_rng"])
    # Identity is still kept: the optimizer holds the model's own tensors.
    for g, saved in zip(opt.param_groups, before["group_params"][0]):
        assert all(p is q for p, q in zip(g["params"], saved))


def test_restore_false_then_true_differ():
    """The comparison helpers can fail: a non-restored run is caught by assert_same."""
    model, opt = warmed_up()
    before = capture(model, [opt])
    diagkit.diagnose(model, opt, batch_fn=noisy_batch_fn, loss_fn=mse, steps=1, restore=False)
    with pytest.raises(AssertionError):
        assert_same(before, model, [opt])


# --------------------------------------------------------------------------- hooks
@pytest.mark.parametrize("fail", [False, True], ids=["ok", "failing_step"])
def test_no_hooks_remain(fail):
    model, opt = warmed_up()
    extra = nn.Parameter(torch.ones(3))  # held by the optimizer, not in the model
    opt.add_param_group({"params": [extra]})
    tensors = list(model.parameters()) + [extra]
    assert any(not t.requires_grad for t in tensors)  # frozen ones get hooked too

    def train_step(i):
        opt.zero_grad()
        loss = mse(model, noisy_batch_fn()) + extra.sum()
        loss.backward()
        if fail and i == 1:
            raise ValueError("fail")
        opt.step()
        return loss

    diag = diagkit.diagnose(model, opt, train_step=train_step, steps=3)
    assert (diag.failure is not None) == fail
    assert_no_diagkit_hooks(tensors, [opt])
    # Frozen tensors were toggled to hook them: they are frozen again.
    assert not model.frozen.weight.requires_grad and not model.frozen.bias.requires_grad


def test_user_hooks_survive_and_still_fire():
    model, opt = warmed_up()
    fired = {"grad": 0, "acc": 0, "step": 0}
    model.fc2.weight.register_hook(lambda g: fired.__setitem__("grad", fired["grad"] + 1))
    model.fc2.bias.register_post_accumulate_grad_hook(
        lambda p: fired.__setitem__("acc", fired["acc"] + 1))
    opt.register_step_pre_hook(lambda *a: fired.__setitem__("step", fired["step"] + 1))

    diagkit.diagnose(model, opt, batch_fn=noisy_batch_fn, loss_fn=mse, steps=2)
    assert fired == {"grad": 2, "acc": 2, "step": 2}  # they fired during the diagnosis
    assert len(model.fc2.weight._backward_hooks) == 1
    assert len(model.fc2.bias._post_accumulate_grad_hooks) == 1
    assert len(opt._optimizer_step_pre_hooks) == 1
    assert not model.fc1.weight._backward_hooks

    opt.zero_grad()
    mse(model, torch.randn(8, 4)).backward()
    opt.step()
    assert fired == {"grad": 3, "acc": 3, "step": 3}


# --------------------------------------------------------------------------- determinism
def test_diagnosing_twice_gives_identical_tables():
    model, opt = warmed_up()  # dropout + random batches: only restored RNG makes this equal
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    first = diagkit.diagnose(model, opt, batch_fn=noisy_batch_fn, loss_fn=mse, steps=3,
                             lr_scheduler=sched)
    second = diagkit.diagnose(model, opt, batch_fn=noisy_batch_fn, loss_fn=mse, steps=3,
                              lr_scheduler=sched)
    pd.testing.assert_frame_equal(first.steps, second.steps, check_exact=True)
    pd.testing.assert_frame_equal(first.params, second.params, check_exact=True)
    assert first.meta["losses"] == second.meta["losses"]
    assert first.verdicts() == second.verdicts()

    # restore=False measures the same run once more, but then leaves the trained state,
    # so the next diagnosis starts from elsewhere and its table differs.
    third = diagkit.diagnose(model, opt, batch_fn=noisy_batch_fn, loss_fn=mse, steps=3,
                             lr_scheduler=sched, restore=False)
    pd.testing.assert_frame_equal(first.steps, third.steps, check_exact=True)
    fourth = diagkit.diagnose(model, opt, batch_fn=noisy_batch_fn, loss_fn=mse, steps=3,
                              lr_scheduler=sched)
    with pytest.raises(AssertionError):
        pd.testing.assert_frame_equal(first.steps, fourth.steps, check_exact=True)
