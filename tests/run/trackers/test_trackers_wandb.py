"""report_to="wandb": diagkit's status, findings, alerts and saved diagnosis land in the W&B run
the user opened, read back from the offline run's own files (docs/integrations.md, "Trackers").

W&B runs offline here: nothing reaches the network. Offline, every record of the run is in its
transaction log (`run-<id>.wandb`, what `wandb sync` uploads), which
tests/helpers/tracker_readers.py reads back. W&B's service process is ended
at the module's end (`wandb.teardown`): the suite fails on a process left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

wandb = pytest.importorskip("wandb")

import diagkit  # noqa: E402
from diagkit.run.trackers import choose, to_wandb  # noqa: E402
from diagkit.run.trackers.context import Context  # noqa: E402
from diagkit.run.trackers.watching import Trackers  # noqa: E402
from models import MLP, fixed_batch, mse_loss  # noqa: E402
from tracker_readers import diagkit_rows, read_back, wandb_offline  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory):
    """Every W&B folder (runs, staging, cache, config) under this module's temporary folder;
    W&B's service ended at the end."""
    home = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        wandb_offline(mp, home)
        yield home
        if wandb.run is not None:
            wandb.run.finish()
        wandb.teardown()


def open_run(tmp_path, **extra):
    return wandb.init(project="diagkit-tests", dir=tmp_path, mode="offline",
                      settings=wandb.Settings(x_disable_stats=True, x_disable_machine_info=True,
                                              disable_code=True, disable_git=True, console="off"),
                      **extra)


@pytest.fixture(scope="module")
def orphan():
    """A real diagnosis: fc2 (the head) is left out of the optimizer (an orphan, an error)."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    return diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=mse_loss, steps=3)


def test_a_watch_sends_status_table_alert_and_diagnosis_to_the_open_run(tmp_path, orphan):
    run = open_run(tmp_path)
    run.log({"train/loss": 1.0})  # the user's own row: W&B's _step is 0 before diagkit's
    lines = []
    assert to_wandb.active() and "wandb" in choose.words("all")
    trackers = Trackers.open("wandb", Context(step_offset=1, say=lines.append))
    trackers.judged([0, 1, 2], orphan.findings)
    trackers.announced(orphan.findings[0], 2)
    folder = orphan.save(tmp_path / "diag")
    trackers.ended(orphan, folder)
    assert trackers.wait()
    assert lines == []
    assert wandb.run is run  # the user's run is left open
    run.finish()

    got = read_back(run)
    assert ("diagkit/*", "diagkit/step") in got["metric"]
    # one point per observed step, against diagkit/step = diagkit's step + 1 (a framework's)
    assert diagkit_rows(got["history"]) == [(1, 1, 1), (2, 1, 1), (3, 1, 1)]
    assert [h["_step"] for h in got["history"] if "diagkit/errors" in h] == [1, 2, 3]
    summary = got["summary"]
    assert (summary["diagkit/errors"], summary["diagkit/warnings"],
            summary["diagkit/status"]) == (1, 1, "error")
    assert got["alert"] == [("diagkit: orphan in fc2",
                             "diagkit: error: orphan in fc2 (2 tensors) from step 3; fix: "
                             'optimizer.param_groups[0]["params"].extend(model.fc2.parameters())',
                             "ERROR")]
    (table_file,) = (got["files"] / summary["diagkit/findings/path"]).parent.glob("findings_*")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["name", "verdict", "severity", "module", "bytes", "from_step",
                                "fix"]
    assert [r[:6] for r in table["data"]] == [
        ["fc2.weight", "orphan", "error", "fc2", 60, 1],
        ["fc2.bias", "orphan", "error", "fc2", 12, 1],
        ["fc2.weight", "grad_not_cleared", "warning", "fc2", 60, 1],
        ["fc2.bias", "grad_not_cleared", "warning", "fc2", 12, 1]]
    assert "extend(model.fc2.parameters())" in table["data"][0][6]
    (saved,) = [a for a in got["artifact"] if a[1] == "diagkit"]
    assert saved[0] == "diagkit-diagnosis"
    assert {"run.json", "findings.json", "params.parquet", "steps.parquet"} <= set(saved[2])


def test_a_run_object_in_report_to_is_the_one_sent_to(tmp_path, orphan):
    """Two runs open (`reinit="create_new"`): the one named in report_to gets diagkit's rows,
    the other nothing."""
    chosen = open_run(tmp_path / "a", reinit="create_new")
    other = open_run(tmp_path / "b", reinit="create_new")
    choose.check_report_to([chosen])
    trackers = Trackers.open([chosen], Context(say=print))
    trackers.judged([4], orphan.findings)
    trackers.ended(orphan)
    assert trackers.wait()
    chosen.finish()
    other.finish()
    assert diagkit_rows(read_back(chosen)["history"]) == [(4, 1, 1)]
    assert diagkit_rows(read_back(other)["history"]) == []


def test_no_open_run_is_one_line_and_no_trackers():
    assert wandb.run is None and not to_wandb.active()
    lines = []
    assert Trackers.open("wandb", Context(say=lines.append)) is None
    assert "wandb" not in choose.words("all")
    assert lines == ["diagkit: report_to 'wandb': no W&B run is open (wandb.init() first, or "
                     "let the framework's W&B logger open it); not sending to it"]


def test_a_run_finished_meanwhile_is_one_line_and_the_other_run_still_gets_it(tmp_path, orphan):
    gone = open_run(tmp_path / "gone", reinit="create_new")
    kept = open_run(tmp_path / "kept", reinit="create_new")
    lines = []
    trackers = Trackers.open([gone, kept], Context(say=lines.append))
    gone.finish()  # the user's script finished it while diagkit still watched
    trackers.judged([0, 1], orphan.findings)
    trackers.announced(orphan.findings[0], 1)
    trackers.ended(orphan)
    assert trackers.wait()
    kept.finish()
    assert len(lines) == 1, lines
    assert lines[0].startswith("diagkit: could not send to wandb: UsageError: Run (")
    assert lines[0].endswith("(the run goes on; diagkit stops sending to it)")
    got = read_back(kept)
    assert diagkit_rows(got["history"]) == [(0, 1, 1), (1, 1, 1)]
    assert got["summary"]["diagkit/status"] == "error" and len(got["alert"]) == 1


def test_asking_whether_a_run_is_open_does_not_import_wandb():
    code = ("import sys; from diagkit.run.trackers import to_wandb; "
            "assert not to_wandb.active() and not to_wandb.owns(object()); "
            "assert 'wandb' not in sys.modules, 'imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_whole_run_watch_reports_to_the_open_run(tmp_path):
    """`diagkit.watch(..., report_to="wandb")` in a plain loop, ended by `stop()`: one alert per
    finding, the series, the summary and the table."""
    run = open_run(tmp_path)
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    watch = diagkit.watch(model, opt, steps=None, report_to="wandb")
    for _ in range(6):
        opt.zero_grad()
        mse_loss(model, fixed_batch()).backward()
        opt.step()
    watch.stop()
    run.finish()
    got = read_back(run)
    assert sorted((title, level) for title, _, level in got["alert"]) == [
        ("diagkit: grad_not_cleared in fc2", "WARN"), ("diagkit: orphan in fc2", "ERROR")]  # once each
    steps = [step for step, _, _ in diagkit_rows(got["history"])]
    assert steps and steps == sorted(steps)
    assert got["summary"]["diagkit/status"] == "error"
    assert got["summary"]["diagkit/findings/nrows"] == 4
