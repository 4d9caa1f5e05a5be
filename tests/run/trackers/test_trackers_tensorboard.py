"""report_to="tensorboard": what lands in the event files, read back with tensorboard's own
reader (docs/integrations.md, "Trackers")."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

from diagkit.present import tracked  # noqa: E402
from diagkit.run.trackers import to_tensorboard  # noqa: E402
from diagkit.run.trackers.choose import check_report_to, open_sinks  # noqa: E402
from diagkit.run.trackers.watching import Trackers  # noqa: E402
from tracker_runs import ORPHAN, ORPHAN_FIX, context, orphan_diagnosis, watch_orphan  # noqa: E402


def read(folder) -> EventAccumulator:
    """Every scalar and every text event under `folder` (all event files of the run dir)."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    return events.Reload()


def scalars(events, tag) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in events.Scalars(tag)]


def texts(events, tag) -> list[tuple[int, str]]:
    """`add_text(tag, ...)`'s events: torch's writer files them under `<tag>/text_summary`."""
    return [(e.step, e.tensor_proto.string_val[0].decode())
            for e in events.Tensors(f"{tag}/text_summary")]


def whole_watch(trackers, diagnosis, folder=None) -> None:
    """What a whole-run watch of `diagnosis` does with its trackers: each observed step judged,
    each new finding announced, then the end (which closes the sinks), waited for."""
    steps = sorted(diagnosis.steps["step"].unique())
    trackers.judged(steps, diagnosis.findings)
    for finding in diagnosis.findings:
        trackers.announced(finding, steps[0])
    trackers.ended(diagnosis, folder)
    assert trackers.wait(10)


def test_a_watch_writes_the_series_status_and_table_beside_out(tmp_path):
    diagnosis = orphan_diagnosis()
    ctx, lines = context(out=tmp_path / "diag", step_offset=1)
    trackers = Trackers.open("tensorboard", ctx)
    whole_watch(trackers, diagnosis, folder=tmp_path / "diag")
    assert lines == []

    events = read(tmp_path / "runs" / "diagkit")
    # one point per observed step (0, 1, 2), at the tracker's step (+1), then the end's counts
    assert scalars(events, tracked.ERRORS) == [(1, 1.0), (2, 1.0), (3, 1.0), (3, 1.0)]
    assert scalars(events, tracked.WARNINGS)[-1] == (3, 1.0)
    assert texts(events, tracked.STATUS) == [(3, "error")]
    [(step, table)] = texts(events, tracked.TABLE_KEY)
    assert step == 3
    assert table.startswith("| name | verdict | severity |")
    row = next(line for line in table.splitlines() if line.startswith(f"| {ORPHAN} | orphan"))
    assert "| error |" in row and ORPHAN_FIX in row
    alerts = [text for _, text in texts(events, "diagkit/alerts")]
    assert [a.split(")")[0] for a in alerts] == ["**diagkit: orphan in fc2** (error",
                                                "**diagkit: grad_not_cleared in fc2** (warning"]
    assert "diagkit: error: orphan in fc2 (2 tensors) from step 1; fix:" in alerts[0]
    assert texts(events, "diagkit/artifacts") == [(3, f"saved diagnosis: {tmp_path / 'diag'}")]


def test_diagkit_watch_saves_out_and_writes_its_event_files_beside_it(tmp_path, caplog):
    w = watch_orphan("tensorboard", out=tmp_path / "diag")
    assert (tmp_path / "diag" / "run.json").exists()  # the save was not refused
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == []
    events = read(tmp_path / "runs" / "diagkit")
    assert scalars(events, tracked.ERRORS) == [(0, 1.0), (1, 1.0), (2, 1.0), (2, 1.0)]
    assert ORPHAN_FIX in texts(events, tracked.TABLE_KEY)[0][1]
    assert w.diagnosis.worst() == "error"


def test_a_given_writer_is_written_into_and_left_open(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    writer.add_scalar("loss", 0.5, 1)
    check_report_to([writer])  # a SummaryWriter may stand in report_to
    ctx, lines = context()
    trackers = Trackers.open([writer], ctx)
    whole_watch(trackers, orphan_diagnosis())
    assert writer.all_writers is not None  # not closed (torch's writer sets it None on close)
    writer.add_scalar("loss", 0.25, 2)  # the user's writer goes on
    writer.close()

    events = read(tmp_path / "tb")
    assert scalars(events, "loss") == [(1, 0.5), (2, 0.25)]
    assert [s for s, _ in scalars(events, tracked.ERRORS)] == [0, 1, 2, 2]
    assert ORPHAN in texts(events, tracked.TABLE_KEY)[0][1]
    assert lines == []


def test_the_frameworks_log_dir_wins_and_the_writer_diagkit_opened_is_closed(tmp_path):
    ctx, _ = context(out=tmp_path / "diag", objects={"tensorboard_dir": tmp_path / "logs"})
    [sink] = open_sinks("tensorboard", ctx)
    sink.scalars({tracked.ERRORS: 2.0}, 7)
    sink.close()
    assert sink.writer.all_writers is None  # closed
    assert scalars(read(tmp_path / "logs"), tracked.ERRORS) == [(7, 2.0)]
    assert not (tmp_path / "runs").exists()


def test_standalone_without_out_it_writes_under_runs_diagkit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    [sink] = open_sinks(["tensorboard"], context()[0])
    sink.summary({tracked.ERRORS: 0, tracked.WARNINGS: 0, tracked.STATUS: "ok"})
    sink.close()
    events = read(tmp_path / "runs" / "diagkit")
    assert texts(events, tracked.STATUS) == [(0, "ok")]


def test_it_is_never_active_so_all_leaves_it_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert to_tensorboard.active() is False
    assert not any(s.name == "tensorboard" for s in open_sinks("all", context()[0]))
    assert not (tmp_path / "runs").exists()


def test_a_writer_that_fails_is_one_line_and_the_rest_still_runs(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    ctx, lines = context()
    trackers = Trackers.open([writer], ctx)
    writer.add_scalar = None  # the user's writer broke: calling it raises TypeError
    whole_watch(trackers, orphan_diagnosis())
    assert len(lines) == 1
    assert lines[0].startswith("diagkit: could not send to tensorboard: TypeError:")
    assert lines[0].endswith("(the run goes on; diagkit stops sending to it)")
