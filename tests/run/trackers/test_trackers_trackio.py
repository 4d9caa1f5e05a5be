"""report_to="trackio": diagkit's status, findings, alerts and saved diagnosis land in the Trackio
run the user opened, read back through Trackio's own storage (`trackio.SQLiteStorage`)
(docs/integrations.md, "Trackers").

Trackio reads `TRACKIO_DIR` once, as it is imported: the runs happen in a process of their own
(this file, run as a script), with the store in a temporary folder, no Space, no server, no
webhook, Hugging Face offline; it writes what it read back as JSON, which the tests judge.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tracker_readers import trackio_script_stored

if importlib.util.find_spec("trackio") is None:
    pytest.skip("trackio is not installed", allow_module_level=True)

HERE = Path(__file__).resolve()
PROJECT = "diagkit-tests"
ORPHAN_LINE = ("diagkit: error: orphan in fc2 (2 tensors) from step 3; fix: "
               'optimizer.param_groups[0]["params"].extend(model.fc2.parameters())')


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict:
    """Run every scenario in one process (below, `main`) and return what it read back."""
    folder = tmp_path_factory.mktemp("trackio")
    return trackio_script_stored(HERE, folder, timeout=120)


def test_a_watch_sends_series_summary_table_alert_and_diagnosis_to_the_open_run(stored):
    got = stored["watched"]
    assert got["lines"] == []
    assert got["still_open"]  # the user's run is still the current one, not finished
    series = [(r["step"], r["diagkit/errors"], r["diagkit/warnings"])
              for r in got["logs"] if "diagkit/errors" in r and "diagkit/status" not in r]
    assert series == [(1, 1.0, 1.0), (2, 1.0, 1.0), (3, 1.0, 1.0)]  # diagkit's step + 1
    (summary,) = [r for r in got["logs"] if "diagkit/status" in r]
    assert summary == {"step": 3, "diagkit/errors": 1, "diagkit/warnings": 1,
                       "diagkit/status": "error"}
    (table,) = [r for r in got["logs"] if "diagkit/findings" in r]
    assert table["step"] == 3 and table["diagkit/findings"]["_type"] == "trackio.table"
    rows = table["diagkit/findings"]["_value"]
    # from_step on the tracker's axis (offset 1), as the series
    assert [[r[c] for c in ("name", "verdict", "severity", "module", "bytes", "from_step")]
            for r in rows] == [
        ["fc2.weight", "orphan", "error", "fc2", 60, 1],
        ["fc2.bias", "orphan", "error", "fc2", 12, 1],
        ["fc2.weight", "grad_not_cleared", "warning", "fc2", 60, 1],
        ["fc2.bias", "grad_not_cleared", "warning", "fc2", 12, 1]]
    assert "extend(model.fc2.parameters())" in rows[0]["fix"]
    assert got["alerts"] == [{"title": "diagkit: orphan in fc2", "text": ORPHAN_LINE, "level": "error",
                              "step": 3}]
    (artifact,) = got["artifacts"]
    assert (artifact["name"], artifact["type"], artifact["version"]) == (
        "diagkit-diagnosis", "diagkit", 0)
    assert {"run.json", "findings.json", "params.parquet", "steps.parquet"} <= set(got["files"])
    assert got["user_row"] == [{"step": s, "train/loss": 0.5} for s in (1, 2, 3)]  # untouched


def test_a_run_object_in_report_to_is_the_one_sent_to(stored):
    got = stored["given"]
    assert got["lines"] == [] and got["owned"]
    # a run with no row of its own yet: the point carries its training step (7) but is logged
    # at Trackio's step 0, so the run's own counter is not moved on past rows it never logged
    assert [(r["step"], r["diagkit/step"], r["diagkit/errors"]) for r in got["logs"]
            if "diagkit/errors" in r and "diagkit/status" not in r] == [(0, 7, 1.0)]


def test_no_open_run_is_one_line_and_no_trackers(stored):
    line = ("diagkit: report_to 'trackio': no Trackio run is open (trackio.init() first, or "
            "let the framework's Trackio callback open it); not sending to it")
    before = stored["before_import"]  # trackio not imported yet: not imported to find out
    assert before == {"active": False, "opened": False, "lines": [line], "imported": False}
    after = stored["no_run"]  # imported, no run open
    assert after == {"active": False, "opened": False, "lines": [line], "all": []}


def test_a_run_finished_meanwhile_is_one_line_and_the_watch_goes_on(stored):
    got = stored["gone"]
    assert got["waited"]  # the trackers' end came, nothing raised
    assert got["lines"] == got["said_by_then"] == [
        "diagkit: could not send to trackio: RuntimeError: the Trackio run 'gone' is finished "
        "(the run goes on; diagkit stops sending to it)"]
    # what was sent before the run finished is there; nothing after it
    assert [(r["step"], r["diagkit/errors"]) for r in got["logs"]] == [(0, 1.0)]
    assert got["alerts"] == []


def test_a_whole_run_watch_reports_to_the_open_run(stored):
    """`diagkit.watch(..., report_to="trackio")` in a plain loop, ended by `stop()`."""
    got = stored["watch"]
    assert got["verdicts"]["fc2.weight"] == ["grad_not_cleared", "orphan"]
    # the log has the findings' lines; none says a tracker could not be opened or sent to
    assert not [line for line in got["lines"] if "report_to" in line or "could not" in line]
    assert sorted((a["title"], a["level"]) for a in got["alerts"]) == [
        ("diagkit: grad_not_cleared in fc2", "warn"), ("diagkit: orphan in fc2", "error")]  # once each
    assert [r["diagkit/status"] for r in got["logs"] if "diagkit/status" in r] == ["error"]
    assert any("diagkit/findings" in r for r in got["logs"])
    steps = [r["step"] for r in got["logs"] if "diagkit/errors" in r and "diagkit/status" not in r]
    assert steps and steps == sorted(steps)


# ------------------------------------------------------------------ the trackio side (a script)
def main(folder: Path) -> None:
    """Every scenario, in order, against one local store; what was read back -> stored.json."""
    import logging
    lines: list[str] = []
    logging.getLogger("diagkit").addHandler(_collector(lines))
    out = {"before_import": _before_import()}
    import trackio
    out["no_run"] = _no_run()
    out["watched"] = _watched(folder, trackio)
    out["given"] = _given(trackio)
    out["gone"] = _gone(trackio)
    out["watch"] = _watch(trackio, lines)
    (folder / "stored.json").write_text(json.dumps(out, default=str))


def _collector(lines: list):
    """A logging handler that keeps the "diagkit" logger's lines (the watch's own `say`)."""
    import logging
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    return handler


def _diagnosis():
    import torch
    import diagkit
    from models import MLP, fixed_batch, mse_loss
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)  # the head left out: an orphan
    return diagkit.diagnose(model, opt, batch_fn=fixed_batch, loss_fn=mse_loss, steps=3)


def _context(lines, **kw):
    from diagkit.run.trackers.context import Context
    return Context(say=lines.append, **kw)


def _before_import() -> dict:
    from diagkit.run.trackers import to_trackio
    from diagkit.run.trackers.watching import Trackers
    lines: list[str] = []
    active = to_trackio.active()
    opened = Trackers.open("trackio", _context(lines)) is not None
    return {"active": active, "opened": opened, "lines": lines,
            "imported": "trackio" in sys.modules}


def _no_run() -> dict:
    from diagkit.run.trackers import choose, to_trackio
    from diagkit.run.trackers.watching import Trackers
    lines: list[str] = []
    opened = Trackers.open("trackio", _context(lines)) is not None
    return {"active": to_trackio.active(), "opened": opened, "lines": lines,
            "all": [w for w in choose.words("all") if w == "trackio"]}


def _open(trackio, name):
    return trackio.init(project=PROJECT, name=name, space_id=None, embed=False,
                        auto_log_cpu=False, auto_log_gpu=False)


def _read(run, name=None) -> dict:
    """The run's rows (timestamps left out), alerts and artifacts, from trackio's storage."""
    from tracker_readers import trackio_read
    return trackio_read(PROJECT, name or run.name, run.id)


def _watched(folder: Path, trackio) -> dict:
    from diagkit.run.trackers import choose, to_trackio
    from diagkit.run.trackers.watching import Trackers
    from trackio import SQLiteStorage
    diagnosis = _diagnosis()
    run = _open(trackio, "watched")
    for step in (1, 2, 3):  # the user's own metric, logged at its steps as the loop ran
        trackio.log({"train/loss": 0.5}, step=step)
    assert to_trackio.active() and "trackio" in choose.words("all")
    lines: list[str] = []
    trackers = Trackers.open("trackio", _context(lines, step_offset=1))
    trackers.judged([0, 1, 2], diagnosis.findings)
    trackers.announced(diagnosis.findings[0], 2)
    trackers.ended(diagnosis, diagnosis.save(folder / "diag"))
    assert trackers.wait()
    still_open = trackio.context_vars.current_run.get() is run
    trackio.finish()
    got = _read(run)
    manifest = SQLiteStorage.get_artifact_manifest(PROJECT, "diagkit-diagnosis", None)
    files = sorted(f["path"] for f in manifest["manifest"])
    user = [r for r in got["logs"] if "train/loss" in r]
    return {**got, "lines": lines, "still_open": still_open, "files": files,
            "user_row": user[0] if len(user) == 1 else user}


def _given(trackio) -> dict:
    from diagkit.run.trackers import choose, to_trackio
    from diagkit.run.trackers.watching import Trackers
    diagnosis = _diagnosis()
    run = _open(trackio, "given")
    lines: list[str] = []
    choose.check_report_to([run])
    trackers = Trackers.open([run], _context(lines))
    trackers.judged([7], diagnosis.findings)
    trackers.ended(diagnosis)
    assert trackers.wait()
    trackio.finish()
    return {**_read(run), "lines": lines, "owned": to_trackio.owns(run)}


def _gone(trackio) -> dict:
    from diagkit.run.trackers.watching import Trackers
    diagnosis = _diagnosis()
    run = _open(trackio, "gone")
    lines: list[str] = []
    trackers = Trackers.open("trackio", _context(lines))
    trackers.judged([0], diagnosis.findings)
    trackers.sender.flush()
    trackio.finish()  # the user's script finished it while diagkit still watched
    trackers.judged([1, 2], diagnosis.findings)
    trackers.sender.flush()
    said_by_then = list(lines)  # the first send after the end says it
    trackers.announced(diagnosis.findings[0], 2)
    trackers.ended(diagnosis)
    waited = trackers.wait()
    return {**_read(run), "lines": lines, "said_by_then": said_by_then, "waited": waited}


def _watch(trackio, lines) -> dict:
    import torch
    import diagkit
    from models import MLP, fixed_batch, mse_loss
    run = _open(trackio, "whole-run")
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    del lines[:]
    watch = diagkit.watch(model, opt, steps=None, report_to="trackio")
    for _ in range(6):
        opt.zero_grad()
        mse_loss(model, fixed_batch()).backward()
        opt.step()
    diagnosis = watch.stop()
    trackio.finish()
    verdicts = {k: sorted(v) for k, v in diagnosis.verdicts().items()}
    return {**_read(run), "lines": list(lines), "verdicts": verdicts}


if __name__ == "__main__":
    main(Path(sys.argv[1]))
