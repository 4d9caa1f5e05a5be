"""A file target imports the modules beside it (`import helpers` next to train.py), as under
`python train.py`, and leaves sys.path as it found it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diagkit import DiagkitError, load_target

DIAGKIT = str(Path(sys.executable).parent / "diagkit")

HELPERS = textwrap.dedent('''
    import torch
    from torch import nn

    def make_setup(steps):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        gen = torch.Generator().manual_seed(1)
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "batch_fn": lambda: torch.randn(3, 4, generator=gen),
                "loss_fn": lambda model, x: model(x).pow(2).mean(), "steps": steps}
''')

TRAIN = textwrap.dedent('''
    import helpers                      # the module beside this file, imported at the top

    def build(steps=2):
        return helpers.make_setup(steps)

    def build_lazily(steps=2):
        from sibling_late import make    # imported only when the target is built
        return make(steps)
''')


@pytest.fixture
def project(tmp_path, monkeypatch):
    """project/train.py and the modules beside it; the test runs from another folder."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "helpers.py").write_text(HELPERS)
    (folder / "sibling_late.py").write_text("from helpers import make_setup as make\n")
    (folder / "train.py").write_text(TRAIN)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for name in ("helpers", "sibling_late"):  # a fresh import in every test
        monkeypatch.delitem(sys.modules, name, raising=False)
    return folder


@pytest.mark.parametrize("function", ["build", "build_lazily"])
def test_a_file_target_imports_the_module_beside_it(project, function):
    before = list(sys.path)
    setup = load_target(f"{project / 'train.py'}:{function}", steps=3)
    assert setup.steps == 3
    assert sys.modules["helpers"].__file__ == str(project / "helpers.py")
    assert sys.path == before  # the folder is importable only while the target loads


def test_a_relative_file_target_imports_the_module_beside_it(project, monkeypatch):
    monkeypatch.chdir(project.parent)
    assert load_target("project/train.py:build").steps == 2


def test_the_folder_is_not_left_on_the_path_when_the_target_fails(project):
    (project / "broken.py").write_text("import helpers\nimport no_such_sibling\n")
    before = list(sys.path)
    with pytest.raises(DiagkitError, match="no_such_sibling"):
        load_target(f"{project / 'broken.py'}:build")
    assert sys.path == before


def test_cli_check_of_a_file_target_with_a_sibling_import(project):
    run = subprocess.run([DIAGKIT, "check", str(project / "train.py") + ":build"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
