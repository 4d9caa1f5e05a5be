"""`nothing_trains` on real runs (issue 35, item 5): a model whose every tensor is frozen, with
optimizer groups that are all empty or hold one stray tensor, is one run-level error finding,
never 0 findings and never an engine refusal. It comes out of `watch`, `diagnose`, the `--meta`
dry run and `diagkit check --fail-on error`, survives a save and load, and renders."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

import diagkit
from diagkit.core.errors import DiagkitError
from diagkit.present.text import render_findings


def frozen_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def watched(model, opt, steps=3, *, backward=True):
    """The user's loop: a loss that needs no gradient is not backpropagated (as a careful
    loop does: `backward()` would raise)."""
    w = diagkit.watch(model, opt, steps=steps)
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        if backward and loss.requires_grad:
            loss.backward()
        opt.step()
    assert w.done
    return w.diagnosis


def the_finding(diag):
    found = [f for f in diag.findings if f.code == "nothing_trains"]
    assert len(found) == 1, [f.code for f in diag.findings]
    return found[0]


def test_a_stray_tensor_beside_a_frozen_model_is_nothing_trains_not_an_engine():
    model = frozen_model()
    stray = torch.zeros(1, requires_grad=True)
    diag = watched(model, torch.optim.AdamW([stray], lr=1e-3))  # was: DiagkitError, flat buffers
    f = the_finding(diag)
    assert f.severity == "error" and diag.worst() == "error" and diag.fails("error")
    assert f.module == "" and f.count == 5 and len(f.params) == 5  # the run: every tensor
    assert "Nothing in this run can train" in f.message and "is_trainable=True" in f.fix
    assert "loss reaches none of them" in f.message
    assert diag.findings[0].code == "nothing_trains"  # the worst first
    # a run-level verdict is no tensor's: the tensors keep their own
    assert diag.verdicts()["0.weight"] == {"ok"}


def test_a_frozen_model_with_empty_groups_is_nothing_trains():
    model = frozen_model()
    diag = watched(model, torch.optim.AdamW([{"params": []}, {"params": []}], lr=1e-3))
    f = the_finding(diag)
    assert "none of its 4 tensors" in f.message and "requires grad" in f.message
    assert [s["group"] for s in f.source] == [0, 1]  # where the empty groups were built


def test_a_trainable_model_with_empty_groups_is_nothing_trains_beside_the_orphans():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    diag = watched(model, torch.optim.AdamW([{"params": []}], lr=1e-3))
    f = the_finding(diag)
    assert "no optimizer holds any of them" in f.message and "groups are empty" in f.message
    assert {g.code for g in diag.findings} >= {"nothing_trains", "orphan"}


def test_a_run_that_trains_has_no_such_finding():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    for p in model[0].parameters():  # a partial freeze is not nothing
        p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                            weight_decay=0.0)
    assert watched(model, opt).findings == []


def test_hand_written_updates_of_a_frozen_model_train_nothing_either():
    """Without any optimizer, membership means nothing: what is judged is that no tensor
    requires grad."""
    model = frozen_model()
    w = diagkit.watch(model, steps=2)
    for _ in range(2):
        model(torch.randn(8, 16)).sum()
        w.step()
    assert the_finding(w.diagnosis).severity == "error"


def test_no_tensor_at_all_stays_a_refusal():
    with pytest.raises(DiagkitError, match="nothing to watch"):
        diagkit.watch(nn.ReLU(), torch.optim.AdamW([{"params": []}], lr=1e-3), steps=1)


def test_diagnose_of_a_frozen_model():
    """diagkit's own loop backpropagates the loss, which raises here: the failed step, and
    the cause, from the wiring alone."""
    model = frozen_model()
    diag = diagkit.diagnose(model, torch.optim.AdamW([{"params": []}], lr=1e-3),
                            batch_fn=lambda: torch.randn(8, 16),
                            loss_fn=lambda m, b: m(b).pow(2).mean(), steps=2)
    assert {f.code for f in diag.findings} == {"nothing_trains", "step_failed"}


def test_saved_loaded_and_rendered(tmp_path):
    diag = watched(frozen_model(), torch.optim.AdamW([{"params": []}], lr=1e-3))
    back = diagkit.load(diag.save(tmp_path / "saved"))
    assert back.findings == diag.findings and back.fails("error")
    text = render_findings(back)
    assert "nothing_trains" in text and "(whole model)" not in text.splitlines()[0]
    html = back._repr_html_()
    assert "nothing_trains" in html and "is_trainable=True" in html


TARGET = textwrap.dedent('''
    import torch

    def frozen():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
        for p in model.parameters():
            p.requires_grad_(False)
        return {"model": model, "optimizer": torch.optim.AdamW([{"params": []}], lr=1e-3),
                "batch_fn": lambda: torch.randn(8, 16),
                "loss_fn": lambda m, b: m(b).pow(2).mean()}
''')


@pytest.mark.parametrize("meta", [False, True], ids=["run", "meta"])
def test_check_fails_on_error(tmp_path, capsys, meta):
    from diagkit.run.cli.commands import main
    (tmp_path / "target.py").write_text(TARGET)
    argv = ["check", f"{tmp_path / 'target.py'}:frozen", "--steps", "2", "--fail-on", "error"]
    assert main(argv + (["--meta"] if meta else [])) == 1
    out = capsys.readouterr().out
    assert "nothing_trains" in out and "Nothing in this run can train" in " ".join(out.split())
