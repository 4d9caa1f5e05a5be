"""A diagkit error in a notebook is the one line the CLI would print: in the executed notebook
(papermill, JupyterLab) and in the HTML report. Other exceptions keep their traceback."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import papermill
import pytest
from papermill.exceptions import PapermillExecutionError


DIAGNOSE = Path(__file__).resolve().parents[3] / "notebooks" / "diagnose.ipynb"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_outputs(nb) -> list:
    return [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]


def shown_lines(output) -> list[str]:
    """The lines a reader sees for an error output (IPython shows `traceback`, coloured)."""
    return [line for text in output.traceback for line in ANSI.sub("", text).splitlines()]


# An error raised while importing the target, and one while loading its checkpoint (a bad
# parameter is refused by the same check as in test_workbook.py's wrong types).
BAD = [
    (dict(target="no.such:thing"), "TargetError: no module named 'no.such'"),
    (dict(target="diagkit.demos:clean", checkpoint="missing/nothing.pt"), "nothing.pt"),
]


@pytest.mark.parametrize("params,words", BAD, ids=["target", "checkpoint"])
def test_a_bad_notebook_input_shows_one_line(tmp_path, params, words):
    out = tmp_path / "out.ipynb"
    with pytest.raises(PapermillExecutionError):
        papermill.execute_notebook(str(DIAGNOSE), str(out), parameters=dict(
            params, steps=1, interactive=False, out_dir=str(tmp_path / "data")),
            kernel_name="python3", progress_bar=False, cwd=str(tmp_path))
    [error] = error_outputs(nbformat.read(out, as_version=4))
    lines = shown_lines(error)
    assert len(lines) == 1, lines
    assert words in lines[0]


# The HTML report shows the same one line: tests/run/workbook/test_report.py, a failing cell.


def shell_shows(code: str) -> list[str]:
    """The non-blank lines IPython prints for a cell that raises."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    with capture_output() as cap:
        InteractiveShell.instance().run_cell(code)
    return [line for line in ANSI.sub("", cap.stdout).splitlines() if line.strip()]


def test_other_exceptions_keep_their_traceback():
    mine = shell_shows("from diagkit.core.errors import TargetError\n"
                       "def f():\n    raise TargetError('no module named x')\nf()")
    assert mine == ["TargetError: no module named x"]
    theirs = shell_shows("def f():\n    raise ValueError('deep')\nf()")
    assert len(theirs) > 3 and theirs[-1] == "ValueError: deep"
