"""`diagkit.watch` raises only what the user passed wrong, as a one-line `DiagkitError`; anything
else diagkit cannot do (an internal error while taking the inventory, attaching, observing or
judging) is one line through the "diagkit" logger and the diagnosis' `failure`, and the user's
training goes on, bitwise as without diagkit (docs/watch.md, "Diagnose your real training
run")."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.optim.optimizer as optim_hooks

import diagkit
import diagkit.run.watch.begin as begin_module
import diagkit.run.watch.observations as observations_module
from diagkit.core.errors import DiagkitError
from diagkit.measure.step.observer import Observer
from diagkit.measure.clock.run_clock import RunClock
from diagkit.measure.clock.step_clock import StepClock
from models import MLP, fixed_batch, mse_loss


def broken(*_args, **_kwargs):
    raise RuntimeError("an internal error")


def run(watched: bool, loop_steps: int = 4, **options):
    """The user's loop, with or without a watch: (the watch, the state it leaves, the hooks
    left on its objects)."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    w = diagkit.watch(model, opt, **options) if watched else None
    for _ in range(loop_steps):
        opt.zero_grad()
        mse_loss(model, fixed_batch()).backward()
        opt.step()
    if w is not None:
        w.stop()  # what the user's program does next (a whole-run watch ends there)
    state = ([p.detach().clone() for p in model.parameters()],
             [p.grad.clone() for p in model.parameters()],
             [v.clone() for s in opt.state.values() for v in s.values()])
    hooks = (sum(len(p._backward_hooks or {}) for p in model.parameters())
             + len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)
             + len(optim_hooks._global_optimizer_pre_hooks)  # a whole run's, for every optimizer
             + len(optim_hooks._global_optimizer_post_hooks))
    return w, state, hooks


def bitwise_equal(a, b) -> bool:
    return all(len(x) == len(y) and all(torch.equal(s, t) for s, t in zip(x, y))
               for x, y in zip(a, b))


def diagkit_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "diagkit"]


FAILING = {  # where diagkit itself fails, as a watch begins, observes or ends
    "inventory": [(begin_module, "take_inventory")],
    "attach": [(Observer, "attach")],
    "clock": [(StepClock, "start"), (RunClock, "start")],  # steps=N's, steps=None's
    "end_step": [(Observer, "end_step")],
    "judging": [(observations_module, "judge_observation")],
}


@pytest.mark.parametrize("where", list(FAILING))
@pytest.mark.parametrize("steps", [3, None])
def test_an_internal_error_is_one_logged_line_and_training_goes_on(monkeypatch, caplog, where,
                                                                   steps):
    _, plain, _ = run(watched=False)
    for owner, name in FAILING[where]:
        monkeypatch.setattr(owner, name, broken)
    with caplog.at_level(logging.INFO, logger="diagkit"):
        w, state, hooks = run(watched=True, steps=steps)
    assert bitwise_equal(state, plain)  # the user's training, as without diagkit
    assert hooks == 0 and w.done
    lines = diagkit_lines(caplog)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "RuntimeError: an internal error" in lines[0] and "unwatched" in lines[0]
    diag = w.diagnosis
    assert diag.failure is not None and "an internal error" in diag.failure.error
    assert "an internal error" in diag.failure.traceback
    assert diag.findings[0].code == "step_failed"


def test_a_failed_watch_saves_its_failure_and_stops_quietly(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(begin_module, "take_inventory", broken)
    with caplog.at_level(logging.INFO, logger="diagkit"):
        w, _, _ = run(watched=True, loop_steps=2, out=tmp_path / "diag")
        assert w.stop() is w.diagnosis and "0 tensors, done" in repr(w)
    assert len(diagkit_lines(caplog)) == 1
    loaded = diagkit.load(tmp_path / "diag")
    assert loaded.meta["ended"] == "failed" and "an internal error" in loaded.failure.error


def test_what_the_user_passed_wrong_still_raises_one_line():
    with pytest.raises(DiagkitError) as err:
        diagkit.watch(MLP(), "adam")
    assert "\n" not in str(err.value)
