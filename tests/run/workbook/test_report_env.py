"""Rendering a report leaves this process's environment as it was: the launch folder it tells
its kernel (`diagkit.run.target.paths.LAUNCH_ENV`) is for that kernel only.

The kernels are real (papermill), but run a notebook of two cells: what is checked is
`write_report`'s handling of this process's environment around a kernel, whatever the notebook
does (the diagnosis notebook's own kernels are in test_report.py)."""

from __future__ import annotations

import os

import nbformat

from diagkit.run.target.paths import LAUNCH_ENV
from diagkit.run.workbook.report import write_report

# Writes the launch folder its kernel was told into out_dir, then fails when asked to (a failing
# cell: the path of a diagnosis whose target cannot be imported).
CELLS = [("out_dir = ''\nfail = False", ["parameters"]),
         (f"import os, pathlib\n"
          f"pathlib.Path(out_dir, 'launch.txt').write_text(os.environ.get({LAUNCH_ENV!r}, '-'))\n"
          f"if fail:\n    raise ValueError('the cell failed')", [])]


def test_the_kernels_launch_folder_does_not_leak(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}},
        cells=[nbformat.v4.new_code_cell(src, metadata={"tags": tags}) for src, tags in CELLS])
    notebook = tmp_path / "two_cells.ipynb"
    nbformat.write(nb, notebook)
    launch = tmp_path / "launch"
    launch.mkdir()
    monkeypatch.chdir(launch)

    def report(out, fail):
        return write_report(tmp_path / out, {"env": {"fail": fail}}, title="x",
                            notebook=str(notebook), check=dict)

    monkeypatch.delenv(LAUNCH_ENV, raising=False)
    result = report("rep", fail=False)
    assert result.error is None
    assert (tmp_path / "rep" / "launch.txt").read_text() == str(launch)  # the kernel's own
    assert LAUNCH_ENV not in os.environ
    monkeypatch.setenv(LAUNCH_ENV, "/somewhere")
    result = report("rep2", fail=True)
    assert "the cell failed" in result.error
    assert (tmp_path / "rep2" / "launch.txt").read_text() == str(launch)
    assert os.environ[LAUNCH_ENV] == "/somewhere"
