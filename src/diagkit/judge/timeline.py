"""Verdicts over time: the findings of a whole-run watch, each with the observed steps over
which it held (docs/whole-run.md, "The whole run").

A whole-run watch judges its observed steps window by window (`diagkit.run.watch.whole_run`). Here,
pure functions of those windows' findings: a finding of the same verdict over the same module
subtree in consecutive windows is one span, from the step it was first seen (`since`) to the
last observed step it held on (`until`); a window without it ends it (`ended`: the first
observed step it no longer held on). Nothing here measures.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from ..core.result import Finding
from .verdicts import VERDICTS


@dataclasses.dataclass
class Span:
    """One finding over a stretch of the run; `event`: the wiring change that began it."""

    finding: Finding
    since: int
    until: int
    ended: int | None = None
    event: dict | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.finding.code, self.finding.module


class Timeline:
    """The spans so far: `advance` with each judged window, `findings()` to read them."""

    def __init__(self):
        self.spans: list[Span] = []
        self._open: dict[tuple[str, str], Span] = {}

    def advance(self, findings: list[Finding], first: int, last: int,
                onsets: dict[tuple[str, str], int] | None = None,
                events: list[dict] = ()) -> list[Span]:
        """Join the findings of the window of observed steps `first`..`last`; the spans that
        begin in it are returned (the ones to announce). `onsets`: the first step of the
        window each new finding held on (else `first`); `events`: the wiring changes so far."""
        seen, new = set(), []
        for f in findings:
            if f.code not in VERDICTS:  # run-level findings (a failed step) are not spans
                continue
            key = (f.code, f.module)
            seen.add(key)
            span = self._open.get(key)
            if span is not None:
                span.finding, span.until = f, last
                continue
            since = (onsets or {}).get(key, first)
            span = Span(f, since, last, event=_cause(events, since))
            self._open[key] = span
            self.spans.append(span)
            new.append(span)
        for key in [k for k in self._open if k not in seen]:
            self._open.pop(key).ended = first
        return new

    def open_keys(self) -> set[tuple[str, str]]:
        """The (code, module) of the spans that still held in the last window."""
        return set(self._open)

    def findings(self) -> list[Finding]:
        """Every span as a finding whose message says when it held."""
        return [as_finding(s) for s in self.spans]

    def table(self) -> pd.DataFrame:
        """One row per span: what the report's timeline draws."""
        return pd.DataFrame([{"code": s.finding.code, "severity": s.finding.severity,
                              "module": s.finding.module, "since": s.since, "until": s.until,
                              "ended": s.ended} for s in self.spans],
                            columns=["code", "severity", "module", "since", "until", "ended"])


def _cause(events: list[dict], since: int) -> dict | None:
    """The latest wiring change at or before `since`: what a new finding began with."""
    before = [e for e in events if e["step"] <= since]
    return before[-1] if before else None


def when(span: Span) -> str:
    """`from step 5000` / `over steps 100-900 (ended at step 1000)`, and its cause."""
    said = (f"from step {span.since}" if span.ended is None
            else f"over steps {span.since}-{span.until} (ended at step {span.ended})")
    if span.event is not None:
        said += f"; at step {span.event['step']}: {span.event['what']}"
    return said


def as_finding(span: Span) -> Finding:
    f = span.finding
    return dataclasses.replace(f, message=f"{f.message} [{when(span)}]", since=span.since,
                               until=span.until, ended=span.ended)


def onsets(steps: pd.DataFrame, keys: set[tuple[str, str]], findings_of
           ) -> dict[tuple[str, str], int]:
    """The first observed step of a window on which each new finding (`keys`) holds when that
    step is judged alone; a finding no single step shows (`intermittent`) starts with the
    window. `findings_of(steps)` judges a steps table into its findings."""
    found: dict[tuple[str, str], int] = {}
    for step in sorted(steps["step"].unique()):
        if len(found) == len(keys):
            break
        for f in findings_of(steps[steps["step"] == step]):
            key = (f.code, f.module)
            if key in keys and key not in found:
                found[key] = int(step)
    return found
