"""An end asked while a whole-run watch is inside its own work (issue 36, R19): `stop()` from
the user's `on_finding` callback, or SIGTERM arriving while a window is judged, waits until that
work is done, then ends and saves the watch once, with no false failure line. Ending inside it
judged and released the run under the window it was closing: "diagkit: could not save the
diagnosis so far ... AttributeError" although the save had worked (docs/whole-run.md, "The
whole run"; docs/watch.md, "Diagnose your real training run")."""

from __future__ import annotations

import signal

import torch
import torch.nn as nn

import diagkit
from diagkit.run.watch.whole_run import BURST


def orphan_head():
    """A model whose head no optimizer holds: `orphan` at the first window's judging."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    return model, torch.optim.SGD(model[0].parameters(), lr=0.1)


def train(model, opt, steps: int) -> None:
    x = torch.ones(2, 4)
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


def hooks_left(model, opt) -> int:
    return (sum(len(p._backward_hooks or {}) for p in model.parameters())
            + len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks))


def test_stop_inside_on_finding_ends_the_watch_after_the_window_with_no_false_failure(
        tmp_path, capsys):
    model, opt = orphan_head()
    out = tmp_path / "diag"
    calls = []

    def on_finding(finding):  # both findings of the first window: two stop()s, one end
        calls.append((finding.code, w.stop(), w.done))
    w = diagkit.watch(model, opt, steps=None, out=out, on_finding=on_finding)
    train(model, opt, 3 * BURST)  # the loop goes on, unwatched after the first window
    assert capsys.readouterr().err == ""  # was: could not save ... AttributeError
    # asked inside the judging: it ends once the window is judged (None until then)
    assert calls == [("orphan", None, False), ("grad_not_cleared", None, False)]
    assert w.done and hooks_left(model, opt) == 0
    diag = w.diagnosis
    assert diag.failure is None and diag.meta["ended"] == "stop"
    assert diag.meta["steps_observed"] == BURST  # the first window, whole; nothing after it
    assert sorted(diag.steps["step"].unique()) == list(range(BURST))
    saved = diagkit.load(out)  # complete: the final result, not the run's save so far
    assert saved.meta["ended"] == "stop" and saved.verdicts() == diag.verdicts()
    assert {"orphan", "grad_not_cleared"} <= {f.code for f in saved.findings}
    written = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert w.stop() is diag  # a second stop() is harmless: nothing judged or written again
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == written
    assert capsys.readouterr().err == ""


def test_sigterm_during_a_windows_judging_saves_once_it_is_judged(tmp_path, capsys):
    model, opt = orphan_head()
    out = tmp_path / "diag"
    seen, handled = [], []

    def users_handler(signum, frame):  # the user's own: it records and the loop goes on
        handled.append((signum, (out / "run.json").is_file()))

    def on_finding(finding):  # SIGTERM comes while the run judges (as a scheduler's would)
        if not seen:
            signal.raise_signal(signal.SIGTERM)
        seen.append((finding.code, list(handled)))
    previous = signal.signal(signal.SIGTERM, users_handler)
    try:
        w = diagkit.watch(model, opt, steps=None, out=out, on_finding=on_finding)
        train(model, opt, 3 * BURST)
        assert signal.getsignal(signal.SIGTERM) is users_handler  # given back as it ended
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capsys.readouterr().err == ""
    # held while the window is judged; then saved; then the user's handler, once
    assert seen == [("orphan", []), ("grad_not_cleared", [])]
    assert handled == [(signal.SIGTERM, True)]
    assert w.done and hooks_left(model, opt) == 0
    saved = diagkit.load(out)
    assert saved.failure is None and saved.meta["ended"] == "SIGTERM"
    assert saved.meta["steps_observed"] == BURST and "orphan" in {f.code for f in saved.findings}
