"""Rank 0 gathering a watch's ranks through the store (docs/watch.md, "Inside your torchrun
job"), in one process: two `RankChannel`s, one as rank 0 and one as rank 1, share one
in-memory store, and real backward passes and optimizer steps of two tiny models are what
each "rank" publishes. The torchrun jobs of the same cases: tests/e2e/test_rank_never_steps.py
and tests/e2e/test_whole_run_ranks.py.

- a rank that runs backward passes but never calls `optimizer.step()` is told from a dead
  one, and rank 0 does not wait the whole timeout for it (issue 36, R16);
- each rank's observed steps are counted from what it published, also the steps a whole-run
  watch's rank 0 took as it went (issue 36, R17).
"""

from __future__ import annotations

import gc
import time

import pytest
import torch
import torch.distributed as dist

from diagkit.judge.rules_ranks import NEVER_STEPPED, never_stepped
from diagkit.measure.clock.first_step import FirstStep
from diagkit.run.diagnose import gather
from diagkit.run.watch.ranks import assemble
from diagkit.run.watch.whole_run_ranks import WAIT, RankJoin


@pytest.fixture
def channels(monkeypatch):
    """channels(): (rank 0's channel, rank 1's) of one watch over one shared store."""
    store = dist.HashStore()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")

    def make():
        serial, made = gather._SERIAL["n"], []
        for rank in (0, 1):
            gather._SERIAL["n"] = serial  # every rank numbers its watches alike
            monkeypatch.setattr(dist, "get_rank", lambda r=rank: r)
            made.append(gather.RankChannel())
        return made
    return make


def trainer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def backward(model) -> None:
    model(torch.ones(4, 3)).pow(2).sum().backward()


def published_step(channel, step: int) -> None:
    """One observed step's columns, as a watch publishes them."""
    channel.publish_step({"rank": [channel.rank], "step": [step], "name": ["weight"]})


def stepping_rank_0(channel, steps: int = 2):
    """Rank 0 of a watch of `steps` steps: one backward, then a step, each time; done."""
    model, opt = trainer(0)
    channel.follow(list(model.parameters()), [opt])
    for i in range(steps):
        backward(model)
        opt.step()
        published_step(channel, i)
    channel.finish({"failure": None, "observed": steps, "optimizer_steps": steps})
    return model, opt


def test_a_rank_that_never_steps_is_alive_and_not_waited_for(channels):
    zero, one = channels()
    model, opt = trainer(1)
    one.follow(list(model.parameters()), [opt])
    for _ in range(3):  # forward and backward, never optimizer.step()
        opt.zero_grad()
        backward(model)
    stepping_rank_0(zero)
    started = time.monotonic()
    steps, failure, ranks, _rows = assemble(zero, 30.0, None, [])
    assert time.monotonic() - started < 10  # not the 30 s timeout: about SETTLE
    assert failure is None
    assert ranks[1] == {"state": "running", "observed_steps": 0, "optimizer_steps": 0,
                        "backward_passes": 3}
    assert ranks[0] == {"state": "done", "observed_steps": 2, "optimizer_steps": 2}
    assert sorted(steps["rank"]) == [0, 0]
    (finding,) = never_stepped(ranks)
    assert finding.code == NEVER_STEPPED and finding.severity == "error"
    assert finding.message.startswith(
        "rank 1 ran 3 backward passes but never called optimizer.step() while watched "
        "(rank 0 stepped 2 times)")
    assert "Rank 1 was alive" in finding.message and "optimizer.step()" in finding.fix


def test_a_rank_that_never_stepped_and_finished_says_so_in_its_status(channels):
    zero, one = channels()
    model, opt = trainer(1)
    one.follow(list(model.parameters()), [opt])
    backward(model)
    one.finish({"failure": None, "observed": 0, "optimizer_steps": 0})
    stepping_rank_0(zero)
    _steps, failure, ranks, _rows = assemble(zero, 30.0, None, [])
    assert failure is None
    assert ranks[1] == {"state": "done", "observed_steps": 0, "optimizer_steps": 0,
                        "backward_passes": 1}
    (finding,) = never_stepped(ranks)
    assert "rank 1 ran 1 backward pass but never" in finding.message
    assert "alive" not in finding.message  # it finished: nothing to say of it being alive


def test_a_silent_rank_that_had_stepped_is_waited_for_and_named(channels):
    zero, one = channels()
    model, opt = trainer(1)
    one.follow(list(model.parameters()), [opt])
    backward(model)
    opt.step()          # it steps, publishes two steps, then goes silent (hangs or died)
    published_step(one, 0)
    published_step(one, 1)
    stepping_rank_0(zero)
    started = time.monotonic()
    _steps, failure, ranks, _rows = assemble(zero, 0.5, None, [])
    assert time.monotonic() - started >= 0.5  # the whole timeout: it may yet come
    assert ranks[1] == {"state": "unfinished", "observed_steps": 2}
    assert failure.error == ("rank 1 did not finish within 0.5 s of rank 0 (died or hangs); "
                             "the steps it observed are kept (rank 1: 2)")
    assert never_stepped(ranks) == []


def test_a_silent_rank_before_its_first_step_says_how_far_it_got(channels):
    """As many backward passes as rank 0 needed for its first step, and no step yet: it may be
    about to step, so it is waited for; when it never reports, the failure says where it was."""
    zero, one = channels()
    model, opt = trainer(1)
    one.follow(list(model.parameters()), [opt])
    backward(model)
    stepping_rank_0(zero)
    _steps, failure, ranks, _rows = assemble(zero, 0.5, None, [])
    assert ranks[1]["state"] == "unfinished"
    assert failure.error.endswith("; rank 1 had run 1 backward pass and not yet called "
                                  "optimizer.step()")


def test_every_rank_counts_the_steps_it_published_also_those_taken_as_it_went(channels):
    """A whole-run watch's rank 0 takes (and frees) the other ranks' steps window by window:
    the steps left at the end are not what a rank observed (issue 36, R17: they read 0)."""
    zero, one = channels()
    for i in range(5):
        published_step(one, i)
    assert len(zero.take_steps(1)) == 5  # a window's join took them
    published_step(one, 5)
    one.finish({"failure": None, "observed": 6, "optimizer_steps": 6})
    stepping_rank_0(zero, steps=6)
    steps, failure, ranks, _rows = assemble(zero, 30.0, None, [])
    assert failure is None
    assert ranks[1]["observed_steps"] == 6 and ranks[0]["observed_steps"] == 6
    assert list(steps.loc[steps["rank"] == 1, "step"]) == [5]  # only the one not taken


def test_a_window_does_not_wait_for_a_rank_that_is_done_or_never_steps(channels):
    """A whole-run window's join waits up to WAIT for a rank a step or two behind, but not for
    one that said it is done (its last steps are taken) nor one that never steps."""
    import pandas as pd
    for case in ("done", "never steps"):
        zero, one = channels()
        model, opt = trainer(1)
        one.follow(list(model.parameters()), [opt])
        if case == "done":
            published_step(one, 0)
            one.finish({"failure": None, "observed": 1, "optimizer_steps": 1})
        else:
            for _ in range(3):
                backward(model)
        stepping_rank_0(zero)
        window = pd.DataFrame({"step": [0, 1], "name": ["weight", "weight"]})
        started = time.monotonic()
        joined = RankJoin(zero).join(window)
        assert time.monotonic() - started < WAIT / 2, case
        assert sorted(zip(joined["rank"], joined["step"])) == (
            [(0, 0), (0, 1), (1, 0)] if case == "done" else [(0, 0), (0, 1)]), case
        one.finish({"failure": None, "observed": 0, "optimizer_steps": 0})  # hooks off


def test_first_step_counts_backwards_until_the_first_step_then_lets_go():
    model, opt = trainer(0)
    seen = []
    first = FirstStep(list(model.parameters()), [opt],
                      lambda k, stepped: seen.append((k, stepped)))
    backward(model)
    backward(model)  # accumulated over two micro-batches
    opt.step()
    assert seen == [(1, False), (2, False), (2, True)] and first.attached
    backward(model)  # the first backward after it: every hook comes off
    assert not first.attached and seen == [(1, False), (2, False), (2, True)]
    assert not opt._optimizer_step_pre_hooks
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


def test_first_step_dropped_unclosed_leaves_no_hook_and_a_failing_report_stops_it():
    model, opt = trainer(0)
    first = FirstStep(list(model.parameters()), [opt], lambda k, stepped: None)
    del first
    gc.collect()
    assert not opt._optimizer_step_pre_hooks
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())

    def gone(k, stepped):
        raise RuntimeError("the store is gone")
    first = FirstStep(list(model.parameters()), [opt], gone)
    backward(model)   # never raises into the loop
    backward(model)   # and no longer counts
    opt.step()
    assert (first.backwards, first.broken, first.attached) == (1, True, False)
    first.close()
    assert not opt._optimizer_step_pre_hooks
