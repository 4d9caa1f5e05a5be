"""`pip install diagkit` without extras (README, "Install"; issue: an install that fits a training
image): the wheel built from this tree, installed into a fresh venv that holds the core only,
offline. There it watches a model, saves, `diagkit check --json` works, and `diagkit report`
says in one line to install the workbook extra (exit 2).

Nothing is downloaded: the fresh venv sees the core's packages (torch and its own, numpy,
pandas, pyarrow, safetensors and theirs) through a folder of links to this venv's copies, put
on its path by a .pth file; pip installs the wheel with `--no-index`, so each of the wheel's
requirements must already be met by that folder (a requirement outside the core would fail
the install). The notebook side is not importable there: the test checks that it is absent.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from core_paths import WORKBOOK
from requirements_closure import closure, project

REPO = Path(__file__).resolve().parents[2]
HELPERS = REPO / "tests" / "helpers"


def build_wheel(out: Path) -> Path:
    """The wheel of a clean copy of this tree (no build/ left over from an earlier build)."""
    tree = out / "tree"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "out", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out / "dist"), str(tree)],
                   check=True, capture_output=True)
    return next((out / "dist").glob("diagkit-*.whl"))


def link_core(folder: Path) -> list[str]:
    """Links in `folder` to this venv's copy of each core distribution (its packages, modules
    and .dist-info, from its RECORD); the distributions linked."""
    folder.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    names = sorted(closure(project()["dependencies"]))
    for name in names:
        dist = metadata.distribution(name)
        tops = {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            if (site / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(site / top)
    return names


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A venv with the core wheel and the core's packages only; its bin/ folder."""
    out = tmp_path_factory.mktemp("core_wheel")
    wheel = build_wheel(out)
    venv = out / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    linked = link_core(out / "core")
    assert {"torch", "numpy", "pandas", "pyarrow", "safetensors"} <= set(linked)
    Path(site, "diagkit_core.pth").write_text(str(out / "core") + "\n")
    # This venv's pip, run for the fresh one (`--python`); offline, the requirements met there.
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "-q", "--no-index", str(wheel)], capture_output=True, text=True,
                          env=_offline())
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


def _offline() -> dict:
    """The environment of a process in the fresh venv: nothing of this tree on its path, no
    index to reach."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}


def run(fresh: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(fresh / args[0]), *args[1:]], cwd=cwd, env=_offline(),
                          capture_output=True, text=True, timeout=300)


def test_the_notebook_side_is_not_there(fresh, tmp_path):
    """What makes the other tests real: not one workbook package is importable."""
    code = ("import importlib.util as u, json; "
            f"print(json.dumps([m for m in {WORKBOOK!r} if u.find_spec(m)]))")
    done = run(fresh, "python", "-c", code, cwd=tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr[-2000:]


def test_the_core_watches_saves_loads_and_checks(fresh, tmp_path):
    done = run(fresh, "python", str(HELPERS / "core_paths.py"), str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["diagkit"].startswith(str(fresh.parent))  # the wheel, not this tree
    for path in ("steps", "whole", "diagnose"):
        assert got[path] == {"value": ["grad_not_cleared", "orphan"]}, got[path]
    assert "orphan" in got["printed"]["value"], got["printed"]
    assert got["check"] == {"value": {"code": 1, "findings": ["grad_not_cleared", "orphan"]}}
    assert (tmp_path / "saved" / "run.json").is_file()


def test_the_console_script_checks_and_report_names_the_extra(fresh, tmp_path):
    check = run(fresh, "diagkit", "check", "diagkit.demos:meta_memory", "--steps", "2",
                "--json", "check.json", cwd=tmp_path)
    assert check.returncode == 1, check.stderr[-2000:]  # 1: the orphan is an error
    found = json.loads((tmp_path / "check.json").read_text())["findings"]
    assert any(f["code"] == "orphan" for f in found)
    report = run(fresh, "diagkit", "report", "diagkit.demos:meta_memory", "--out", "rep",
                 cwd=tmp_path)
    assert report.returncode == 2 and report.stdout == ""
    (line,) = report.stderr.strip().splitlines()
    assert line == ("diagkit: error: diagkit report needs papermill, nbconvert, nbformat, "
                    "ipykernel and matplotlib: pip install 'diagkit[workbook]'")
    assert not (tmp_path / "rep").exists()
