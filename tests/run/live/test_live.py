"""The live view's feed and `diagkit.explore`, without a browser (the browser test is
tests/e2e/test_jupyterlab_live.py). The feed's tests run in a fresh interpreter with a real
IPython shell, so that no shell is left behind in the test process."""

from __future__ import annotations

import html
import re

import pytest
import torch

import diagkit
from diagkit.present.explorer import Explorer, Reloadable
from diagkit.run.live.view import check_live, shown
from doc_blocks import DOCS, snippet
from ipython_runs import in_ipython
from models import TwoHeads, two_heads_groups

def test_the_panel_follows_the_steps_then_becomes_the_explorer():
    got = in_ipython("""
        live.MIN_GAP, live.DUTY = 0.0, 1.0   # an update whenever the last one is done
        w = diagkit.watch(model, opt, steps=12, live=True)
        seen = []
        train(14, w, sleep=0.15, seen=seen)
        ended = w.live.join(30)
        print(json.dumps({"seen": seen, "ended": ended, "updates": w.live.updates,
                          "end": type(w.live.panel.children[0]).__name__,
                          "orphan": sorted(n for n, v in w.diagnosis.verdicts().items()
                                           if "orphan" in v)}))
    """)
    during = got["seen"][:11]  # the observed steps but the last
    counts = {int(re.search(r"</b>: (\d+) of 12 steps observed", s).group(1)) for s in during}
    assert len(counts) >= 2 and max(counts) < 12, during
    assert any("orphan" in s and "head2" in s for s in during), during
    assert got["ended"] and got["end"] == "Explorer"
    assert got["updates"] >= 2
    assert got["orphan"] == ["head2.bias", "head2.weight"]


def test_updates_are_throttled_by_the_feeds_own_cost():
    """With the default throttle an update waits `MIN_GAP`, and `cost / (DUTY / 2)` after the
    last one; judging waits `cost / (DUTY / 2)` before the next: the feed's thread works at
    most `DUTY` of the time, but for the latest of each kind (whose wait may outlast the
    loop)."""
    got = in_ipython("""
        w = diagkit.watch(model, opt, steps=200, live=True)
        start = time.monotonic()
        train(200, w, sleep=0.01)
        elapsed = time.monotonic() - start
        w.live.join(30)
        f = w.live
        print(json.dumps({"updates": f.updates, "judged": f.judged, "busy": f.busy,
                          "elapsed": elapsed, "tick": f.last_tick, "judge": f.last_judge,
                          "gap": live.MIN_GAP, "duty": live.DUTY}))
    """)
    assert 1 <= got["judged"] < got["updates"] <= 1 + got["elapsed"] / got["gap"]
    assert got["busy"] - got["tick"] - got["judge"] <= got["duty"] * got["elapsed"]


@pytest.mark.parametrize("broken", ["live.judge_observation",      # on the feed's thread
                                    "live.LiveFeed._snapshot"])     # on the loop's
def test_a_failing_live_view_is_one_line_and_the_watch_goes_on(broken):
    got = in_ipython(f"""
        def broken(*a, **k):
            raise RuntimeError("boom")
        {broken} = broken
        w = diagkit.watch(model, opt, steps=4, live=True)
        time.sleep(0.1)
        train(2)
        time.sleep(0.5)
        status = w.live.panel.status.value
        train(3)
        w.live.join(30)
        print(json.dumps({{"status": status, "updates": w.live.updates,
                          "end": type(w.live.panel.children[0]).__name__,
                          "orphan": "orphan" in w.diagnosis.verdicts()["head2.weight"]}}))
    """)
    assert got["status"].endswith("diagkit: the live view stopped: RuntimeError: boom (the "
                                  "watch goes on)</span>")
    assert got["updates"] == 0 and got["end"] == "Explorer" and got["orphan"]


def test_a_whole_run_panel_lists_the_wiring_changes():
    got = in_ipython("""
        live.MIN_GAP, live.DUTY = 0.0, 1.0
        w = diagkit.watch(model, opt, steps=None, every=1, live=True)
        train(6, sleep=0.02)
        time.sleep(0.5)
        before = w.live.panel.changes.value + w.live.panel.findings.value
        opt.add_param_group({"params": list(model.head2.parameters())})
        train(12, sleep=0.02)
        # An update that began before the change can outlast these steps on a loaded machine,
        # and a panel updates only on a step: step on (up to 30 s) until one shows the change.
        deadline = time.monotonic() + 30
        while ("groups changed" not in w.live.panel.changes.value
               and time.monotonic() < deadline):
            train(1, sleep=0.05)
        time.sleep(0.5)
        after = w.live.panel.changes.value + w.live.panel.findings.value
        w.stop()
        w.live.join(30)
        print(json.dumps({"before": before, "after": after,
                          "end": type(w.live.panel.children[0]).__name__}))
    """)
    assert "No wiring change so far" in got["before"] and "orphan" in got["before"]
    after = html.unescape(got["after"])
    assert "<li>step 6: optimizer 0's groups changed (2 -> 3 groups, 4 -> 6 tensors)</li>" in after
    assert "held from step 0 to 5; gone at step" in after  # the orphan, fixed by the change
    assert got["end"] == "Explorer"


def test_outside_ipython_nothing_is_shown():
    assert shown(None) is False and shown(True) is False and shown(False) is False
    with pytest.raises(diagkit.DiagkitError, match="live must be True, False or None"):
        check_live("yes")
    model = torch.nn.Linear(2, 1)
    with pytest.raises(diagkit.DiagkitError, match="live must be"):
        diagkit.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), live=1)


# ---------------------------------------------------------------------- diagkit.explore
def _watched(steps: int = 3):
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.SGD(two_heads_groups(dict(model.named_parameters()), planted=True),
                          lr=0.05)
    w = diagkit.watch(model, opt, steps=steps, live=False)
    for _ in range(steps):
        model(torch.randn(4, 8)).backward()
        opt.step()
        opt.zero_grad()
    return w.diagnosis


def test_explore_takes_a_diagnosis_or_its_folder(tmp_path):
    diag = _watched()
    assert isinstance(diagkit.explore(diag), Explorer)
    diag.save(tmp_path / "d")
    shown_ = diagkit.explore(tmp_path / "d")
    assert isinstance(shown_, Explorer)
    assert "head2.weight" in shown_.controls.table.value.replace("<wbr>", "")


def test_explore_a_running_jobs_folder_reloads_its_newest_save(tmp_path):
    diag = _watched()
    folder = tmp_path / "d"
    type(diag)(**{**diag.__dict__, "meta": {**diag.meta, "ended": "running"}}).save(folder)
    view = diagkit.explore(str(folder))
    assert isinstance(view, Reloadable)
    assert "running job's diagnosis, as last saved (3 observed steps)" in \
        html.unescape(view.line.value)
    _watched(steps=5).save(folder)
    view.button.click()
    assert "The job has ended: its diagnosis (5 observed steps)." in view.line.value
    assert view.children[1] is view.explorer and isinstance(view.explorer, Explorer)


def test_the_docs_explore_block_runs(tmp_path, monkeypatch):
    """docs/workbook.md, "The explorer anywhere": both calls, as written there."""
    block = snippet(DOCS / "workbook.md", "diagkit.explore(", section="## The explorer anywhere")
    diag = _watched()
    diag.save(tmp_path / "diag")
    monkeypatch.chdir(tmp_path)
    shown_ = []
    for line in block.splitlines():
        shown_.append(eval(line.split("#")[0], {"diagkit": diagkit,
                                                "w": type("W", (), {"diagnosis": diag})}))
    assert [type(v) for v in shown_] == [Explorer, Explorer]


@pytest.mark.parametrize("bad, line", [
    ("/nowhere/diag", "saved diagnosis /nowhere/diag does not exist"),
    (42, "explore takes a Diagnosis (diagkit.load, Watch.diagnosis) or the folder one was "
         "saved to, got int"),
])
def test_explore_refuses_bad_input_in_one_line(bad, line):
    with pytest.raises(diagkit.DiagkitError) as err:
        diagkit.explore(bad)
    assert str(err.value) == line


def test_explore_refuses_a_folder_that_holds_no_diagnosis(tmp_path):
    with pytest.raises(diagkit.DiagkitError, match="is not a saved diagnosis"):
        diagkit.explore(tmp_path)
