"""The README's "Diagnose your real training run" section: every Python snippet in it runs as
written, on a small model with a planted orphan, and finds it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import diagkit

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Diagnose your real training run"


def section_blocks(lang: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", body, flags=re.S)


def plain_names() -> dict:
    """What the plain-loop snippet expects to exist: a model whose head no optimizer holds."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    loader = [torch.randn(6, 4) for _ in range(25)]
    return {"model": model, "optimizer": optimizer, "loader": loader,
            "loss_fn": lambda m, batch: m(batch).pow(2).mean()}


def test_the_section_exists_before_targets():
    text = (ROOT / "README.md").read_text()
    assert text.index(SECTION) < text.index("## Telling diagkit what to run: targets")
    assert section_blocks("python"), "no Python snippet in the section"


def test_the_plain_loop_snippet_runs_and_finds_the_orphan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    snippet = next(b for b in section_blocks("python") if "diagkit.watch(" in b)
    names = plain_names()
    exec(compile(snippet, "README.md", "exec"), names)
    diag = names["watch"].diagnosis
    assert diag.verdicts()["2.weight"] == {"orphan", "grad_not_cleared"}
    assert diag.verdicts()["0.weight"] == {"ok"}
    assert diagkit.load(tmp_path / "diag").verdicts() == diag.verdicts()
    assert "worst=error" in capsys.readouterr().out


@pytest.mark.parametrize("command", [c for b in section_blocks("bash")
                                     for c in b.splitlines() if c.startswith("torchrun")])
def test_the_torchrun_commands_name_an_example_that_exists(command):
    script = next(part for part in command.split() if part.endswith(".py"))
    assert (ROOT / script).is_file()  # tests/e2e/test_watch_jobs.py runs it under torchrun


def test_the_whole_run_snippet_logs_the_orphan_at_the_step_and_saves_it(tmp_path, monkeypatch,
                                                                        caplog):
    from diagkit.run import watch_ends
    monkeypatch.chdir(tmp_path)
    snippet = next(b for b in section_blocks("python") if "steps=None" in b)
    torch.manual_seed(0)
    model = nn.Sequential()
    model.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU()).requires_grad_(False)
    model.head = nn.Linear(8, 2)
    names = {"diagkit": diagkit, "model": model,
             "optimizer": torch.optim.SGD(model.head.parameters(), lr=0.1),
             "loader": [torch.randn(6, 4) for _ in range(250)],
             "loss_fn": lambda m, batch: m(batch).pow(2).mean()}
    try:
        with caplog.at_level(logging.INFO, logger="diagkit"):
            exec(compile(snippet, "README.md", "exec"), names)
    finally:
        watch_ends._end_live("stop")  # the snippet keeps no Watch: it would end at exit
    lines = [r.getMessage() for r in caplog.records if r.name == "diagkit"]
    assert lines[0].startswith("diagkit: step 500: wiring changed: backbone.0.weight")
    assert lines[1].startswith("diagkit: step 501: orphan (error) in backbone (2 tensors)")
    readme = (ROOT / "README.md").read_text()
    assert lines[0] in readme and lines[1].split(", ...")[0][:120] in readme
    (orphan,) = [f for f in diagkit.load(tmp_path / "diag").findings if f.code == "orphan"]
    assert (orphan.module, orphan.since) == ("backbone", 501)
