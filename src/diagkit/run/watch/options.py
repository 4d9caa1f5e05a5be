"""Every option of `diagkit.watch`, checked in one place (the callbacks check theirs with it as
they are built), and the objects it was given, unwrapped."""

from __future__ import annotations

from pathlib import Path

from ...core import extras
from ...core.errors import DiagkitError
from ...core.files import check_output_dir
from ...core.options import DEFAULTS, check_option, check_run_options, positive_seconds
from ...measure.engines.unwrap import unwrap_model, unwrap_optimizers
from ...measure.engines.zero import ZeroView
from ..live.view import check_live
from ..trackers.choose import check_report_to


def check_watch_options(*, steps, every, delta, sample, out, report, timeout, on_finding=None,
                        halt_on=None, live=None,
                        memory_budget=DEFAULTS["memory_budget"], report_to=None) -> None:
    """Every option of `watch` checked before anything is attached (the callbacks check theirs
    with it as they are built): a bad one, or an `out` that cannot be written, fails now, not
    after training."""
    check_run_options(steps=steps, delta=delta, every=every, sample=sample)
    positive_seconds(timeout, "timeout")
    check_option("memory_budget", memory_budget)
    check_live(live)
    check_report_to(report_to)
    if on_finding is not None and not callable(on_finding):
        raise DiagkitError(f"on_finding must be a callable taking a Finding, got "
                           f"{type(on_finding).__name__}")
    if halt_on not in (None, "error", "warning"):
        raise DiagkitError(f"halt_on must be None, 'error' or 'warning', got {halt_on!r}")
    if report and out is None:
        raise DiagkitError("report=True needs out=DIR: the report is rendered from the "
                           "diagnosis saved there")
    if report:  # the report runs a notebook: said now, not after training (README, "Install")
        extras.need(extras.REPORT, "report=True")
    if out is not None:
        check_output_dir(Path(out), marker="run.json")


def unwrapped(model, optimizer_or_list) -> tuple:
    """(the module, the wrappers seen through, the torch optimizers) under what the loop holds;
    a `DiagkitError` names what cannot be watched. DeepSpeed's `engine.module` with
    `engine.optimizer` is still under the engine (its ZeRO optimizer says so)."""
    inner, wrappers = unwrap_model(model)
    optimizers = unwrap_optimizers(optimizer_or_list, model)
    if any(isinstance(o, ZeroView) for o in optimizers) and "DeepSpeedEngine" not in wrappers:
        wrappers.append("DeepSpeedEngine")
    return inner, wrappers, optimizers
