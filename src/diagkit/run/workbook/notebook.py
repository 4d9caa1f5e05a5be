"""The calls the diagnosis notebook's cells make: check its parameters, run the diagnosis (or
load a saved one), write its data files, show a figure, and the explorer. The same
`notebooks/diagnose.ipynb` runs in JupyterLab, headless under papermill, and behind
`diagkit report` (`report TARGET` runs, `report --from DIR` loads).
"""

from __future__ import annotations

import html
import io
from datetime import datetime
from pathlib import Path

from ...core import extras
from ...core.errors import DiagkitError
from ...core.files import write_json_atomic
from ...core.format import one_line
from ...core.options import check_try_fix_options
from ...core.swap import recover
from . import contract
from ..target.paths import resolve_paths
from .printed import collected


class Cleared:
    """What `settings`, `diag` and `printed` hold from the moment a run is asked for until it
    has finished: any use of it raises one line. In JupyterLab, a cell that fails during "run
    all" does not always stop the cells queued after it (ipykernel aborts only the requests it
    has already received): those cells would show the previous run's diagnosis under the
    error. Cleared first, they say instead that there is no result for these parameters."""

    def __init__(self, what: str = "diagnosis"):
        self._what = what

    def refuse(self, *_args, **_kwargs):
        """Raise the one line: no result for the current parameters."""
        raise DiagkitError(f"no {self._what} for the current parameters: a cell above failed "
                           "or has not run yet (fix it, then run the cells from the "
                           "parameters cell on)")

    def __getattr__(self, name: str):
        if name.startswith("_"):  # IPython's display looks for _repr_*_ and the like
            raise AttributeError(name)
        self.refuse()

    __getitem__ = __iter__ = __len__ = __bool__ = __call__ = refuse

    def __repr__(self) -> str:
        return f"<no {self._what}: a cell above failed or has not run>"


def check_parameters(namespace: dict) -> dict:
    """The notebook's parameters, checked against its parameters cell (`diagkit.run.workbook.contract`).

    `target` has a default (a demo) so the notebook runs as it is; setting `diagnosis` as well
    is refused only when `target` was set too (papermill passed it, or it is not the default),
    since then one of the two would be silently ignored."""
    settings = contract.check_parameters(namespace, contract.DIAGNOSE)
    if settings.get("diagnosis") and "target" in settings:
        default = contract.declared(namespace, contract.DIAGNOSE)["target"].default
        if "target" in contract.injected(namespace) or settings["target"] != default:
            raise DiagkitError(f"set either target ({settings['target']!r}: run it) or "
                               f"diagnosis ({settings['diagnosis']!r}: load that saved run), "
                               "not both")
    return resolve_paths(_check_try_fix(settings),
                         {"checkpoint": "checkpoint", "diagnosis": "saved diagnosis"})


def validate(values: dict) -> dict:
    """Parameters for a run of the diagnosis notebook, checked and completed with defaults."""
    return _check_try_fix(contract.validate(values, contract.DIAGNOSE))


def _check_try_fix(settings: dict) -> dict:
    """`try_fix` needs a target to build again, and real steps: one line before any work."""
    if settings.get("try_fix") and settings.get("diagnosis"):
        raise DiagkitError("notebook parameter 'try_fix' needs a target to build again, not a "
                           "saved diagnosis")
    check_try_fix_options(settings.get("try_fix", False), meta=settings.get("meta", False),
                          checkpoint=settings.get("checkpoint"),
                          label=lambda name: f"notebook parameter {name!r}")
    return settings


def fix_preview_html(settings: dict) -> str:
    """The notebook's fix-preview cell: with `try_fix`, each finding's fix tried on a fresh
    copy of the target (`diagkit.run.diagnose.try_fix`), as an escaped HTML table; else nothing.
    The preview makes its own two runs (the target as it is, then fixed), so its "before" is
    a run of its own, with the same target, arguments and steps as the run above."""
    if not settings.get("try_fix"):
        return ""
    from ...present.fix_preview import preview_html
    from ..diagnose.try_fix import try_fixes
    with collected():
        preview = try_fixes(settings["target"], settings["target_args"], steps=settings["steps"],
                            nproc=settings["nproc"], timeout=settings["timeout"],
                            delta=settings["delta"], every=settings["every"])
    return preview_html(preview)


def run(settings: dict):
    """Load the target (and checkpoint) and diagnose it, or load the saved diagnosis the
    `diagnosis` parameter names: what the notebook's run cell does. Returns (diagnosis, what
    the target printed meanwhile), the latter shown last, folded (`diagkit.run.workbook.printed`)."""
    if settings.get("diagnosis"):
        return load_saved(settings["diagnosis"]), ""
    from ..diagnose.api import run_target  # torch only when a run starts: `diagkit report` validates first
    with collected() as printed:
        diag = run_target(settings["target"], settings["target_args"], steps=settings["steps"],
                          checkpoint=settings["checkpoint"] or None,
                          trust_checkpoint=settings["trust_checkpoint"],
                          nproc=settings["nproc"], timeout=settings["timeout"],
                          delta=settings["delta"], every=settings["every"],
                          meta=settings.get("meta", False))
    return diag, printed.getvalue()


def load_saved(path):
    """The diagnosis `Diagnosis.save` wrote to `path`, or a one-line DiagkitError saying why
    not. A relative path is read from the working folder, as the `checkpoint` parameter is.

    It may be anything a user typed, copied off a GPU node half-way, or written by another
    version: `diagkit.load` names a newer format, damage and missing columns in one line
    (`diagkit.core.saved`), and reads an older save with the values its missing columns meant
    then; anything else that goes wrong is said in one line too."""
    folder = Path(path)
    where = str(path) if folder.is_absolute() else f"{path} (from {Path.cwd()})"
    recover(folder)  # a save killed between its renames: put right before looking
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DiagkitError(f"saved diagnosis {where} {what}")
    from ...core.result import load  # torch and pandas: only for a folder worth reading
    try:
        return load(folder)
    except DiagkitError:
        raise
    except Exception as exc:  # what the checks of `core.saved` did not foresee
        raise DiagkitError(f"saved diagnosis {where} is unreadable (corrupt or incomplete): "
                           f"{type(exc).__name__}: {one_line(exc)[:200]}") from None


def header_html(settings: dict, diag) -> str:
    """The first thing the notebook and the report show: what was diagnosed (the target, or
    the saved folder, not run again), when, and the worst severity (the verdict banner, shown
    right under it, counts the steps)."""
    from ...present.sections import severity_chip
    esc = html.escape
    saved = settings.get("diagnosis")
    if saved:
        what = esc(str(saved))
        when = (f"a saved diagnosis, written {_when(_saved_at(Path(saved)))}, loaded from there "
                "(not run again)")
    else:
        what = esc(str(settings.get("target")))
        when = f"run {_when(datetime.now().astimezone())}"
    worst, n = diag.worst(), len(diag.findings or [])
    verdict = (severity_chip(worst, f"worst: <b>{worst}</b> "
                                    f"({n}\u00a0finding{'s' if n != 1 else ''})")
               if worst else severity_chip("ok", "<b>no findings</b>"))
    return (f'<div class="diagkit-header"><h1 style="margin:0 0 4px;font-size:1.6em;'
            f'overflow-wrap:anywhere">{what}</h1><p style="margin:0 0 6px">{when} '
            f'{verdict}</p></div>')  # (the banner below counts the steps)


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M %Z").strip() if moment else "at an unknown time"


def _saved_at(folder: Path) -> datetime | None:
    """When a saved diagnosis was written: its run.json's time (`Diagnosis.save`)."""
    try:
        return datetime.fromtimestamp((folder / "run.json").stat().st_mtime).astimezone()
    except OSError:
        return None


def html_or_nothing(text: str):
    """HTML to show, or None when there is nothing: an empty section shows no output at all
    (the report folds the sections that show nothing into one line)."""
    from IPython.display import HTML
    return HTML(text) if text else None


def over_the_run(diag) -> None:
    """A whole-run watch's timeline (its findings over the steps, the wiring changes) and the
    list of changes; nothing for a run that was not watched whole (there is no timeline)."""
    events = (diag.meta or {}).get("events")
    if events is None and not (diag.meta or {}).get("timeline"):
        return
    from IPython.display import HTML, display
    from ...present.timeline import events_html, timeline_figure, timeline_table
    display(show(timeline_figure(timeline_table(diag), events,
                                 diag.meta.get("optimizer_steps"))))
    display(HTML(events_html(events)))


def show(fig):
    """Display a matplotlib Figure as an embedded PNG (no pyplot, no GUI backend)."""
    from IPython.display import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return Image(data=buf.getvalue(), format="png")


def write_outputs(diag, out_dir: str | None) -> list[str]:
    """The report's data files. The caller (diagkit report) makes the folder atomic."""
    if not out_dir:
        return []
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    params = diag.params.copy()
    for col in ("aliases", "shape", "verdicts"):
        params[col] = params[col].map(lambda t: " ".join(map(str, t)))
    params["memberships"] = params["memberships"].map(
        lambda pairs: " ".join(f"{a}.{b}" for a, b in pairs))
    params.to_csv(folder / "params.csv", index=False)
    diag.steps.to_csv(folder / "steps.csv", index=False)
    write_json_atomic(folder / "findings.json", {
        "findings": [f.to_dict() for f in diag.findings], "advice": diag.advice,
        "failure": None if diag.failure is None else {
            "step": diag.failure.step, "error": diag.failure.error},
        "worst": diag.worst(), "meta": diag.meta})
    return ["params.csv", "steps.csv", "findings.json"]


def explorer(diag, enabled: bool = True):
    """The interactive explorer, or nothing in a rendered report (widgets need a live kernel)."""
    if isinstance(diag, Cleared):
        diag.refuse()
    if not enabled:
        return None
    extras.need(extras.EXPLORER, "the explorer")
    from ...present.explorer import explore
    return explore(diag)
