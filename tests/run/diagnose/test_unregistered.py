"""`unregistered`: tensors that require grad and get gradients through the loss but are outside
`.parameters()` and every optimizer, found in the step's autograd graph, named by where they
live, measured like any tensor from then on (diagnose, watch, --meta; `--nproc` in
tests/e2e/test_unregistered_ddp.py)."""

from __future__ import annotations

import torch
from torch import nn

import diagkit
from diagkit.measure.model.inventory import take_inventory
from diagkit.measure.step.observer import Observer
from models import (MLP, ListCells, NormNet, PlainMemory, TakesPrompt, TiedLM, fixed_batch,
                    make_prompt_loss, mse_loss)

CELLS = [f"cells[{i}].{w}" for i in (0, 1) for w in ("bias_hh", "bias_ih", "weight_hh",
                                                      "weight_ih")]


def run(model, loss_fn=mse_loss, steps=3, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=loss_fn, steps=steps,
                            **kw)


def unregistered(diag) -> set[str]:
    return {n for n, vs in diag.verdicts().items() if "unregistered" in vs}


def test_modules_in_a_plain_list_are_unregistered_and_named_by_path():
    diag = run(ListCells())
    assert unregistered(diag) == set(CELLS)
    p = diag.params.set_index("name")
    assert "orphan" not in set().union(*(diag.verdicts()[n] for n in CELLS))
    assert set(p.loc[CELLS, "module"]) == {"cells[0]", "cells[1]"}
    assert set(p.loc[CELLS, "module_type"]) == {"LSTMCell"}
    assert (p.loc[CELLS, "bytes"] == p.loc[CELLS, "numel"] * 4).all()
    assert (p.loc[CELLS, "used_steps"] == 3).all() and (p.loc[CELLS, "changed_steps"] == 0).all()
    assert not p.loc[CELLS, "in_model"].any() and (p.loc[CELLS, "n_optimizers"] == 0).all()
    assert p.loc["cells[1].weight_ih", "grad_norm"] > 0
    [finding] = [f for f in diag.findings if f.code == "unregistered"]
    assert finding.severity == "error" and finding.module == "cells" and finding.count == 8
    assert "\n    self.cells = nn.ModuleList(self.cells)\n" in finding.fix
    assert "register_buffer" in finding.fix
    assert diag.verdicts()["head.weight"] == {"ok"}


def test_plain_tensor_and_dict_entry_get_parameter_fixes():
    diag = run(PlainMemory())
    assert unregistered(diag) == {"mem_keys", "memory['values']"}
    fixes = {f.params: f.fix for f in diag.findings if f.code == "unregistered"}
    assert "    self.mem_keys = nn.Parameter(self.mem_keys)" in fixes[("mem_keys",)]
    assert "nn.ParameterDict" in fixes[("memory['values']",)]
    # Nothing zeroes their .grad either: it piles up, and the steps show it.
    s = diag.steps[diag.steps["name"] == "mem_keys"]
    assert list(s["carried_grad"]) == [False, True, True]
    assert s["grad_total_norm"].is_monotonic_increasing


def test_forward_argument_is_an_input_and_a_loss_only_tensor_is_unregistered():
    """A tensor the model's forward is called with is an input (it may require grad on
    purpose); `scale`, reachable only through the loss and held by nothing, is unregistered
    and, found by no attribute path, named by shape and dtype."""
    loss_fn, prompt, scale = make_prompt_loss()
    diag = run(TakesPrompt(), loss_fn=loss_fn)
    assert unregistered(diag) == {"<unregistered #0 () torch.float32>"}
    assert set(diag.params["name"]) == {"fc.weight", "fc.bias",
                                        "<unregistered #0 () torch.float32>"}
    assert scale.grad is None  # diagnose dropped the .grad its steps left on what it found


def test_an_input_that_requires_grad_on_purpose_is_not_unregistered():
    def batch_fn():
        return fixed_batch().requires_grad_()  # input gradients (a saliency map)
    model = MLP()
    diag = diagkit.diagnose(model, torch.optim.SGD(model.parameters(), lr=0.1),
                            batch_fn=batch_fn, loss_fn=mse_loss, steps=2)
    assert len(diag.params) == 4
    assert all(v == {"ok"} for v in diag.verdicts().values())


def test_models_without_any_get_no_row_and_no_verdict():
    for model in (MLP(), NormNet(), TiedLM()):
        inv = take_inventory(model, [])
        loss = (lambda m, b: m(b).float().pow(2).mean()) if not isinstance(model, TiedLM) \
            else (lambda m, b: m(torch.arange(6).reshape(2, 3) % 5).pow(2).mean())
        diag = run(model, loss_fn=loss)
        assert len(diag.params) == len(inv.tensors)
        assert not unregistered(diag)


def test_an_optimizer_only_tensor_stays_not_in_model():
    model, extra = MLP(), nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    diag = diagkit.diagnose(model, opt, batch_fn=fixed_batch,
                            loss_fn=lambda m, b: (m(b) * extra).pow(2).mean(), steps=2)
    assert not unregistered(diag)
    assert "not_in_model" in diag.verdicts()["<optimizer 0 group 0 #4>"]


def test_the_graph_is_walked_once_when_nothing_changed():
    model = ListCells()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Observer(take_inventory(model, [opt]), [opt]) as obs:
        for i in range(4):
            obs.begin_step(i)
            opt.zero_grad()
            loss = mse_loss(model, fixed_batch())
            loss.backward()
            opt.step()
            obs.end_step(loss)
    assert obs.unregistered.walks == 1 and len(obs.unregistered.tensors) == 8
    assert obs.unregistered.walk_seconds > 0
    assert not obs.attached


class SometimesMemory(nn.Module):
    """A branch taken on odd steps only uses a registered layer and a plain tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)
        self.bank = torch.ones(4, requires_grad=True)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.fc(x)
        return self.extra(h) * self.bank if self.calls % 2 == 0 else h


def test_a_new_branch_is_walked_again_and_its_tensor_found_then():
    diag = run(SometimesMemory(), steps=4)
    assert unregistered(diag) == {"bank"}
    s = diag.steps[diag.steps["name"] == "bank"]
    assert list(s["step"]) == [1, 2, 3] and list(s["used"]) == [True, False, True]
    assert "intermittent" in diag.verdicts()["bank"]


def test_watch_finds_them_in_the_users_loop():
    model = PlainMemory()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=3)
    for _ in range(4):
        opt.zero_grad()
        mse_loss(model, fixed_batch()).backward()
        opt.step()
    diag = w.diagnosis
    assert unregistered(diag) == {"mem_keys", "memory['values']"}
    assert len(diag.steps[diag.steps["name"] == "mem_keys"]) == 3


def test_meta_dry_run_finds_them_without_values():
    with torch.device("meta"):
        model = ListCells()
    diag = run(model, device="meta")
    assert unregistered(diag) == set(CELLS)
    assert diag.params.set_index("name").loc[CELLS, "grad_norm"].isna().all()


def test_a_buffer_that_requires_grad_is_named_by_its_buffer_path():
    class Buffered(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("bank", torch.ones(4, requires_grad=True))

        def forward(self, x):
            return self.fc(x) * self.bank
    diag = run(Buffered())
    assert unregistered(diag) == {"bank"}


def fgsm_step(model, opt, x, y, eps=0.05):
    """One FGSM adversarial-training step: the input's gradient makes the attack, then the
    model trains on the attacked input."""
    x = x.clone().requires_grad_()  # a fresh leaf each step: an input, not state
    model.zero_grad()
    mse_loss(model, x).backward()
    x_adv = (x + eps * x.grad.sign()).detach()
    opt.zero_grad()
    loss = (model(x_adv) - y).pow(2).mean()
    loss.backward()
    opt.step()
    return loss


def test_an_fgsm_loop_is_clean_under_watch_and_diagnose():
    """The attacked input requires grad and gets a gradient every step, outside the model's
    forward arguments once (`x * 1` style use is common too): made during the step, never
    unregistered."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    y = torch.zeros(6, 3)

    def attack_inside_the_loss(i):  # the leaf enters through an op, not as the argument
        x = fixed_batch().clone().requires_grad_()
        model.zero_grad()
        (model(x * 1.0) - y).pow(2).mean().backward()
        return fgsm_step(model, opt, (x + 0.05 * x.grad.sign()).detach(), y)

    w = diagkit.watch(model, opt, steps=3)
    for _ in range(3):
        fgsm_step(model, opt, fixed_batch(), y)
    assert w.diagnosis.findings == [] and not unregistered(w.diagnosis)
    diag = diagkit.diagnose(model, opt, train_step=attack_inside_the_loss, steps=3)
    assert not unregistered(diag) and len(diag.params) == 4
    assert set().union(*diag.verdicts().values()) == {"ok"}


def test_a_tensor_reused_across_steps_outside_the_model_is_unregistered():
    """A universal perturbation kept across steps and trained by nothing: not on the model,
    not an argument of its forward, yet the same object every step: state, so unregistered
    (from the step it is met again)."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    delta = torch.zeros(6, 4, requires_grad=True)
    diag = diagkit.diagnose(model, opt, batch_fn=fixed_batch,
                            loss_fn=lambda m, b: mse_loss(m, b + delta), steps=3)
    [name] = unregistered(diag)
    assert name.startswith("<unregistered #0 (6, 4)")
    assert list(diag.steps[diag.steps["name"] == name]["step"]) == [1, 2]
