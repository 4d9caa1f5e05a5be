"""A whole-run watch's result (docs/whole-run.md, "The whole run"): the diagnosis judged from
the kept steps, with what the run saw window by window put back over it: every verdict each
tensor had, the timeline's spans, the wiring changes, the steps dropped and what no window
could tell."""

from __future__ import annotations

import dataclasses

from ...core.files import records
from ...core.result import Diagnosis
from ...judge.findings import sort_findings
from ...judge.verdicts import VERDICTS
from ..diagnose.pipeline import untold_zeros


def run_result(run, base: Diagnosis) -> Diagnosis:
    """`base` (judged from the kept steps of `run`, a `WholeRun`) with the run's verdicts,
    spans and events."""
    params = base.params.copy()
    params["verdicts"] = [tuple(v for v in VERDICTS if v in run.verdicts.get(n, ()))
                          or ("ok",) for n in params["name"]]
    findings = [f for f in base.findings if f.code not in VERDICTS]
    if run.ranks is not None and run.ranks.mismatch is not None:
        findings.append(run.ranks.mismatch)
    not_judged = {v: why for v, why in base.meta.get("not_judged", {}).items()
                  if v != "zero_gradient"}
    not_judged.update(untold_zeros(params, base.steps, names=run.untold - run.told))
    meta = {**{k: v for k, v in base.meta.items() if k != "not_judged"},
            **({"not_judged": not_judged} if not_judged else {}),
            "events": list(run.events), "dropped_steps": list(run.dropped),
            "kept_steps": run.kept.describe(),
            "windows": run.windows, "timeline": records(run.timeline.table().astype(object)),
            "steps_observed": run.kept.observed + len(run.dropped)}
    return dataclasses.replace(base, params=params, meta=meta,
                               findings=sort_findings(findings + run.spans()))
