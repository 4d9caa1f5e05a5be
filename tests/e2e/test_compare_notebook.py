"""The compare notebook under papermill (its parameters checked, hostile names escaped) and
`diagkit compare` on the command line (the report it renders runs the same notebook)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import papermill
import pytest
import torch
from papermill.exceptions import PapermillExecutionError

from checkpoint_pairs import MEM, REPO, STEP2, STEP5
from cli_inprocess import run_cli
from diagkit import DiagkitError
from diagkit.run.workbook import compare

NOTEBOOK = REPO / "notebooks" / "compare_checkpoints.ipynb"


# ------------------------------------------------------------------ the notebook
def _execute(tmp_path, cwd, **parameters):
    out = tmp_path / "executed.ipynb"
    return papermill.execute_notebook(str(NOTEBOOK), str(out), parameters=parameters,
                                      kernel_name="python3", progress_bar=False, cwd=str(cwd))


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _html(nb) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in _outputs(nb))


@pytest.mark.parametrize("cwd", ["repo", "elsewhere"])
def test_notebook_runs_with_default_parameters(tmp_path, cwd):
    nb = _execute(tmp_path, REPO if cwd == "repo" else tmp_path,
                  out_dir=str(tmp_path / "out"))
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    page = _html(nb)
    assert "module.metamodel" in page and "mem_tokens" in page and "unchanged" in page
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert json.loads((tmp_path / "out" / "findings.json").read_text())["worst"] == "warning"
    assert (tmp_path / "out" / "comparison.csv").is_file()


def test_notebook_escapes_hostile_tensor_names(tmp_path):
    hostile = "<script>x</script>.weight"
    a = {hostile: torch.ones(3), "head.weight": torch.ones(2)}
    b = {hostile: torch.ones(3), "head.weight": torch.full((2,), 2.0), "<b>new</b>": torch.ones(1)}
    torch.save(a, tmp_path / "a.pt")
    torch.save({"model": b}, tmp_path / "b.pt")
    nb = _execute(tmp_path, tmp_path, checkpoint_a="a.pt", checkpoint_b="b.pt")
    assert not [o for o in _outputs(nb) if o.output_type == "error"]
    page = re.sub(r"<wbr/?>", "", _html(nb))  # a name's break opportunities after its dots
    assert "<script>x</script>" not in page and "<b>new</b>" not in page
    assert page.count("&lt;script&gt;x&lt;/script&gt;.weight") >= 2  # findings and table
    assert "&lt;b&gt;new&lt;/b&gt;" in page


# In the kernel: a name the notebook does not know, and a path looked up from its folder (a
# wrong type is refused by the same check: test_check_parameters_..., and test_workbook.py).
@pytest.mark.parametrize("parameters, words", [
    ({"steps": 2}, ["unknown", "'steps'", "checkpoint_a"]),
    ({"checkpoint_a": "nope.pt"}, ["checkpoint_a nope.pt not found (looked in", "nope.pt"]),
])
def test_notebook_rejects_bad_parameters(tmp_path, parameters, words):
    with pytest.raises(PapermillExecutionError) as info:
        _execute(tmp_path, tmp_path, **parameters)
    assert "DiagkitError" in info.value.ename
    for word in words:
        assert word in info.value.evalue


def test_check_parameters_resolves_repo_paths_and_checks_types(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = compare.check_parameters({})
    assert settings["checkpoint_a"] == str(STEP2) and settings["out_dir"] == ""
    (tmp_path / "data").mkdir()
    shutil.copy(STEP5, tmp_path / "data" / "meta_memory_step2.pt")
    local = compare.check_parameters({})["checkpoint_a"]
    assert local == str(tmp_path / "data" / "meta_memory_step2.pt")  # the working folder first
    with pytest.raises(DiagkitError, match="'out_dir' must be str or None"):
        compare.check_parameters({"out_dir": 3})
    with pytest.raises(DiagkitError, match="'trust_checkpoint' must be bool, got int"):
        compare.check_parameters({"trust_checkpoint": 1})
    with pytest.raises(DiagkitError, match="'checkpoint_a' must be str, got NoneType"):
        compare.check_parameters({"checkpoint_a": None})


def test_validate_fills_defaults():
    settings = compare.validate({"checkpoint_b": "b.pt"})
    assert settings == {"checkpoint_a": "data/meta_memory_step2.pt", "checkpoint_b": "b.pt",
                        "trust_checkpoint": False, "out_dir": ""}


DIAGKIT = str(Path(sys.executable).parent / "diagkit")


def _cli(*args, cwd=None):
    """`diagkit compare ARGS` in this process (tests/cli_inprocess.py)."""
    return run_cli("compare", *args, cwd=cwd, timeout=300)


def _console_script(*args, cwd=None):
    """`diagkit compare ARGS`: the installed console script, in a process of its own."""
    return subprocess.run([DIAGKIT, "compare", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_cli_on_the_demo_pair(tmp_path):
    run = _cli(STEP2, STEP5, "--fail-on", "warning", "--json", tmp_path / "c.json",
               "--out", tmp_path / "rep")
    assert run.returncode == 1, run.stderr  # an unchanged subtree is a warning
    assert MEM in run.stdout and "unchanged" in run.stdout
    payload = json.loads((tmp_path / "c.json").read_text())
    row = next(t for t in payload["tensors"] if t["name"] == MEM)
    assert row["identical"] is True and payload["worst"] == "warning"
    # --out: the report runner renders the compare notebook
    page = (tmp_path / "rep" / "report.html").read_text()
    assert MEM in page and "<script" not in page
    assert {"comparison.csv", "findings.json", "report.html"} <= {
        p.name for p in (tmp_path / "rep").iterdir()}
    assert json.loads((tmp_path / "rep" / "findings.json").read_text())["worst"] == "warning"
    # the real console script, in a subprocess (the module's other CLI runs are in-process)
    run = _console_script(STEP2, STEP5)
    assert run.returncode == 0, run.stderr  # default --fail-on error
    assert MEM in run.stdout and "12 unchanged" in run.stdout


@pytest.mark.parametrize("case, words", [
    ("missing", ["no such checkpoint file"]),
    ("garbage", ["not a readable"]),
    ("unrelated", ["no tensor name in common"]),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, case, words):
    other = tmp_path / f"{case}.pt"
    if case == "garbage":
        other.write_bytes(b"not a checkpoint\n" * 50)
    elif case == "unrelated":
        torch.save({"something.else": torch.ones(2)}, other)
    run = _cli(STEP2, other, "--json", tmp_path / "c.json")
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagkit: error:"), run.stderr
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "c.json").exists()
