"""An installed wheel does what a clone does: it carries the notebooks and the demo data, and
`diagkit report` runs from it, far from the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from this tree, unpacked into a folder of its own (no dependencies:
    they are this venv's)."""
    out = tmp_path_factory.mktemp("wheel")
    tree = out / "tree"  # a clean copy: no build/ left over from an earlier build
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "out", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out / "dist"), str(tree)],
                   check=True, capture_output=True)
    wheel = next((out / "dist").glob("diagkit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("notebooks/diagnose.ipynb", "notebooks/compare_checkpoints.ipynb",
                    "data/finetune_heads_pretrain.pt", "data/meta_memory_step2.pt"):
        assert f"diagkit/_shipped/{shipped}" in names, shipped
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(out / "site"), str(wheel)], check=True, capture_output=True)
    return out / "site"


# What the tests ask of the installed wheel, in one process started far from the repository with
# the wheel on PYTHONPATH (one interpreter and its imports instead of one a step): each step's
# value, or its traceback, into results.json, so a step that fails fails its own test. The
# commands are the console script's `main`, as `python -m diagkit.run.cli.commands ...` runs it.
FAR = """
import contextlib, io, json, sys, traceback
results = {}


def step(name, fn):
    try:
        results[name] = {"value": fn()}
    except BaseException:  # SystemExit included
        results[name] = {"error": traceback.format_exc()}
    sys.stdout.flush()
    sys.stderr.flush()


def imported():
    import diagkit
    return diagkit.__file__


def compare_default():  # here no data/ is in the working folder: the wheel's copy is found
    from diagkit.run.workbook import compare
    return compare.check_parameters({})["checkpoint_a"]


def cli(*args, capture=False):
    from diagkit.run.cli.commands import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out) if capture else contextlib.nullcontext():
        code = main(list(args))
    return {"code": code, "stdout": out.getvalue()}


def copied_notebooks_run():
    import papermill
    papermill.execute_notebook("mine/diagnose.ipynb", "d.ipynb", cwd="mine",
                               kernel_name="python3", progress_bar=False,
                               parameters=dict(steps=1, interactive=False,
                                               target="diagkit.demos:finetune_heads",
                                               checkpoint="data/finetune_heads_pretrain.pt",
                                               out_dir="d"))
    papermill.execute_notebook("mine/compare_checkpoints.ipynb", "c.ipynb", cwd="mine",
                               kernel_name="python3", progress_bar=False,
                               parameters=dict(out_dir="c"))


step("imported", imported)
step("compare_default", compare_default)
step("notebooks", lambda: cli("notebooks", "mine", capture=True))
step("copied_notebooks_run", copied_notebooks_run)
step("demo", lambda: cli("demo", "--steps", "1", "--out", "demo"))
with open("results.json", "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def far(installed, tmp_path_factory) -> tuple[Path, dict, subprocess.CompletedProcess]:
    """FAR run once, in a folder of its own: (that folder, each step's result, the process)."""
    folder = tmp_path_factory.mktemp("far")
    env = {**os.environ, "PYTHONPATH": str(installed)}
    env.pop("DIAGKIT_NOTEBOOKS", None)
    proc = subprocess.run([sys.executable, "-c", FAR], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and (folder / "results.json").is_file(), proc.stderr[-3000:]
    return folder, json.loads((folder / "results.json").read_text()), proc


def _value(far, name: str):
    _, results, proc = far
    assert "error" not in results[name], results[name]["error"] + proc.stderr[-2000:]
    return results[name]["value"]


def test_the_wheel_is_the_one_imported(installed, far):
    assert _value(far, "imported") == str(installed / "diagkit" / "__init__.py")


def test_the_compare_notebook_finds_its_shipped_defaults(installed, far):
    assert _value(far, "compare_default") == str(installed / "diagkit" / "_shipped" / "data" /
                                                 "meta_memory_step2.pt")


def test_notebooks_copied_out_of_the_wheel_run_and_demo_works(far):
    """`diagkit notebooks DIR`, then both notebooks run from DIR (the checkpoint spelling of
    docs/workbook.md, found among the wheel's demo files), and `diagkit demo` (the report
    runner, its three runs of the workbook), all far from the repo."""
    folder = far[0]
    copied = _value(far, "notebooks")
    assert copied["code"] == 0
    assert copied["stdout"].split() == [str(folder / "mine" / n) for n in
                                        ("compare_checkpoints.ipynb", "diagnose.ipynb")]
    _value(far, "copied_notebooks_run")
    # papermill's cwd moved it into mine/: relative paths are from there (docs/workbook.md, "Paths")
    assert json.loads((folder / "mine" / "d" / "findings.json").read_text())["worst"] == \
        "warning"
    assert (folder / "mine" / "c" / "comparison.csv").is_file()
    demo = _value(far, "demo")
    assert demo["code"] in (0, 1), far[2].stderr[-2000:]  # 1: the demos' findings
    assert (folder / "demo" / "report.html").stat().st_size > 10_000
    # `diagkit report` from the wheel: the dead heads, from the shipped checkpoint
    findings = json.loads((folder / "demo" / "finetune_heads" / "findings.json").read_text())
    assert findings["worst"] == "warning"
