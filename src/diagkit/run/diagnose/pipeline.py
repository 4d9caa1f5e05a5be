"""The one orchestrator: observe a setup's steps, then judge what was observed into one
complete `Diagnosis`. Every entry point (`diagnose`, `run_target`, the distributed launcher)
ends here, so a result is built once, with its findings, advice and checkpoint report.
"""

from __future__ import annotations

import dataclasses
import time

import pandas as pd
import torch

from ...core.errors import DiagkitError
from ...core.options import DEFAULTS, check_run_options
from ...core.result import Diagnosis, LoadReport, StepFailure
from ...judge.advice import build_advice
from ...judge.checkpoint_audit import audit, audit_finding, load_findings
from ...judge.findings import build_findings, subtrees
from ...judge.rules_change import untold_why, zero_gradient_untold
from ...judge.rules_ranks import never_stepped
from ...judge.verdicts import VERDICTS, judge, not_judged_without_optimizer, not_measured_on_meta
from ...measure.tables.aggregate import build_params
from ...measure.model.inventory import take_inventory
from ...measure.step.observer import Observer
from ...measure.engines.unwrap import compiled_entry
from ...measure.model.restore import SavedState
from ..target import deadline
from ..target.deadline import is_timeout
from .loop import loop_facts, run_steps, step_function
from ..target.target import Setup


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one process measured: the static rows, the steps table, a failure, run facts."""

    rows: list[dict]
    steps: pd.DataFrame
    failure: StepFailure | None
    meta: dict


def observe(setup: Setup, steps: int | None = None, *, restore: bool = True,
            checksums: bool = False, on_progress=None, delta: str = DEFAULTS["delta"],
            every: int = DEFAULTS["every"], sample: int = DEFAULTS["sample"]) -> Observation:
    """Measure only: run the steps under observation and return the tables (no judging)."""
    try:
        n_steps = resolve_steps(steps, setup.steps)
        check_run_options(steps=n_steps, delta=delta, every=every, sample=sample)
        if restore and setup.engine is not None:
            raise DiagkitError(
                "diagkit cannot put a DeepSpeed engine back as it was after its steps (ZeRO "
                "keeps its state in flat partitions): run a DeepSpeed target with --nproc N "
                "(diagkit run TARGET --nproc 2), whose ranks are discarded afterwards, or "
                "watch the engine in your own script: diagkit.watch(engine)")
        inventory = take_inventory(setup.model, setup.optimizers)
        if not inventory.tensors:
            raise DiagkitError("the model has no parameters and the optimizers hold none: "
                               "nothing to diagnose")
        observer = Observer(inventory, setup.optimizers, delta=delta, sample=sample,
                            checksums=checksums, on_progress=on_progress,
                            loop=loop_facts(setup), entry=compiled_entry(setup.model))
    except BaseException:
        deadline.finish()  # no steps will run: nothing left to time out
        raise
    _keep_for_timeout(inventory, observer, n_steps)
    saved = (SavedState(setup.model, inventory.tensors, setup.optimizers, setup.lr_scheduler)
             if restore else None)
    started = time.perf_counter()
    try:
        with observer:
            failure = run_steps(observer, step_function(setup), n_steps, every=every)
    finally:
        if saved is not None:
            saved.restore()
            observer.unregistered.forget_grads()
    meta = {
        "steps_requested": n_steps,
        **({"timed_out": True} if is_timeout(failure) else {}),
        "loop": "train_step" if setup.train_step is not None else "standard",
        "losses": observer.losses,
        "skipped_optimizer_steps": observer.skipped_optimizer_steps,
        "seconds": round(time.perf_counter() - started, 4),
        "torch": torch.__version__,
        "restored": restore,
        "delta": delta,
        "every": every,
        **({"sample": sample} if delta != "exact" else {}),
        **({"optimizer_sources": setup.optimizer_sources} if setup.optimizer_sources else {}),
        **({"wrappers": ["DeepSpeedEngine"]} if setup.engine is not None else {}),
    }
    return Observation(observer.rows, observer.steps_table(), failure, meta)


def resolve_steps(steps: int | None, target_steps: int | None) -> int:
    """The one rule for how many steps a run observes, on every path (`check`, `report`, the
    notebook, `--nproc` ranks): an explicit `steps` wins over the target's own `steps`, which
    wins over the default."""
    if steps is not None:
        return steps
    return target_steps if target_steps is not None else DEFAULTS["steps"]


def _keep_for_timeout(inventory, observer: Observer, n_steps: int) -> None:
    """Under `--timeout`, what the run completed so far, in case its process must be ended
    with the main thread stuck (`deadline`): the steps recorded, judged as a failed run."""
    clock = deadline.active()
    if clock is not None:
        clock.snapshot = lambda: Observation(
            observer.rows, observer.steps_table(),
            StepFailure(step=clock.step or 0, error=clock.message(), traceback=""),
            {"steps_requested": n_steps, "timed_out": True, "torch": torch.__version__})


# The params columns a meta pass cannot measure: counts of value facts (no values to count).
_VALUE_COUNTS = ("changed_steps", "carried_steps", "nonfinite_steps")


def _values_not_measured(params):
    """On meta, the counts of value facts are <NA> (not measured), never a guessed 0; the
    norms are NaN already."""
    return params.assign(**{c: pd.array([pd.NA] * len(params), dtype="Int64")
                            for c in _VALUE_COUNTS})


def _meta_rows_not_measured(params):
    """A real run's tensors on the meta device (an optimizer built before `to_empty()`
    holds them) have no values: on their rows, as on a dry run's, the counts of value facts
    are <NA> and the verdicts that need values are not judged (their flags read False, never
    guessed True: a stall would be guessed from them). docs/meta.md, "Meta tensors in a real
    run"."""
    rows = (params["device"] == "meta").to_numpy() if "device" in params else None
    if rows is None or not rows.any():
        return params
    params = params.copy()
    for c in _VALUE_COUNTS:
        column = pd.array(params[c], dtype="Int64")
        column[rows] = pd.NA
        params[c] = column
    values = {name for name, v in VERDICTS.items() if v.needs == "values"}
    params.loc[rows, "verdicts"] = pd.Series(
        [tuple(v for v in vs if v not in values) or ("ok",) for vs in params["verdicts"][rows]],
        index=params.index[rows], dtype=object)
    return params


def judge_observation(obs: Observation, *, checkpoint: LoadReport | None = None,
                      ddp: dict | None = None, cost: dict | None = None) -> Diagnosis:
    """Judge what was observed (by one process, or gathered from every rank) into the result.

    `checkpoint`: what loading a checkpoint first did (its findings and dead bytes join the
    result); `ddp`, `cost`: what a distributed run learnt about DDP (see `build_advice`).
    """
    on_meta = obs.meta.get("device") == "meta"
    held = obs.meta.get("optimizers") != 0  # 0: a watch of hand-written updates
    params = build_params(obs.rows, obs.steps)
    params["verdicts"], check_errors = judge(params, obs.steps, meta=on_meta, optimizers=held)
    params = _values_not_measured(params) if on_meta else _meta_rows_not_measured(params)
    report, extra = None, []
    if checkpoint is not None:
        result = audit(params, checkpoint)
        report = {"load": checkpoint.to_dict(), "audit": result, "summary": checkpoint.summary()}
        extra = load_findings(checkpoint) + [f for f in [audit_finding(result, checkpoint.path)]
                                             if f]
    observed = int(obs.steps["step"].nunique()) if len(obs.steps) else 0
    not_judged = {**(not_judged_without_optimizer() if not held else {}),
                  **({} if on_meta else untold_zeros(params, obs.steps))}
    return Diagnosis(
        params=params, steps=obs.steps,
        findings=build_findings(params, obs.steps, check_errors, obs.failure,
                                extra + never_stepped(obs.meta.get("ranks")),  # a watch's ranks
                                sources=obs.meta.get("optimizer_sources", ()),
                                context={"wrappers": obs.meta.get("wrappers"), "ddp": ddp,
                                         "names": obs.meta.get("names")}),
        advice=build_advice(params, obs.steps, ddp=ddp, cost=cost,
                            wrappers=obs.meta.get("wrappers")), failure=obs.failure,
        meta={**obs.meta, "steps_observed": observed,
              **({"not_measured": not_measured_on_meta()} if on_meta else {}),
              **({"not_judged": not_judged} if not_judged else {})},
        checkpoint=report)


def untold_zeros(params, steps, names=None) -> dict[str, str]:
    """`meta["not_judged"]`'s zero_gradient entry ({} when it has none): the tensors that got
    only exactly-zero gradients on steps that cannot tell (`names`, else found in `steps`;
    never a meta tensor's, which has no values), named by their findings' labels (one pattern
    for the same module in each layer)."""
    if names is None:
        names = zero_gradient_untold(params, steps)
    flagged = params["name"].isin(set(names)).to_numpy()
    if "device" in params:
        flagged = flagged & (params["device"] != "meta").to_numpy()
    if not flagged.any():
        return {}
    labels = [label or "the whole model" for label, _, _ in subtrees(params, flagged)]
    where = ", ".join(label if len(label) <= 60 else "…" + label[-59:] for label in labels[:3])
    return {"zero_gradient": untold_why(int(flagged.sum()),
                                        where + (", …" if len(labels) > 3 else ""))}
