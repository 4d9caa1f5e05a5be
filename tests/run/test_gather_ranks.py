"""Rank 0 gathering a watch's ranks through the store (docs/watch.md, "Inside your torchrun
job"), in one process: two `RankChannel`s, one as rank 0 and one as rank 1, share one
in-memory store. The torchrun job of the same case: tests/e2e/test_whole_run_ranks.py.

- each rank's observed steps are counted from what it published, also the steps a whole-run
  watch's rank 0 took as it went (issue 36, R17).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from diagkit.run import gather
from diagkit.run.watch_ranks import assemble


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


def published_step(channel, step: int) -> None:
    """One observed step's columns, as a watch publishes them."""
    channel.publish_step({"rank": [channel.rank], "step": [step], "name": ["weight"]})


def test_every_rank_counts_the_steps_it_published_also_those_taken_as_it_went(channels):
    """A whole-run watch's rank 0 takes (and frees) the other ranks' steps window by window:
    the steps left at the end are not what a rank observed (issue 36, R17: they read 0)."""
    zero, one = channels()
    for i in range(5):
        published_step(one, i)
    assert len(zero.take_steps(1)) == 5  # a window's join took them
    published_step(one, 5)
    one.finish({"failure": None, "observed": 6, "optimizer_steps": 6})
    for i in range(6):
        published_step(zero, i)
    zero.finish({"failure": None, "observed": 6, "optimizer_steps": 6})
    steps, failure, ranks, _rows = assemble(zero, 30.0, None, [])
    assert failure is None
    assert ranks[1]["observed_steps"] == 6 and ranks[0]["observed_steps"] == 6
    assert list(steps.loc[steps["rank"] == 1, "step"]) == [5]  # only the one not taken
