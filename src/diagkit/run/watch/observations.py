"""What a watch observed, on its way to the judge: each recorded step handed on as it comes
(`published`: the live view, rank 0), and at the end every hook off (`detach`), the
observations of every rank gathered into one (`concluded`), nothing of them kept by the watch
(`release`), and judged (`judged`)."""

from __future__ import annotations

import numpy as np

from ...core.result import Diagnosis, StepFailure
from ...measure.engines.ddp_facts import ddp_facts
from ..diagnose.pipeline import Observation, judge_observation
from .ranks import assemble
from .whole_run_result import run_result


def published(w, index: int) -> None:
    """Watch `w` recorded observed step `index`: under a process group, publish it for rank
    0; the live view may take a snapshot."""
    if w.live is not None:
        w.live.recorded()
    if w.channel is not None:
        observer = w.observer if w.run is None else w.run.observer
        columns = observer.step_columns(index)
        rank = np.full(len(columns["name"]), w.channel.rank, dtype=np.int64)
        # The wiring is compared across ranks by rank 0 (`whole_run.Ranks`).
        w.channel.publish_step({"rank": rank, **columns},
                               None if w.run is None else w.run.wiring.digest())


def detach(w) -> None:
    """Every hook of watch `w` off: the clock's, the observer's, the whole run's (which judges
    the window in progress)."""
    w.clock.stop()
    if w.run is None:  # the frozen base's read at the end (docs/cost.md)
        w.observer.close_window()
    w.observer.detach()
    if w.run is not None:
        w.run.finish()


def concluded(w, failure: StepFailure | None, meta: dict) -> Observation | None:
    """What watch `w` (detached) judges: its own observations, or under a process group every
    rank's, gathered by rank 0 (None on the others: theirs are published to it). `meta` gains
    what only the end knows."""
    if w.run is None:
        meta["dropped_steps"] = [{"step": i, "why": why} for i, why in w.observer.dropped]
        # A step a loss scaler skipped ran on into the next one taken (`measure.step.skips`).
        meta["skipped_optimizer_steps"] = w.observer.skipped_optimizer_steps
    if w.channel is None:
        return (Observation(w.observer.rows, w.observer.steps_table(), failure, meta)
                if w.run is None else w.run.observation(failure, meta))
    if w.run is None:  # with the unregistered tensors found
        w.channel.publish_rows(w.observer.rows)
    w.channel.finish({"failure": failure, "observed": w.clock.observed,
                      "optimizer_steps": w.clock.count})
    if w.channel.rank != 0:
        return None
    steps, failure, ranks, rows = assemble(w.channel, w.timeout, failure, w.observer.rows)
    meta.update(ranks=ranks, nproc=w.channel.world, backend=w.channel.backend)
    return (Observation(rows, steps, failure, meta)
            if w.run is None else w.run.observation(failure, meta))


def release(w) -> None:
    """Drop watch `w`'s observer (its buffers and records go with it) and the process group's
    store: nothing of the watch outlives it."""
    if w.clock is not None:
        w.clock.obs = None
    w.observer = w.run = None
    w.channel = None


def judged(observation: Observation, ddp, run) -> Diagnosis:
    """`observation` judged as `diagnose` judges (`ddp`: the DDP wrapper the loop holds, or
    None), and with a whole run (`run`) its verdicts, spans and events."""
    diagnosis = judge_observation(observation, ddp=ddp_facts(ddp))
    return diagnosis if run is None else run_result(run, diagnosis)
