"""`diagkit report` and `diagkit demo`: execute the workbook with papermill, render offline HTML.

The report is the notebook itself, executed headless (`notebooks/diagnose.ipynb`, the same one a
user opens in JupyterLab), rendered with a template that loads nothing from the network. All
files are first written to a scratch folder beside the output folder, then moved in, the HTML
last: a reader never sees a half-written report that looks complete. If a cell fails or the
kernel dies, the HTML is still written, showing what ran and the error. The HTML leaves out
the notebook's instructions and folds its empty sections into one line (`report_cells`);
`report.ipynb` keeps every cell.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ...core import extras, severity
from ...core.errors import DiagkitError
from ...core.paths import real_path
from ...core.format import one_line
from ..target import signals
from .contract import DIAGNOSE, notebook_path
from .notebook import validate
from ..target.paths import LAUNCH_ENV
from .report_cells import for_report, merged_intro

_TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


@dataclasses.dataclass
class ReportResult:
    html: Path
    error: str | None  # one line: which cell failed and why, or None
    worst: str | None  # highest finding severity, when the notebook got that far
    timed_out: str | None = None  # the run's --timeout failure (its steps before are shown)


def write_report(out, sections: dict[str, dict], show_code: bool = False,
                 title: str = "diagkit report", notebook: str = DIAGNOSE,
                 check=validate) -> ReportResult:
    """Execute the workbook once per section (name -> notebook parameters) into one report.

    One section writes its data files at the top of `out`; several write them in a subfolder
    per section, and the report shows the sections one after another. Without the workbook
    extra (papermill, nbconvert, a kernel) it is one line saying to install it (README,
    "Install"): `watch(report=True)` then says so as it saves.
    """
    extras.need(extras.REPORT, "the report")
    import nbformat

    checked = {name: _given(params, check(params)) for name, params in sections.items()}
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DiagkitError(f"{out} exists and is not a folder")
    real = real_path(out, str(out))  # through a link: beside the folder it names,
    real.parent.mkdir(parents=True, exist_ok=True)  # so that every move is a rename
    scratch = Path(tempfile.mkdtemp(prefix=f".{real.name}.tmp-", dir=real.parent))
    try:  # (the scratch's 0700 reaches nothing: its entries move into `out`, never itself)
        notebooks, errors, worst, timed_out = [], [], [], []
        for name, params in checked.items():
            data_dir = scratch if len(checked) == 1 else scratch / _slug(name)
            nb, error = _execute(params, data_dir, scratch / f".{_slug(name)}.ipynb", notebook,
                                 name)
            notebooks.append((name, nb, _findings(data_dir)))
            if error:
                errors.append(f"{name}: {error}" if len(checked) > 1 else error)
            worst.append(_findings(data_dir).get("worst"))
            timed_out.append(_timed_out(data_dir))
        shown = [(name, for_report(nb), found) for name, nb, found in notebooks]
        nbformat.write(_merged(notebooks, title), scratch / "report.ipynb")
        (scratch / "report.html").write_text(_to_html(_merged(shown, title), show_code),
                                             encoding="utf-8")
        for leftover in scratch.glob(".*.ipynb"):
            leftover.unlink()
        with signals.deferred():  # the old report or the new one, never a mix
            _move_into(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ReportResult(html=out / "report.html", error="; ".join(errors) or None,
                        worst=severity.worst(w for w in worst if w),
                        timed_out=next(filter(None, timed_out), None))


def _execute(params: dict, data_dir: Path, output: Path, notebook: str, label: str):
    """Run a notebook with papermill; return the executed notebook and the failure, if any."""
    import nbformat
    import papermill
    from papermill.exceptions import PapermillExecutionError

    data_dir.mkdir(parents=True, exist_ok=True)
    parameters = {**params, "out_dir": str(data_dir)}
    error = None
    launched = os.environ.get(LAUNCH_ENV)
    os.environ[LAUNCH_ENV] = os.getcwd()  # the kernel's relative paths: from here (run.target.paths)
    try:
        papermill.execute_notebook(
            str(notebook_path(notebook)), str(output), parameters=parameters,
            kernel_name="python3", progress_bar={"file": sys.stderr, "desc": f"diagkit {label}"},
            cwd=os.getcwd(), request_save_on_cell_execute=False,
            # no kernel chatter on stderr: not even the ERROR a kernel logs when diagkit is
            # interrupted and shuts it down in the middle of a cell
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"])
    except PapermillExecutionError as exc:
        error = f"cell {exc.exec_count} failed: {exc.ename}: {_one_line(exc.evalue)}"
    except Exception as exc:  # the kernel died or could not start: still render what ran
        error = f"the notebook did not finish: {type(exc).__name__}: {_one_line(str(exc))}"
    finally:  # for this kernel only: later runs in this process may be launched elsewhere
        if launched is None:
            os.environ.pop(LAUNCH_ENV, None)
        else:
            os.environ[LAUNCH_ENV] = launched
    if output.is_file():
        nb = nbformat.read(output, as_version=4)
    else:
        nb = nbformat.read(notebook_path(notebook), as_version=4)
    if error:  # named: the cell that names the target may not have run
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(
            f"**This report is incomplete.** {_md_escape(label)}: {_md_escape(error)}"))
    return nb, error


def _given(params: dict, checked: dict) -> dict:
    """The checked values of the parameters the caller gave, for papermill to inject: the rest
    keep the cell's defaults, so the notebook can tell a parameter set on purpose from its
    default (`target` and `diagnosis` together are refused). `interactive` is always False:
    widgets need a live kernel."""
    given = {name: value for name, value in checked.items() if name in params}
    if "interactive" in checked:
        given["interactive"] = False
    return given


def _to_html(nb, show_code: bool) -> str:
    from nbconvert import HTMLExporter
    exporter = HTMLExporter(template_name="diagkit", extra_template_basedirs=[str(_TEMPLATES)],
                            exclude_input=not show_code, exclude_input_prompt=not show_code,
                            exclude_output_prompt=True, embed_images=True)
    body, _ = exporter.from_notebook_node(nb)
    return body


def _merged(notebooks, title: str):
    """One notebook: a single target's as it is; several after an intro that lists them (each
    part starts with its own header cell, which names its target)."""
    import nbformat
    if len(notebooks) == 1:
        nb = copy.deepcopy(notebooks[0][1])
        nb.metadata["title"] = title
        return nb
    merged = nbformat.v4.new_notebook(metadata=copy.deepcopy(notebooks[0][1].metadata))
    merged.metadata["title"] = title
    merged.cells.append(nbformat.v4.new_markdown_cell(merged_intro(
        title, [(name, found.get("worst"), (found.get("meta") or {}).get("steps_observed"))
                for name, _, found in notebooks], _md_escape)))
    for part, (name, nb, _) in enumerate(notebooks):
        for cell in nb.cells:
            if cell.cell_type == "markdown" and cell.source.startswith("# diagkit:"):
                continue
            cell = copy.deepcopy(cell)
            if "id" in cell:  # the same notebook ran once per target: keep cell ids unique
                cell["id"] = f"t{part}-{cell['id']}"[:64]
            merged.cells.append(cell)
    return merged


def _move_into(scratch: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    entries = sorted(scratch.iterdir(), key=lambda p: p.name == "report.html")  # HTML last
    for entry in entries:
        target = out / entry.name
        if entry.is_dir():
            if target.exists():
                shutil.rmtree(target)
        os.replace(entry, target)


def _findings(data_dir: Path) -> dict:
    """The run's findings.json (worst, meta, ...), or {} when the run did not get that far."""
    findings = data_dir / "findings.json"
    return json.loads(findings.read_text()) if findings.is_file() else {}


def _timed_out(data_dir: Path) -> str | None:
    """The failure of a run its --timeout ended (`diagkit.run.target.deadline`), from findings.json."""
    findings = data_dir / "findings.json"
    if not findings.is_file():
        return None
    payload = json.loads(findings.read_text())
    return (payload.get("failure") or {}).get("error") if (payload.get("meta") or {}).get(
        "timed_out") else None


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name.split(":")[-1])


def _one_line(text: str) -> str:
    return one_line(text)[:300]


def _md_escape(text: str) -> str:
    """Markdown cells render HTML: names in them are user data."""
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("`", "\\`"))
