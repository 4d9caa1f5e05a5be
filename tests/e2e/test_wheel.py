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


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("DIAGKIT_NOTEBOOKS", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_wheel_is_the_one_imported(installed, tmp_path):
    proc = _run(installed, tmp_path, "-c", "import diagkit; print(diagkit.__file__)")
    assert proc.stdout.strip() == str(installed / "diagkit" / "__init__.py")


def test_the_compare_notebook_finds_its_shipped_defaults(installed, tmp_path):
    proc = _run(installed, tmp_path, "-c",
                "from diagkit.run import compare; print(compare.check_parameters({})"
                "['checkpoint_a'])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(installed / "diagkit" / "_shipped" / "data" /
                                      "meta_memory_step2.pt")


def test_notebooks_copied_out_of_the_wheel_run_and_demo_works(installed, tmp_path):
    """`diagkit notebooks DIR`, then both notebooks run from DIR (the checkpoint spelling of
    docs/workbook.md, found among the wheel's demo files), and `diagkit demo` (the report
    runner, its three runs of the workbook), all far from the repo."""
    proc = _run(installed, tmp_path, "-m", "diagkit.run.cli", "notebooks", "mine")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tmp_path / "mine" / n) for n in
                                   ("compare_checkpoints.ipynb", "diagnose.ipynb")]
    code = ("import papermill, sys\n"
            "papermill.execute_notebook('mine/diagnose.ipynb', 'd.ipynb', cwd='mine',"
            " kernel_name='python3', progress_bar=False, parameters=dict(steps=1,"
            " interactive=False, target='diagkit.demos:finetune_heads',"
            " checkpoint='data/finetune_heads_pretrain.pt', out_dir='d'))\n"
            "papermill.execute_notebook('mine/compare_checkpoints.ipynb', 'c.ipynb', cwd='mine',"
            " kernel_name='python3', progress_bar=False, parameters=dict(out_dir='c'))\n")
    proc = _run(installed, tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # papermill's cwd moved it into mine/: relative paths are from there (docs/workbook.md, "Paths")
    assert json.loads((tmp_path / "mine" / "d" / "findings.json").read_text())["worst"] == \
        "warning"
    assert (tmp_path / "mine" / "c" / "comparison.csv").is_file()
    proc = _run(installed, tmp_path, "-m", "diagkit.run.cli", "demo", "--steps", "1",
                "--out", "demo")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: the demos' findings
    assert (tmp_path / "demo" / "report.html").stat().st_size > 10_000
    # `diagkit report` from the wheel: the dead heads, from the shipped checkpoint
    findings = json.loads((tmp_path / "demo" / "finetune_heads" / "findings.json").read_text())
    assert findings["worst"] == "warning"
