"""The calls the diagnosis notebook's cells make: check its parameters, run the diagnosis (or
load a saved one), write its data files, show a figure, and the explorer. The same
`notebooks/diagnose.ipynb` runs in JupyterLab, headless under papermill, and behind
`diagkit report` (`report TARGET` runs, `report --from DIR` loads).
"""

from __future__ import annotations

import html
import io
from pathlib import Path

from ..core.errors import DiagkitError
from ..core.files import write_json_atomic
from ..core.format import one_line
from ..core.options import check_try_fix_options
from ..core.swap import recover
from . import contract
from .paths import resolve_paths
from .printed import collected


def check_parameters(namespace: dict) -> dict:
    """The notebook's parameters, checked against its parameters cell (`diagkit.run.contract`).

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
    copy of the target (`diagkit.run.try_fix`), as an escaped HTML table; else nothing.
    The preview makes its own two runs (the target as it is, then fixed), so its "before" is
    a run of its own, with the same target, arguments and steps as the run above."""
    if not settings.get("try_fix"):
        return ""
    from ..present.fix_preview import preview_html
    from .try_fix import try_fixes
    with collected():
        preview = try_fixes(settings["target"], settings["target_args"], steps=settings["steps"],
                            nproc=settings["nproc"], timeout=settings["timeout"],
                            delta=settings["delta"], every=settings["every"])
    return preview_html(preview)


def run(settings: dict):
    """Load the target (and checkpoint) and diagnose it, or load the saved diagnosis the
    `diagnosis` parameter names: what the notebook's run cell does. Returns (diagnosis, what
    the target printed meanwhile), the latter shown last, folded (`diagkit.run.printed`)."""
    if settings.get("diagnosis"):
        return load_saved(settings["diagnosis"]), ""
    from .api import run_target  # torch only when a run starts: `diagkit report` validates first
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
    from ..core.result import load  # torch and pandas: only for a folder worth reading
    try:
        return load(folder)
    except DiagkitError:
        raise
    except Exception as exc:  # what the checks of `core.saved` did not foresee
        raise DiagkitError(f"saved diagnosis {where} is unreadable (corrupt or incomplete): "
                           f"{type(exc).__name__}: {one_line(exc)[:200]}") from None


def origin_html(settings: dict) -> str:
    """One line above the banner saying where a loaded diagnosis came from (a report rendered
    later from a saved run must not read as if it had just run); empty for a run."""
    if not settings.get("diagnosis"):
        return ""
    return (f"<p>Saved diagnosis loaded from <code>{html.escape(str(settings['diagnosis']))}"
            "</code> (not run again).</p>")


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
    if not enabled:
        return None
    from ..present.explorer import explore
    return explore(diag)
