"""The shipped notebook after an error, in a real kernel driven as JupyterLab drives it (no
papermill: the parameters cell is edited in place, nothing is injected).

"Run all" in JupyterLab sends every cell at once; when one fails, ipykernel aborts only the
requests it has already received, so the cells after a failed one sometimes run anyway (3 of
4 tries in issue 37). Those cells must not show the previous run's diagnosis. Here they are
run on purpose after the failure (nbclient's `allow_errors`), which is that race, every time.
A parameter renamed in the parameters cell is an error here too, as it is under papermill.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

DIAGNOSE = Path(__file__).resolve().parents[3] / "notebooks" / "diagnose.ipynb"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NO_RESULT = "no diagnosis for the current parameters"


def shown(cell) -> str:
    """Everything a reader sees of a cell's outputs, as text."""
    parts = []
    for o in cell.get("outputs", []):
        if o.output_type == "error":
            parts.append(ANSI.sub("", "\n".join(o.traceback)))
        elif o.output_type == "stream":
            parts.append(o.text)
        else:
            parts += [str(v) for v in o.get("data", {}).values()]
    return "\n".join(parts)


def errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def test_after_a_failed_run_no_cell_shows_the_previous_diagnosis(tmp_path):
    shipped = nbformat.read(DIAGNOSE, as_version=4)
    (params,) = [c for c in shipped.cells if "parameters" in c.metadata.get("tags", [])]
    first = shipped.cells.index(params)
    after = [c for c in shipped.cells[first + 1:] if c.cell_type == "code"]

    def with_params(**values) -> nbformat.NotebookNode:
        source = params.source
        for name, value in values.items():
            source, n = re.subn(rf"^{name}: (.*?) = .*?  #", f"{name}: \\1 = {value!r}  #",
                                source, flags=re.M)
            assert n == 1, name
        return nbformat.v4.new_code_cell(source)

    good = with_params(steps=1, interactive=False)
    bad = with_params(target="no.such:thing", steps=1, interactive=False)
    renamed = nbformat.v4.new_code_cell(good.source.replace("steps: Optional[int] = 1",
                                                            "stepz = 3"))
    retyped = nbformat.v4.new_code_cell(good.source.replace("steps: Optional[int] = 1",
                                                            "stepz: Optional[int] = 3"))
    assert renamed.source != good.source != retyped.source
    check = after[0]
    cells = ([good] + after + [bad] + after + [renamed, check, retyped, check])
    nb = nbformat.v4.new_notebook(metadata=shipped.metadata, cells=[
        nbformat.from_dict(dict(c, outputs=[], execution_count=None, id=f"cell{i}"))
        for i, c in enumerate(cells)])
    NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=300,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    n = len(after) + 1
    first_run, second_run, edits = nb.cells[:n], nb.cells[n:2 * n], nb.cells[2 * n:]

    # the first run on the defaults (the meta_memory demo) showed its diagnosis
    assert not [c for c in first_run if errors(c)], [shown(c) for c in first_run if errors(c)]
    assert "mem_tokens" in "".join(shown(c) for c in first_run)

    # the bad target: the run cell's one line, then every later cell says there is no result
    run_cell = second_run[2]
    assert "notebook.run(settings)" in run_cell.source
    (error,) = errors(run_cell)
    assert "no module named 'no.such'" in shown(run_cell)
    for cell in second_run[3:]:
        text = shown(cell)
        assert "mem_tokens" not in text and "image/png" not in str(cell.get("outputs")), \
            cell.source
        assert not [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        if errors(cell):
            assert NO_RESULT in text and len(text.strip().splitlines()) == 1, text
    # each cell that reads the result checks it: each refused in one line
    readers = [c for c in second_run[3:] if re.search(r"\b(diag|printed)\b", c.source)]
    assert len(readers) >= 12
    assert [c.source for c in readers if NO_RESULT not in shown(c)] == []

    # a renamed parameter, untyped or typed, is refused by the next cell, naming the known ones
    for cell in (edits[1], edits[3]):
        text = shown(cell)
        assert "unknown notebook parameter(s) 'stepz'" in text and "steps" in text, text
        assert len(text.strip().splitlines()) == 1, text
