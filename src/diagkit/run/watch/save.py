"""Saving a watch's result as it ends (docs/watch.md): `out`, then the report. Never raises
into the loop: a failure is one line on stderr, and what is left of the result is said."""

from __future__ import annotations

from . import ends as watch_ends


def save(diagnosis, out, *, report: bool, ended: str) -> None:
    """Write `out` (and the report). Never raises: a failure is one line on stderr, and the
    result stays in `diagnosis`. A process being terminated renders no report: that takes
    a notebook run, longer than a scheduler waits before SIGKILL (SIGTERM, or SIGHUP: a
    terminal closed)."""
    if out is None:
        return
    try:
        diagnosis.save(out)
    except Exception as exc:  # a full disk, a folder replaced meanwhile: said, not raised
        watch_ends.report(f"diagkit: could not save the diagnosis to {out}: "
                          f"{type(exc).__name__}: {exc}" + _KEPT.get(ended, _KEPT["SIGTERM"]))
        return
    if not report:
        return
    saved = str(out.resolve())
    if ended.startswith("SIG"):  # SIGTERM, SIGHUP: the process is being ended
        watch_ends.report(f"diagkit: {ended}: the diagnosis is saved to {saved}; render its "
                          f"report with: diagkit report --from {saved} --out {saved}/report")
        return
    try:
        from ..workbook.report import write_report
        write_report(out / "report", {saved: {"diagnosis": saved}},
                     title=f"diagkit watch: {saved}")
    except Exception as exc:
        watch_ends.report(f"diagkit: the diagnosis is saved to {saved}, but its report could "
                          f"not be rendered: {type(exc).__name__}: {exc}")


# What is left of a result that could not be saved, by how the watch ended.
_KEPT = {"steps": " (it is still in Watch.diagnosis)", "stop": " (it is still in Watch.diagnosis)",
         "failed": " (it is still in Watch.diagnosis)",
         "exit": " (the process is exiting: the result is lost)",
         "SIGTERM": " (the process is being terminated: the result is lost)"}
