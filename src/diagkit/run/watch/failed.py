"""What a watch that diagkit itself could not carry on leaves behind (docs/watch.md, "Diagnose
your real training run"): one line through the "diagkit" logger, and a `Diagnosis` whose
`failure` says what failed, with its traceback. The user's training goes on unwatched: only
what the user passed wrong is raised, as a one-line `DiagkitError`.
"""

from __future__ import annotations

import logging
import traceback

import pandas as pd

from ...core.format import brief
from ...core.result import Diagnosis, StepFailure
from ...core.schema import PARAMS_COLUMNS
from ...judge.advice import build_advice
from ...judge.findings import build_findings
from ...measure.tables.step_records import StepRecords

log = logging.getLogger("diagkit")


def failed_diagnosis(exc: Exception, what: str, earlier: tuple[str, str] | None, meta: dict,
                     clock=None) -> Diagnosis:
    """Say it in one line and return the result of a watch that failed. `what`: what diagkit
    could not do ("could not watch this run"); `earlier`: what had stopped observing before
    (text, traceback), if anything did; `clock`: the watch's step clock, for the step it
    failed at (None: before any). Nothing observed is kept: no tensor is judged on a part."""
    log.warning("diagkit: %s (%s: %s); training goes on unwatched", what, type(exc).__name__,
                brief(exc))
    text = f"diagkit {what}: {type(exc).__name__}: {brief(exc)}"
    trace = traceback.format_exc()
    if earlier is not None:
        text = f"diagkit stopped observing: {earlier[0]}; then {text}"
        trace = f"{earlier[1]}\n{trace}"
    failure = StepFailure(step=0 if clock is None else clock.count, error=text, traceback=trace)
    params = pd.DataFrame({c: pd.Series(dtype=object) for c in PARAMS_COLUMNS})
    steps = StepRecords([], checksums=False).table()
    try:
        findings, advice = build_findings(params, steps, (), failure), build_advice(params, steps)
    except Exception:  # noqa: BLE001  the failure itself is the result
        findings, advice = [], {}
    return Diagnosis(params=params, steps=steps, findings=findings, advice=advice,
                     failure=failure, meta={**meta, "steps_observed": 0})


def stopped(step: int, error: tuple[str, str]) -> StepFailure:
    """Observing failed inside a step (`error`: its text and traceback; the step clock stops
    it, never the loop): one line through the "diagkit" logger, and the failure to judge."""
    log.warning("diagkit: stopped observing at optimizer step %d (%s); training goes on "
                "unwatched", step, error[0])
    return StepFailure(step=step, error=f"diagkit stopped observing: {error[0]}",
                       traceback=error[1])


def detach_quietly(clock, observer, run=None) -> None:
    """Remove whatever of a watch is attached, its step clock's hooks, the observer's and a
    whole run's own (None: not made yet); nothing raises, as diagkit is failing already."""
    for remove in (getattr(clock, "stop", None), getattr(observer, "detach", None),
                   getattr(run, "unhook", None)):
        if remove is not None:
            try:
                remove()
            except Exception:  # noqa: BLE001  the hooks that could be removed are
                pass
