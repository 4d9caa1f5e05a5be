"""report_to under Lightning (docs/integrations.md, "Trackers"): the default follows
`trainer.loggers`, with the real loggers in their local modes: a `TensorBoardLogger`'s event
files read back with tensorboard's reader, an `MLFlowLogger` on a local file store read back with
`MlflowClient`, a `CSVLogger` left out quietly. diagkit's series lands at the steps of
Lightning's own logs, and the end lands before the loggers' `finalize`."""

from __future__ import annotations

import warnings

import pytest

L = pytest.importorskip("lightning.pytorch")
pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from diagkit.integrations.lightning import DiagkitCallback  # noqa: E402
from lightning_runs import fit  # noqa: E402

FIX = "p.requires_grad_(False)"  # the orphan's fix: freeze what no optimizer steps


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local MLflow file store; nothing leaves the machine: MLflow's telemetry off."""
    for name in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(name, "true")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    yield uri
    mlflow.set_tracking_uri(None)


def text(events, tag) -> str:
    (event,) = events.Tensors(f"{tag}/text_summary")
    return event.tensor_proto.string_val[0].decode()


@pytest.mark.parametrize("steps, observed", [(None, [0, 1, 2, 3, 4]), (2, [0, 2])])
def test_the_orphan_lands_in_the_loggers_at_lightnings_steps(tmp_path, store, steps, observed):
    board = L.loggers.TensorBoardLogger(tmp_path, name="tb")
    flow = L.loggers.MLFlowLogger(experiment_name="diagkit", tracking_uri=store)
    csv = L.loggers.CSVLogger(tmp_path, name="csv")
    callback = DiagkitCallback(steps=steps, every=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit(tmp_path, callback, [board, flow, csv])
    assert trainer.global_step == 6
    assert [str(w.message) for w in caught if "diagkit" in str(w.message)] == []
    diagnosis = callback.diagnosis
    assert sorted(set(int(s) for s in diagnosis.steps["step"])) == observed
    (orphan,) = [f for f in diagnosis.findings if f.code == "orphan"]
    assert orphan.module == "head" and FIX in orphan.fix

    # Lightning logs an optimizer step's values at the step count before it: 0..5
    events = EventAccumulator(board.log_dir, size_guidance={"scalars": 0, "tensors": 0}).Reload()
    assert [e.step for e in events.Scalars("loss")] == [0, 1, 2, 3, 4, 5]
    series = [e.step for e in events.Scalars("diagkit/errors")]
    assert series[:len(observed)] == observed and set(series) <= set(range(6))
    assert text(events, "diagkit/status") == "error"
    row = next(line for line in text(events, "diagkit/findings").splitlines()
               if "| orphan |" in line)
    assert row.startswith("| head.weight | orphan | error | head |") and FIX in row
    # one event file: diagkit wrote into the logger's writer before `finalize` closed it
    assert len(list((tmp_path / "tb" / "version_0").glob("events.out.tfevents.*"))) == 1

    client = mlflow.MlflowClient(store)
    run = client.get_run(flow.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["diagkit/status"] == "error"
    loss = [m.step for m in client.get_metric_history(flow.run_id, "loss")]
    history = client.get_metric_history(flow.run_id, "diagkit/errors")
    assert loss == [0, 1, 2, 3, 4, 5] and [m.step for m in history][:len(observed)] == observed
    assert max(m.timestamp for m in history) <= run.info.end_time

    # the CSV logger gets nothing of diagkit (no tracker it sends to)
    assert "diagkit/" not in (tmp_path / "csv" / "version_0" / "metrics.csv").read_text()


def test_report_to_none_leaves_the_loggers_alone(tmp_path):
    board = L.loggers.TensorBoardLogger(tmp_path, name="tb")
    fit(tmp_path, DiagkitCallback(steps=2, report_to="none"), [board])
    events = EventAccumulator(board.log_dir).Reload()
    assert "loss" in events.Tags()["scalars"] and "diagkit/errors" not in events.Tags()["scalars"]
