"""Fix preview (`diagkit check TARGET --try-fix`, the notebook's `try_fix`): every finding's
suggested fix tried on a fresh copy of the setup before the user applies it.

The target is diagnosed as `check` does, then called again for a fresh copy (the user's
objects, and the first copy, are never changed), the fixes of `run.diagnose.fixes` are applied to that
copy in memory, the same steps run again, and the two diagnoses are set side by side: each
finding's verdict before -> after, the optimizer-state bytes the fixes save, and under
`--nproc` the measured step time with the old and the fixed DDP settings.
"""

from __future__ import annotations

import contextlib
import dataclasses

from ...core.errors import DiagkitError
from ...core.format import one_line
from ...core.options import DEFAULTS
from ...core.result import Diagnosis
from ...judge.verdicts import VERDICTS
from .fixes import apply_plan, plan_fixes
from .pipeline import judge_observation, observe
from ..target.target import load_target


@dataclasses.dataclass(frozen=True)
class FixPreview:
    """Two diagnoses of the same target, before and after the fixes, and the fixes tried.

    `rows`: one per finding before, with `after` (the verdicts its tensors have after the fix,
    ("ok",) when none; ("gone",) when the fixed copy no longer tracks them) and `helped`.
    `new`: findings of the fixed run that were not there before. `step_time`: under --nproc,
    seconds per step with find_unused_parameters True (old) and False (fixed), or None."""

    target: str
    before: Diagnosis
    after: Diagnosis
    rows: list[dict]
    new: list
    step_time: dict | None
    find_unused_parameters: bool | None

    @property
    def not_helped(self) -> list[dict]:
        """The fixes that were applied and left their verdict in place."""
        return [r for r in self.rows if r["automatic"] and not r["helped"]]

    @property
    def all_ok(self) -> bool:
        """Every finding turned ok, and the fixed run has no finding of its own."""
        return all(r["helped"] for r in self.rows) and not self.after.findings

    @property
    def state_bytes_saved(self) -> int:
        """Optimizer-state bytes of the tensors dropped from an optimizer (`fixes.state_bytes`:
        from the optimizer's type, per element; the orphans added cost `added_bytes`)."""
        return sum(r["dropped_bytes"] for r in self.rows)

    def fails(self, fail_on: str) -> bool:
        """`check --try-fix`'s exit code 1: the fixed run's findings, judged as check's."""
        return self.after.fails(fail_on)

    def _repr_html_(self) -> str:
        from ...present.fix_preview import preview_html
        return preview_html(self)


class FixPreviewFailed(DiagkitError):
    """The run as it is completed, then the fix preview's own build or run failed. `before`
    is that first run: complete, and what `--json` and `--save` write (docs/fix-preview.md,
    "Fix preview")."""

    def __init__(self, message: str, before: Diagnosis):
        super().__init__(message)
        self.before = before


def try_fixes(target: str, target_args: dict | None = None, *, steps: int | None = None,
              nproc: int = DEFAULTS["nproc"], timeout: float = DEFAULTS["timeout"],
              delta: str = DEFAULTS["delta"], every: int = DEFAULTS["every"],
              on_before=None) -> FixPreview:
    """Diagnose `target`, apply each finding's fix to a fresh copy, diagnose that copy.

    `on_before(diagnosis)` is called with the run as it is as soon as it is judged, before
    the fresh copy is built: the CLI writes `--json` and `--save` there, so a second build
    that fails, hangs, or is ended by `--timeout` cannot lose the first run."""
    args = dict(target_args or {})
    if nproc > 1:
        return _try_distributed(target, args, nproc=nproc, steps=steps, timeout=timeout,
                                delta=delta, every=every, on_before=on_before)
    first = load_target(target, **args)
    before = judge_observation(observe(first, steps, delta=delta, every=every))
    if on_before is not None:
        on_before(before)
    plan = plan_fixes(before)
    with _second_run(before, "build (the target called again for a fresh copy)"):
        fresh = load_target(target, **args)
    _check_fresh(first, fresh, target)
    fixes = apply_plan(fresh, plan)
    with _second_run(before, "run (the fixed copy's steps)"):
        after = judge_observation(observe(fresh, steps, restore=False, delta=delta,
                                          every=every))
    return _preview(target, before, after, fixes, plan, step_time=None)


@contextlib.contextmanager
def _second_run(before: Diagnosis, what: str):
    """A one-line error of the fix preview's own build or run names it as the preview's, not
    the target's as the user runs it (that run completed: `before`)."""
    try:
        yield
    except DiagkitError as exc:
        raise FixPreviewFailed(f"--try-fix: the fix preview's {what} failed: {one_line(exc)}",
                               before) from exc


def _try_distributed(target, args, *, nproc, steps, timeout, delta, every,
                     on_before=None) -> FixPreview:
    """Under --nproc: the plan travels to every rank, which applies it to its own copy right
    after building the target, and wraps with the DDP setting the advice allows. The fixed
    run's measured cost is the step time with the old (True) and the fixed (False) setting."""
    from .launcher import diagnose_distributed
    common = dict(nproc=nproc, steps=steps, timeout=timeout, delta=delta, every=every)
    before = diagnose_distributed(target, args, **common)
    if on_before is not None:
        on_before(before)
    plan = plan_fixes(before)
    with _second_run(before, "build and run (the target built again on every rank, with "
                             "the fixes)"):
        after = diagnose_distributed(target, args, fixes=plan, **common)
    fixes = after.meta.get("fixes_applied") or [
        {**f, "applied": "not applied (the fixed run failed before)", "dropped_bytes": 0,
         "added_bytes": 0} for f in plan["fixes"]]
    cost = (after.advice or {}).get("find_unused_parameters", {}).get("measured_cost")
    step_time = ({"old": cost["seconds_per_step_true"], "fixed": cost["seconds_per_step_false"],
                  "rounds": cost["rounds"], "steps_per_round": cost["steps_per_round"]}
                 if cost else None)
    return _preview(target, before, after, fixes, plan, step_time=step_time)


def _check_fresh(first, fresh, target: str) -> None:
    """The second call must build new objects: fixing shared ones would change the user's."""
    mine = {id(p) for p in first.model.parameters()}
    mine |= {id(p) for opt in first.optimizers for g in opt.param_groups for p in g["params"]}
    shared = fresh.model is first.model or any(id(p) in mine for p in fresh.model.parameters())
    shared = shared or any(o is f for o in fresh.optimizers for f in first.optimizers)
    if shared:
        raise DiagkitError(f"--try-fix: target {target!r} returns the same model or optimizer "
                           "on every call; it needs a fresh copy to fix (build them inside "
                           "the target's function)")


def _preview(target, before, after, fixes, plan, step_time) -> FixPreview:
    """Each finding before, beside what its tensors are after the fix."""
    after_verdicts = dict(zip(after.params["name"], after.params["verdicts"]))
    after_codes = {f.code for f in after.findings}
    rows = []
    for fix in fixes:
        seen = [after_verdicts[n] for n in fix["names"] if n in after_verdicts]
        verdicts = tuple(sorted({v for vs in seen for v in vs} - {"ok"}))
        if fix["code"] not in VERDICTS and fix["code"] in after_codes:
            verdicts = (fix["code"], *verdicts)  # a run-level finding (DDP's refusal) again
        after_of = verdicts or (("ok",) if seen or not fix["names"] else ("gone",))
        rows.append({**fix, "after": after_of, "automatic": fix["action"] != "none",
                     "helped": fix["code"] not in after_of
                     and not set(after_of) - _verdicts_of(before, fix["names"]) - {"gone"}})
    before_of = {(r["code"], n) for r in rows for n in r["names"]}
    new = [f for f in after.findings
           if not any((f.code, n) in before_of for n in f.params)
           and not (not f.params and f.code in {r["code"] for r in rows})]
    return FixPreview(target=target, before=before, after=after, rows=rows, new=new,
                      step_time=step_time, find_unused_parameters=plan["find_unused_parameters"])


def _verdicts_of(diag, names) -> set[str]:
    """The verdicts `names` had in `diag` ("ok" among them): a verdict a fix brings that was
    not there before (an orphan put into a group whose lr is 0 is then `stalled`) means the
    fix did not help."""
    p = diag.params
    return {"ok"} | {v for vs in p.loc[p["name"].isin(names), "verdicts"] for v in vs}


def command(args) -> int:
    """`diagkit check TARGET --try-fix`: the findings of the run as it is (what --json and
    --save write, as without --try-fix), then the preview. Exit code: the fixed run's
    findings against --fail-on (0 once every fix took, unless a finding has no automatic fix).
    The run as it is is printed and written as soon as it completes, before the fresh copy
    is built: a preview whose build fails or hangs then ends in one line saying so (exit 2),
    with the first run kept."""
    from ...core.files import check_output
    from ...core.options import check_try_fix_options
    from ...present.fix_preview import render_preview
    from .check_outputs import check_outputs, unwritten_line
    from ..target.cli_run import bounded, import_timeout, parse_target_args, precheck_target
    for option in ("json", "save"):
        check_output(getattr(args, option, None), f"--{option}")
    check_try_fix_options(True, meta=args.meta, checkpoint=args.checkpoint,
                          label=lambda name: "--" + name.replace("_", "-"))
    kwargs = parse_target_args(args.arg)
    precheck_target(args.target, kwargs, None, import_timeout(args))
    unwritten: dict[str, str] = {}
    with bounded(args):
        try:
            preview = try_fixes(args.target, kwargs, steps=args.steps, nproc=args.nproc,
                                timeout=args.timeout or DEFAULTS["timeout"], delta=args.delta,
                                every=args.every,
                                on_before=lambda diag: unwritten.update(
                                    check_outputs(args, diag)))
        except FixPreviewFailed as exc:
            raise DiagkitError(f"{exc}; {_kept(args, unwritten)}") from None
    print()
    print(render_preview(preview))
    problems = [unwritten_line(args, unwritten)] if unwritten else []
    for diag, which in ((preview.before, "run as it is"), (preview.after, "fix preview's run")):
        if diag.meta.get("timed_out"):
            problems.append(f"--try-fix: the {which} {diag.failure.error}")
    if problems:
        raise DiagkitError("; ".join(problems))
    return 1 if preview.fails(args.fail_on) else 0


def _kept(args, unwritten: dict[str, str]) -> str:
    """What of the run as it is was kept, for the line of a fix preview that failed."""
    from .check_outputs import unwritten_line
    if unwritten:
        return unwritten_line(args, unwritten)
    outputs = [f"--{o} {getattr(args, o)}" for o in ("json", "save") if getattr(args, o, None)]
    return ("the run as it is completed: its findings are above"
            + (f", written to {' and '.join(outputs)}" if outputs else ""))
