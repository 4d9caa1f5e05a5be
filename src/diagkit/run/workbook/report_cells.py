"""What the HTML report keeps of an executed notebook, and the first lines of a report of
several targets.

The notebook is written for JupyterLab: it tells its reader how to use it ("Edit the
parameters below … then run all"), and it has a section for everything a run may show. A
report is a page with no code cells: the cells tagged `notebook-only` are left out, and the
sections tagged `diagkit-optional` whose cells showed nothing (no whole-run timeline, no fix
preview, one process, no checkpoint, no live explorer, nothing printed) take one line
together at the end instead of a heading each. `report.ipynb` keeps every cell.
"""

from __future__ import annotations

import copy
from datetime import datetime

NOTEBOOK_ONLY = "notebook-only"
OPTIONAL = "diagkit-optional"


def for_report(nb):
    """A copy of the executed notebook `nb` as the HTML report shows it."""
    import nbformat
    nb = copy.deepcopy(nb)
    kept, folded = [], []
    cells, i = nb.cells, 0
    while i < len(cells):
        cell = cells[i]
        tags = cell.get("metadata", {}).get("tags", [])
        if NOTEBOOK_ONLY in tags:
            i += 1
            continue
        end = i + 1
        while end < len(cells) and cells[end].cell_type == "code":
            end += 1
        if cell.cell_type == "markdown" and OPTIONAL in tags and _empty(cells[i + 1:end]):
            folded.append(_folded_name(cell))
            i = end
            continue
        kept.append(cell)
        i += 1
    if folded:
        kept.append(nbformat.v4.new_markdown_cell(
            f"*Nothing to show:* {', '.join(folded)}.",
            metadata={"tags": ["diagkit-folded"]}))
    nb.cells = kept
    return nb


def _empty(code_cells) -> bool:
    """Each cell ran and showed nothing (a cell that never ran, after a failure, is not
    'nothing to show': its section keeps its heading)."""
    return bool(code_cells) and all(
        c.get("execution_count") is not None and not any(_shows(o) for o in c.get("outputs", []))
        for c in code_cells)


def _shows(output) -> bool:
    if output.get("output_type") == "stream":
        return bool(str(output.get("text", "")).strip())
    data = output.get("data") or {}
    if "text/html" in data:
        return bool(str(data["text/html"]).strip())
    return True  # an error, an image, anything else


def _folded_name(cell) -> str:
    """'Fix preview (with `try_fix`)': the section's heading and when it shows."""
    source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
    title = next((line.lstrip("#").strip() for line in source.splitlines() if line.strip()), "")
    when = cell.get("metadata", {}).get("diagkit", {}).get("shown")
    return f"{title} ({when})" if when else title


def merged_intro(title: str, parts: list[tuple[str, str | None, int | None]], escape) -> str:
    """The first cell of a report of several targets: its title, when it was written, and
    each target with its worst severity and steps (`parts`: name, worst, steps observed)."""
    when = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z").strip()
    lines = []
    for name, worst, steps in parts:
        facts = [f"worst **{worst}**" if worst else "no findings"]
        if steps is not None:
            facts.append(f"{steps} step{'s' if steps != 1 else ''} observed")
        lines.append(f"- {escape(name)}: {', '.join(facts)}")
    return f"# {escape(title)}\n\nWritten {when}.\n\n" + "\n".join(lines)
