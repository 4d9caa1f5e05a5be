"""One meaning for a relative path (`diagkit.run.target.paths`): the launch folder, then the working
folder (a kernel's: its notebook's folder), then the demo files diagkit ships."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from diagkit.core.errors import DiagkitError
from diagkit.core.shipped import shipped
from diagkit.run.workbook import compare, notebook
from diagkit.run.target.paths import find_input, output_folder

ROOT = Path(__file__).resolve().parents[3]
PRETRAIN = "data/finetune_heads_pretrain.pt"


@pytest.fixture
def launched(tmp_path, monkeypatch):
    """A user who launched from `tmp_path/launch`; the kernel runs in `tmp_path/notebooks`
    (here: this process stands for the kernel, `diagkit report` having said where it was)."""
    launch, kernel = tmp_path / "launch", tmp_path / "notebooks"
    (launch / "data").mkdir(parents=True)
    kernel.mkdir()
    monkeypatch.setenv("DIAGKIT_LAUNCH_DIR", str(launch))
    monkeypatch.chdir(kernel)
    return launch, kernel


def test_outside_a_kernel_the_launch_folder_is_the_working_folder(tmp_path, monkeypatch):
    """A stale $PWD (a process started with another working folder) is not believed."""
    monkeypatch.delenv("DIAGKIT_LAUNCH_DIR", raising=False)
    monkeypatch.setenv("PWD", str(ROOT))
    monkeypatch.chdir(tmp_path)
    assert find_input(PRETRAIN, "checkpoint") == str(shipped("data") / Path(PRETRAIN).name) \
        or shipped("data") == ROOT / "data"
    (tmp_path / "data").mkdir()
    (tmp_path / PRETRAIN).write_bytes(b"")
    assert find_input(PRETRAIN, "checkpoint") == str(tmp_path / PRETRAIN)


def test_the_launch_folder_comes_first(launched):
    launch, kernel = launched
    for folder in (launch, kernel):
        (folder / "x.pt").write_bytes(b"")
    assert find_input("x.pt", "checkpoint") == str(launch / "x.pt")
    (launch / "x.pt").unlink()
    assert find_input("x.pt", "checkpoint") == str(kernel / "x.pt")  # the notebook's folder
    assert output_folder("out") == str(launch / "out")


def test_data_names_fall_back_to_the_shipped_demo_files(launched):
    launch, _ = launched
    assert find_input(PRETRAIN, "checkpoint") == str(shipped("data") / Path(PRETRAIN).name)
    shutil.copy(shipped("data") / "meta_memory_step5.pt", launch / PRETRAIN)
    assert find_input(PRETRAIN, "checkpoint") == str(launch / PRETRAIN)  # the user's own wins


def test_a_missing_input_is_one_line_naming_where_it_looked(launched):
    launch, kernel = launched
    with pytest.raises(DiagkitError) as info:
        find_input("nope/x.pt", "checkpoint")
    message = str(info.value)
    assert "\n" not in message and "checkpoint nope/x.pt not found" in message
    assert str(launch / "nope") in message and str(kernel / "nope") in message


def test_both_notebooks_read_the_documented_spelling_from_the_launch_folder(launched):
    launch, _ = launched
    shutil.copy(shipped("data") / "meta_memory_step5.pt", launch / "data" / "meta_memory_step2.pt")
    settings = compare.check_parameters({"checkpoint_a": "data/meta_memory_step2.pt",
                                         "checkpoint_b": "data/meta_memory_step5.pt"})
    assert settings["checkpoint_a"] == str(launch / "data" / "meta_memory_step2.pt")
    assert settings["checkpoint_b"] == str(shipped("data") / "meta_memory_step5.pt")
    settings = notebook.check_parameters({"target": "diagkit.demos:finetune_heads",
                                          "checkpoint": PRETRAIN})
    assert settings["checkpoint"] == str(shipped("data") / Path(PRETRAIN).name)


def test_a_kernel_in_the_notebooks_folder_runs_the_documented_checkpoint(launched, monkeypatch):
    """As JupyterLab runs it: the kernel started in notebooks/ by a process that stays in the
    launch folder and tells nothing through the environment; the spelling of docs/workbook.md."""
    import nbclient
    launch, kernel = launched
    monkeypatch.delenv("DIAGKIT_LAUNCH_DIR")
    monkeypatch.setenv("PWD", "/")  # not believed where /proc can say
    monkeypatch.chdir(launch)
    shutil.copy(shipped("data") / Path(PRETRAIN).name, launch / PRETRAIN)
    nb = nbformat.read(ROOT / "notebooks" / "diagnose.ipynb", as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(  # the values a user typed in
        f"target = 'diagkit.demos:finetune_heads'\ncheckpoint = {PRETRAIN!r}\nsteps = 1\n"
        "interactive = False\nout_dir = 'report-data'"))
    nbclient.NotebookClient(nb, kernel_name="python3",  # as jupyter-server: no chdir of its own
                            resources={"metadata": {"path": str(kernel)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    shown = " ".join(str(o.get("data", {}).get("text/html", ""))
                     for c in nb.cells for o in c.get("outputs", []))
    assert str(launch / PRETRAIN) in shown
    assert (launch / "report-data" / "findings.json").is_file()  # out_dir: from the launch folder
