"""A watch ended by SIGHUP (a terminal closed) saves as one ended by SIGTERM does: no report
rendered while the process is being ended, and a save that fails is one line, not a KeyError
(docs/watch.md)."""

from __future__ import annotations

import torch

import diagkit
from diagkit.run.watch.save import save


def small_diagnosis():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    return w.diagnosis


def test_sighup_saves_and_renders_no_report(tmp_path, capfd):
    out = tmp_path / "diag"
    save(small_diagnosis(), out, report=True, ended="SIGHUP")
    err = capfd.readouterr().err
    assert (out / "run.json").is_file() and not (out / "report").exists()
    assert f"diagkit: SIGHUP: the diagnosis is saved to {out.resolve()}" in err


def test_a_failed_save_on_sighup_is_one_line(tmp_path, capfd):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    save(small_diagnosis(), blocker / "diag", report=True, ended="SIGHUP")
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("diagkit: could not save the diagnosis")
    assert lines[0].endswith("(the process is being terminated: the result is lost)")
