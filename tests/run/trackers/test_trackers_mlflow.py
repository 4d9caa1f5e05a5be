"""report_to="mlflow": what lands in a local MLflow file store, read back with `MlflowClient`
(docs/integrations.md, "Trackers"). mlflow is imported only inside the `store` fixture, after
its environment says: this store, no telemetry."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import diagkit
from diagkit.present import tracked
from diagkit.run.trackers import to_mlflow
from diagkit.run.trackers.choose import check_report_to, open_sinks
from diagkit.run.trackers.watching import Trackers
from tracker_runs import ORPHAN, ORPHAN_FIX, context, orphan_diagnosis, watch_orphan

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                reason="mlflow is not installed")


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local file store as the tracking URI (MLFLOW_TRACKING_URI); nothing leaves the
    machine: MLflow's telemetry off (MLFLOW_DISABLE_TELEMETRY, DO_NOT_TRACK). mlflow-skinny has
    no sqlite store (no SQLAlchemy): its file store must be allowed (MLFLOW_ALLOW_FILE_STORE)."""
    for name in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(name, "true")
    import mlflow
    uri = (tmp_path / "mlruns").as_uri()
    mlflow.set_tracking_uri(uri)  # also sets MLFLOW_TRACKING_URI
    yield mlflow.MlflowClient(uri)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def history(client, run_id, key) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def whole_watch(trackers, diagnosis, folder=None, before_end=lambda: None) -> None:
    """What a whole-run watch of `diagnosis` does with its trackers: each observed step judged,
    each new finding announced, then the end, waited for."""
    steps = sorted(diagnosis.steps["step"].unique())
    trackers.judged(steps, diagnosis.findings)
    for finding in diagnosis.findings:
        trackers.announced(finding, steps[0])
    before_end()
    trackers.ended(diagnosis, folder)
    assert trackers.wait(10)


def test_a_watch_sends_to_the_active_run_even_once_the_framework_ended_it(store, tmp_path):
    import mlflow
    diagnosis = orphan_diagnosis()
    folder = diagnosis.save(tmp_path / "diag")
    run = mlflow.start_run()
    assert to_mlflow.active()
    ctx, lines = context(step_offset=1)
    trackers = Trackers.open("mlflow", ctx)
    # HF's MLflowCallback ends its run in on_train_end, before a user callback's end
    whole_watch(trackers, diagnosis, folder, before_end=mlflow.end_run)
    assert lines == []
    rid = run.info.run_id
    assert store.get_run(rid).info.status == "FINISHED"  # diagkit left the run as it was

    # one point per observed step (0, 1, 2) at the tracker's step (+1), then the end's counts
    assert history(store, rid, tracked.ERRORS) == [(1, 1.0), (2, 1.0), (3, 1.0), (3, 1.0)]
    assert history(store, rid, tracked.WARNINGS)[-1] == (3, 1.0)
    assert store.get_run(rid).data.tags[tracked.STATUS] == "error"

    table = json.loads(Path(store.download_artifacts(rid, to_mlflow.TABLE_FILE,
                                                      str(tmp_path))).read_text())
    assert table["columns"] == list(tracked.TABLE_COLUMNS)
    row = next(r for r in table["data"] if r[:2] == [ORPHAN, "orphan"])
    assert row[2] == "error" and ORPHAN_FIX in row[-1]
    alerts = Path(store.download_artifacts(rid, to_mlflow.ALERTS_FILE, str(tmp_path))).read_text()
    assert alerts.splitlines()[0].startswith(
        "error: diagkit: orphan in fc2: diagkit: error: orphan in fc2 (2 tensors) from step 1; fix:")
    assert len(alerts.splitlines()) == 2

    # the saved diagnosis, under diagkit/: downloaded, it loads as it was saved
    saved = diagkit.load(store.download_artifacts(rid, "diagkit", str(tmp_path / "dl")))
    assert [f.code for f in saved.findings] == [f.code for f in diagnosis.findings]


def test_diagkit_watch_sends_to_the_run_the_user_opened(store, tmp_path):
    import mlflow
    with mlflow.start_run() as run:
        watch_orphan("mlflow", out=tmp_path / "diag", report=False)
    rid = run.info.run_id
    assert history(store, rid, tracked.ERRORS) == [(0, 1.0), (1, 1.0), (2, 1.0), (2, 1.0)]
    assert store.get_run(rid).data.tags[tracked.STATUS] == "error"
    assert [a.path for a in store.list_artifacts(rid, "diagkit")] == [to_mlflow.TABLE_FILE]


def test_lightnings_mlflow_logger_is_sent_to_through_its_client_and_run_id(store, tmp_path):
    loggers = pytest.importorskip("lightning.pytorch.loggers")
    logger = loggers.MLFlowLogger(experiment_name="t", tracking_uri=store.tracking_uri)
    check_report_to([logger])
    assert to_mlflow.owns(logger)
    ctx, lines = context(framework="lightning", step_offset=1)
    whole_watch(Trackers.open([logger], ctx), orphan_diagnosis())
    assert lines == []
    assert history(store, logger.run_id, tracked.ERRORS)[-1] == (3, 1.0)
    assert store.get_run(logger.run_id).data.tags[tracked.STATUS] == "error"


def test_a_client_and_run_id_pair_or_a_run_stand_in_report_to(store):
    import mlflow
    run = store.create_run(store.get_experiment_by_name("Default").experiment_id)
    pair = (store, run.info.run_id)
    check_report_to([pair, run])
    assert to_mlflow.owns(pair) and to_mlflow.owns(run) and not to_mlflow.owns(store)
    assert not to_mlflow.active()  # created, but not the active run
    for given in (pair, run):
        [sink] = open_sinks([given], context()[0])
        sink.scalars({tracked.ERRORS: 2.0}, 5)
    assert history(store, run.info.run_id, tracked.ERRORS) == [(5, 2.0), (5, 2.0)]
    assert mlflow.active_run() is None  # diagkit starts no run


def test_no_open_run_is_one_line_and_no_tracker(store):
    ctx, lines = context()
    assert Trackers.open("mlflow", ctx) is None
    assert lines == ["diagkit: report_to 'mlflow': no MLflow run is open (start one with "
                     "mlflow.start_run()); not sending to it"]
    assert not to_mlflow.active()
    assert "mlflow" not in [s.name for s in open_sinks("all", ctx)]


def test_all_takes_mlflow_when_a_run_is_open(store):
    import mlflow
    with mlflow.start_run():
        assert "mlflow" in [s.name for s in open_sinks("all", context()[0])]


def test_mlflow_that_cannot_be_imported_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    assert to_mlflow.active() is False
    ctx, lines = context()
    assert Trackers.open(["mlflow"], ctx) is None
    assert lines == ["diagkit: report_to 'mlflow': mlflow is not installed "
                     "(pip install 'diagkit[trackers]'); not sending to it"]


def test_a_run_the_store_does_not_have_is_one_line_and_the_others_get_everything(store, tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    ctx, lines = context()
    trackers = Trackers.open([(store, "0" * 32), writer], ctx)  # a run id never created
    whole_watch(trackers, orphan_diagnosis())
    assert len(lines) == 1
    assert lines[0].startswith("diagkit: could not send to mlflow: MlflowException:")
    assert lines[0].endswith("(the run goes on; diagkit stops sending to it)")
    assert [s.name for s in trackers.sender.sinks] == ["tensorboard"]
    writer.close()
