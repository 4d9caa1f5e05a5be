"""`diagkit notebooks DIR` copies the shipped notebooks out, never over a user's file."""

from __future__ import annotations

import platform

import nbformat
import pytest

from diagkit.core.errors import DiagkitError
from diagkit.core.shipped import shipped
from diagkit.run.workbook.shipped_notebooks import copy_notebooks


def test_copies_every_shipped_notebook(tmp_path):
    got = copy_notebooks(tmp_path / "mine")
    assert sorted(p.name for p in got) == sorted(
        p.name for p in shipped("notebooks").glob("*.ipynb")) == [
        "compare_checkpoints.ipynb", "diagnose.ipynb"]
    for p in got:  # the same cells; the language_info JupyterLab would otherwise write in
        copy, orig = (nbformat.read(f, as_version=4) for f in (p, shipped("notebooks") / p.name))
        assert copy.cells == orig.cells
        info = copy.metadata.language_info  # what a real JupyterLab keeps: test_jupyterlab.py
        assert info["name"] == "python" and info["version"] == platform.python_version()
        assert info["mimetype"] == "text/x-python"
        assert copy.metadata.kernelspec == orig.metadata.kernelspec


def test_never_overwrites_without_force(tmp_path):
    (tmp_path / "diagnose.ipynb").write_text("my edits")
    with pytest.raises(DiagkitError, match="already exist.*--force"):
        copy_notebooks(tmp_path)
    assert (tmp_path / "diagnose.ipynb").read_text() == "my edits"
    assert not (tmp_path / "compare_checkpoints.ipynb").exists()  # nothing half-copied
    copy_notebooks(tmp_path, force=True)
    assert (tmp_path / "diagnose.ipynb").read_text() != "my edits"


def test_a_file_in_the_way_is_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(DiagkitError, match="not a folder"):
        copy_notebooks(tmp_path / "f")
    with pytest.raises(DiagkitError, match="cannot copy"):
        copy_notebooks(tmp_path / "f" / "sub")


def test_a_copy_made_before_the_rooms_still_imports_what_it_calls():
    """The notebooks copied out before run/ had rooms import `diagkit.run.notebook`, `compare`
    and `contract` by their old names; the user's copy keeps running (run/__init__.py)."""
    import diagkit.run.workbook.compare as compare_module
    import diagkit.run.workbook.notebook as notebook_module
    names = {}
    exec("from diagkit.run import compare, notebook\nfrom diagkit.run import contract", names)
    assert names["notebook"] is notebook_module and names["compare"] is compare_module
    assert names["contract"].__name__ == "diagkit.run.workbook.contract"
    with pytest.raises(ImportError):
        exec("from diagkit.run import watch_ends", {})  # only what the notebooks used
