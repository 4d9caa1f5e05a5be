"""The frozen base is read when observing begins and ends, not at each step (issue 35, item 3:
the per-step goal; docs/cost.md, "When the frozen base is read").

A tensor no optimizer holds and that does not require grad is fingerprinted at attach and once
more when observing ends (`diagnose`, `watch(steps=N)`), or at each window's close of a whole
run; a change between two reads is marked changed on the last recorded step, so
`frozen_but_changing` still fires. Checked: a change by hand in the middle of a watch (not on
its last step) is found by `watch`, `diagnose` and the whole run, with the base read only at
the edges (fingerprint calls counted); an untouched base gives no finding; `diagnose` still
puts the model back bitwise after its end read; a tensor a whole run sees unfrozen is not
flagged for its first trained step; under a process group the base stays per step.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import diagkit
from diagkit.measure.change.fingerprint import Fingerprinter
from diagkit.measure.model.inventory import take_inventory
from diagkit.measure.step.observer import Observer
from diagkit.run.watch.whole_run import WINDOW


def frozen_base():
    """A frozen layer no optimizer holds, then a trained head."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    model[0].requires_grad_(False)
    return model, torch.optim.SGD(model[2].parameters(), lr=0.1), torch.randn(4, 8)


@pytest.fixture
def reads(monkeypatch):
    """The tensors fingerprinted, by id, in order (every fingerprint diagkit takes)."""
    seen: list[int] = []
    real = Fingerprinter.__call__

    def counted(self, t, values=False):
        seen.append(id(t))
        return real(self, t, values)
    monkeypatch.setattr(Fingerprinter, "__call__", counted)
    return seen


def edit(model) -> None:
    """An in-place write to the frozen base, through .data: no version bump either."""
    with torch.no_grad():
        model[0].weight.data[1, 2] += 0.5


def train(model, opt, x, steps: int, change_at: int | None = None) -> None:
    for i in range(steps):
        opt.zero_grad()
        if i == change_at:
            edit(model)
        model(x).pow(2).mean().backward()
        opt.step()


def check(diag, changed: bool, steps: int = 4) -> None:
    """0.weight: marked changed on the last step only when it changed (never measured per
    step: NaN norms), frozen_but_changing then; 0.bias: never."""
    rows = diag.steps[diag.steps["name"] == "0.weight"].sort_values("step")
    assert rows["changed"].tolist() == [False] * (steps - 1) + [changed]
    assert rows["delta_norm"].isna().all()
    assert ("frozen_but_changing" in diag.verdicts()["0.weight"]) == changed
    assert "frozen_but_changing" not in diag.verdicts()["0.bias"]
    if not changed:
        assert diag.worst() is None, [f.message for f in diag.findings]


@pytest.mark.parametrize("changed", [True, False], ids=["changed", "untouched"])
def test_watch_reads_the_frozen_base_at_its_start_and_end_only(reads, changed):
    model, opt, x = frozen_base()
    w = diagkit.watch(model, opt, steps=4)
    train(model, opt, x, 4, change_at=1 if changed else None)
    check(w.diagnosis, changed)
    assert reads.count(id(model[0].weight)) == 2  # attach and the end: not each of 4 steps


@pytest.mark.parametrize("changed", [True, False], ids=["changed", "untouched"])
def test_diagnose_reads_it_before_restoring(reads, changed):
    """The end read comes before `restore=True` puts the model back: the change is seen, and
    the model still comes back bitwise (the edit undone with the rest)."""
    model, opt, x = frozen_base()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    calls = []

    def loss_fn(m, b):
        calls.append(1)
        if changed and len(calls) == 2:  # the second of 4 steps
            edit(m)
        return m(b).pow(2).mean()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=loss_fn, steps=4)
    check(diag, changed)
    assert reads.count(id(model[0].weight)) == 2
    for n, p in model.named_parameters():
        assert torch.equal(p.detach().view(torch.int32), before[n].view(torch.int32)), n


def test_the_whole_run_reads_it_once_a_window(reads):
    """A whole run (every=1): read at the start and at each window's close, never at each
    observed step; a change at step 6 is dated to the window it was read at the end of."""
    model, opt, x = frozen_base()
    w = diagkit.watch(model, opt, steps=None, every=1)
    train(model, opt, x, 4 + 3 * WINDOW, change_at=6)
    diag = w.stop()
    (finding,) = [f for f in diag.findings if f.code == "frozen_but_changing"]
    assert finding.since == 4 + WINDOW - 1  # the burst (0-3), then the window of steps 4-11
    assert diag.meta["windows"] == 4
    # attach, then each window's close (the last, at stop, recorded nothing: not read)
    assert reads.count(id(model[0].weight)) == 1 + 4
    rows = diag.steps[diag.steps["name"] == "0.weight"]
    assert rows.loc[rows["changed"], "step"].tolist() == [4 + WINDOW - 1]


def test_an_untouched_base_in_a_whole_run_is_clean(reads):
    model, opt, x = frozen_base()
    w = diagkit.watch(model, opt, steps=None, every=2)
    train(model, opt, x, 40)
    diag = w.stop()
    assert diag.worst() is None, [f.message for f in diag.findings]
    assert reads.count(id(model[0].weight)) <= 1 + diag.meta["windows"]


def test_under_a_process_group_the_base_is_read_each_step():
    """Each step is published as it is recorded there: no window (the base's prints per
    step, as the checksums of `rank_divergent` read it anyway)."""
    model, opt, _ = frozen_base()
    obs = Observer(take_inventory(model, [opt]), [opt], checksums=True)
    with obs:
        assert obs.window.indices == [] and len(obs.probe.prints.indices) == 2
    alone = Observer(take_inventory(model, [opt]), [opt])
    with alone:
        assert len(alone.window.indices) == 2 and alone.probe.prints.indices == []


def test_a_tensor_unfrozen_while_unobserved_is_not_frozen_but_changing():
    """A whole run sees the wiring change at the end of the unobserved step it happened in
    (step 35, every=10) and rebuilds its observer; the base is not read there (its first
    trained step would be dated to step 30, where it was frozen) and what stays frozen goes
    on unread."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    x = torch.randn(4, 8)
    w = diagkit.watch(model, opt, steps=None, every=10)
    for i in range(60):
        if i == 35:
            model[0].weight.requires_grad_(True)
            opt.add_param_group({"params": [model[0].weight]})
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    diag = w.stop()
    assert [e["kind"] for e in diag.meta["events"]] == ["requires_grad", "optimizer"]
    assert diag.worst() is None, [f.message for f in diag.findings]
