"""`diagkit.watch` inside the user's own loop: steps told by the optimizers, the same verdicts
as `diagnose`, every hook gone afterwards, and training bitwise unchanged."""

from __future__ import annotations

import gc
import signal
import weakref

import pytest
import torch
import torch.nn as nn

import diagkit
from diagkit.core.errors import DiagkitError
from models import MLP, NormNet, fixed_batch, mse_loss
from watch_loops import dead_head, hook_counts, plain_loop


# --------------------------------------------------------------------------- the result
def test_plain_loop_gets_the_verdicts_diagnose_gives():
    model, opt = dead_head()
    w = diagkit.watch(model, opt, steps=3)
    plain_loop(model, opt, 5)
    watched = w.diagnosis.verdicts()

    model, opt = dead_head()
    ran = diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=mse_loss, steps=3)
    assert watched == ran.verdicts()
    assert watched["dead.weight"] == {"unused"} and watched["body.weight"] == {"ok"}
    assert w.diagnosis.meta["steps_observed"] == 3 and w.diagnosis.meta["loop"] == "watch"


def test_orphan_zeroed_by_model_zero_grad_is_not_grad_not_cleared():
    """HF Trainer clears with model.zero_grad(): the orphan's .grad never carries over."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=3)
    plain_loop(model, opt, 3, zero="model")
    v = w.diagnosis.verdicts()
    assert v["fc2.weight"] == {"orphan"} and v["fc1.weight"] == {"ok"}

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=3)
    plain_loop(model, opt, 3, zero="optimizer")  # optimizer.zero_grad() never clears fc2
    assert w.diagnosis.verdicts()["fc2.weight"] == {"orphan", "grad_not_cleared"}


def test_accumulation_counts_optimizer_steps():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=2)
    plain_loop(model, opt, 4, accumulate=3)
    diag = w.diagnosis
    assert sorted(diag.steps["step"].unique()) == [0, 1]
    assert diag.meta["optimizer_steps"] == 2
    assert set().union(*diag.verdicts().values()) == {"ok"}


def test_every_samples_a_long_run():
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=3, every=4)
    plain_loop(model, opt, 20)
    assert sorted(w.diagnosis.steps["step"].unique()) == [0, 4, 8]
    assert w.diagnosis.meta["optimizer_steps"] == 9  # detached right after step 8


def test_clipping_scheduler_and_no_zeroing():
    torch.manual_seed(0)
    model = NormNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    w = diagkit.watch(model, opt, steps=3)
    plain_loop(model, opt, 3, zero="none", clip=0.01, scheduler=sched)
    diag = w.diagnosis
    lrs = diag.steps[diag.steps["name"] == "fc.weight"].sort_values("step")["lr"].tolist()
    assert lrs == pytest.approx([1e-2, 5e-3, 2.5e-3])
    # .grad is never zeroed: from step 1 on every gradient lands on the last one
    assert diag.verdicts()["fc.weight"] == {"grad_not_cleared"}


def test_two_optimizers_one_step_when_both_stepped():
    torch.manual_seed(0)
    model = MLP()
    a = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    b = torch.optim.Adam(model.fc2.parameters(), lr=0.01)
    w = diagkit.watch(model, [a, b], steps=2)
    for _ in range(3):
        a.zero_grad(), b.zero_grad()
        mse_loss(model, fixed_batch()).backward()
        a.step()
        b.step()
    diag = w.diagnosis
    assert sorted(diag.steps["step"].unique()) == [0, 1]
    assert set().union(*diag.verdicts().values()) == {"ok"}


# --------------------------------------------------------------------------- the lifecycle
def test_detaches_by_itself_and_costs_nothing_after():
    model, opt = dead_head()
    before = hook_counts(model, [opt])
    w = diagkit.watch(model, opt, steps=2)
    during = hook_counts(model, [opt])
    assert during[0] == 4 and during[1] == 2  # a hook per tensor; the clock's and the observer's
    observer = weakref.ref(w.observer)
    plain_loop(model, opt, 2)
    assert w.done and hook_counts(model, [opt]) == before
    gc.collect()
    assert observer() is None  # the observer, its snapshots and records are freed
    plain_loop(model, opt, 3)  # training goes on without diagkit
    assert w.diagnosis.meta["optimizer_steps"] == 2


def test_ending_inside_its_hook_leaves_the_users_later_hook_alone():
    """torch iterates the hook dict while our hook ends the watch: a later hook still runs."""
    model, opt = dead_head()
    w = diagkit.watch(model, opt, steps=1)
    calls = []
    opt.register_step_post_hook(lambda *a: calls.append(1))
    plain_loop(model, opt, 3)
    assert calls == [1, 1, 1] and w.done
    w.stop()
    assert hook_counts(model, [opt])[1] == 1  # only the user's own


@pytest.fixture
def users_sigterm():
    """The user's own SIGTERM handler, in place for the test and put back after it."""
    def handler(signum, frame):
        raise AssertionError("not called here")
    previous = signal.signal(signal.SIGTERM, handler)
    yield handler
    signal.signal(signal.SIGTERM, previous)


def test_a_live_watch_takes_sigterm_and_gives_the_users_handler_back(users_sigterm):
    """While it observes, SIGTERM saves the watch first (tests/e2e/test_watch_ends.py runs
    it); when the watch ends, by its steps or by stop(), the user's handler is back."""
    model, opt = dead_head()
    model2, opt2 = dead_head()  # a second run: one watch per optimizer (docs/workbook.md)
    w = diagkit.watch(model, opt, steps=2)
    assert signal.getsignal(signal.SIGTERM) is not users_sigterm
    w2 = diagkit.watch(model2, opt2, steps=50)  # two live watches: one handler, kept until
    plain_loop(model, opt, 2)                   # both end
    assert w.done and signal.getsignal(signal.SIGTERM) is not users_sigterm
    w2.stop()
    assert signal.getsignal(signal.SIGTERM) is users_sigterm
    assert w2.diagnosis.meta["ended"] == "stop" and w.diagnosis.meta["ended"] == "steps"


def test_a_sigterm_the_user_ignores_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        model, opt = dead_head()
        w = diagkit.watch(model, opt, steps=5)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        w.stop()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stop_and_with_block_end_early_and_keep_the_steps():
    model, opt = dead_head()
    with diagkit.watch(model, opt, steps=50) as w:
        plain_loop(model, opt, 3)
    assert w.done and w.diagnosis.meta["steps_observed"] == 3
    assert hook_counts(model, [opt]) == (0, 0, hook_counts(model, [opt])[2])

    model, opt = dead_head()
    w = diagkit.watch(model, opt, steps=50)
    plain_loop(model, opt, 2)
    diag = w.stop()
    assert diag is w.diagnosis and diag.meta["steps_observed"] == 2


def test_a_step_that_raises_is_dropped_and_the_loop_sees_its_own_error():
    model, opt = dead_head()
    w = diagkit.watch(model, opt, steps=10)
    plain_loop(model, opt, 2)
    opt.zero_grad()
    with pytest.raises(RuntimeError, match="shapes"):
        model(torch.zeros(2, 9))
    diag = w.stop()
    assert sorted(diag.steps["step"].unique()) == [0, 1]


def test_saves_to_out_and_loads(tmp_path):
    model, opt = dead_head()
    w = diagkit.watch(model, opt, steps=2, out=tmp_path / "diag")
    plain_loop(model, opt, 2)
    loaded = diagkit.load(tmp_path / "diag")
    assert loaded.verdicts() == w.diagnosis.verdicts()
    assert loaded.meta["loop"] == "watch"


@pytest.mark.parametrize("args, message", [
    (lambda m, o: ("model", o), "torch.nn.Module"),
    (lambda m, o: (m, "adam"), "torch optimizers"),
    (lambda m, o: (m, [o, o]), "passed twice"),
])
def test_bad_objects_are_one_line_errors(args, message):
    model, opt = dead_head()
    with pytest.raises(DiagkitError, match=message):
        diagkit.watch(*args(model, opt))
    assert hook_counts(model, [opt])[:2] == (0, 0)


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps must be a positive int"),
    ({"every": -1}, "every must be a positive int"),
    ({"delta": "fast"}, "delta must be one of"),
    ({"timeout": -1}, "timeout must be a positive number of seconds"),
    ({"timeout": "60"}, "timeout must be a positive number of seconds"),
])
def test_bad_options_are_one_line_errors(kwargs, message):
    model, opt = dead_head()
    with pytest.raises(DiagkitError, match=message):
        diagkit.watch(model, opt, **kwargs)


@pytest.mark.parametrize("out, message", [("file", "exists and is not a folder"),
                                          ("file/diag", "is not a folder"),
                                          ("full", "did not write")])
def test_an_out_that_cannot_be_written_fails_before_training(tmp_path, out, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("the user's")
    model, opt = dead_head()
    with pytest.raises(DiagkitError, match=message):
        diagkit.watch(model, opt, out=tmp_path / out)
    assert hook_counts(model, [opt])[:2] == (0, 0)


def test_a_failure_inside_observation_never_reaches_the_loop(monkeypatch):
    model, opt = dead_head()
    w = diagkit.watch(model, opt, steps=5)

    def broken(*_a, **_k):
        raise ValueError("probe broke")
    monkeypatch.setattr(w.observer, "end_step", broken)
    plain_loop(model, opt, 3)  # no exception here
    diag = w.diagnosis
    assert diag.failure is not None and "probe broke" in diag.failure.error
    assert hook_counts(model, [opt])[:2] == (0, 0)


# --------------------------------------------------------------------------- wrapped objects
def test_sees_through_data_parallel_and_compile():
    for wrap in (nn.DataParallel, lambda m: torch.compile(m, backend="aot_eager")):
        model, opt = dead_head()
        wrapped = wrap(model)
        w = diagkit.watch(wrapped, opt, steps=2)
        for _ in range(2):
            opt.zero_grad()
            wrapped(fixed_batch()).pow(2).mean().backward()
            opt.step()
        v = w.diagnosis.verdicts()
        assert v["dead.weight"] == {"unused"} and v["body.weight"] == {"ok"}, wrap
        assert w.diagnosis.meta["wrappers"] in (["DataParallel"], ["OptimizedModule"])


# --------------------------------------------------------------------------- bitwise unchanged
