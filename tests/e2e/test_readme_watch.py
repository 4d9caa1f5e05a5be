"""The watch snippets run as written, on a small model with a planted orphan, and find it: the
README's "Diagnose your real training run", docs/watch.md, "Diagnose your real training run"
(the same two lines, on the page that stands alone), and docs/whole-run.md, "The whole run"."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import diagkit
import doc_blocks

ROOT = doc_blocks.ROOT
PLAIN_LOOP = {"README.md": "## Diagnose your real training run", "docs/watch.md": None}
WHOLE_RUN = ROOT / "docs/whole-run.md"


def plain_names() -> dict:
    """What the plain-loop snippet expects to exist: a model whose head no optimizer holds."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    loader = [torch.randn(6, 4) for _ in range(25)]
    return {"model": model, "optimizer": optimizer, "loader": loader,
            "loss_fn": lambda m, batch: m(batch).pow(2).mean()}


def test_the_readme_shows_the_watch_before_anything_else():
    """A newcomer meets the two lines right after `make demo` and `make test`."""
    text = (ROOT / "README.md").read_text()
    headings = [title for level, title, _ in doc_blocks.headings(text) if level == 2]
    assert headings[0] == "Diagnose your real training run"
    assert doc_blocks.snippet(ROOT / "README.md", "diagkit.watch(", PLAIN_LOOP["README.md"]) \
        == doc_blocks.snippet(ROOT / "docs/watch.md", "diagkit.watch(")


@pytest.mark.parametrize("page", PLAIN_LOOP)
def test_the_plain_loop_snippet_runs_and_finds_the_orphan(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    snippet = doc_blocks.snippet(ROOT / page, "# your loop, unchanged", PLAIN_LOOP[page])
    names = plain_names()
    exec(compile(snippet, page, "exec"), names)
    diag = names["watch"].diagnosis
    assert diag.verdicts()["2.weight"] == {"orphan", "grad_not_cleared"}
    assert diag.verdicts()["0.weight"] == {"ok"}
    assert diagkit.load(tmp_path / "diag").verdicts() == diag.verdicts()
    printed = capsys.readouterr().out  # print(watch.diagnosis): the findings and their fixes
    assert "1 error" in printed and "orphan" in printed
    assert 'optimizer.param_groups[0]["params"].extend(model[2].parameters())' in printed


@pytest.mark.parametrize("command", [c for page in doc_blocks.pages()
                                     for b in doc_blocks.blocks(page, "bash")
                                     for c in b.body.splitlines() if c.startswith("torchrun")])
def test_the_torchrun_commands_name_an_example_that_exists(command):
    script = next(part for part in command.split() if part.endswith(".py"))
    assert (ROOT / script).is_file()  # tests/e2e/test_watch_jobs.py runs it under torchrun


def test_the_whole_run_snippet_logs_the_orphan_at_the_step_and_saves_it(tmp_path, monkeypatch,
                                                                        caplog):
    from diagkit.run.watch import ends as watch_ends
    monkeypatch.chdir(tmp_path)
    snippet = doc_blocks.snippet(WHOLE_RUN, "steps=None")
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
            exec(compile(snippet, "docs/whole-run.md", "exec"), names)
    finally:
        watch_ends.end_live("stop")  # the snippet keeps no Watch: it would end at exit
    lines = [r.getMessage() for r in caplog.records if r.name == "diagkit"]
    assert lines[0].startswith("diagkit: step 500: wiring changed: backbone.0.weight")
    assert lines[1].startswith("diagkit: error: orphan in backbone (2 tensors) from step 501; "
                               "fix: ")
    page = WHOLE_RUN.read_text()  # the log lines it shows are the ones logged
    assert lines[0] in page and lines[1].split("; fix: ")[0] + "; fix: " in page
    (orphan,) = [f for f in diagkit.load(tmp_path / "diag").findings if f.code == "orphan"]
    assert (orphan.module, orphan.since) == ("backbone", 501)
