"""The `report_to` snippets of the README (the watch section) and of docs/integrations.md
("Trackers") run as written, on a real MLflow run in a local file store, with a loop whose head
no optimizer holds: the run then holds diagkit's status, series and findings table."""

from __future__ import annotations

import json

import pytest
import torch

import diagkit
import doc_blocks
from models import MLP, fixed_batch, mse_loss

PAGES = {"README.md": "## Diagnose your real training run", "docs/integrations.md": "## Trackers"}


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local MLflow file store; nothing leaves the machine (telemetry off)."""
    pytest.importorskip("mlflow")
    for name in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(name, "true")
    import mlflow
    uri = (tmp_path / "mlruns").as_uri()
    mlflow.set_tracking_uri(uri)
    yield mlflow.MlflowClient(uri)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.mark.parametrize("page", PAGES)
def test_the_report_to_snippet_lands_the_orphan_in_the_open_run(page, store, tmp_path):
    import mlflow
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.fc1.parameters(), lr=0.1)  # fc2 left out: an orphan
    names = {"diagkit": diagkit, "mlflow": mlflow, "model": model, "optimizer": optimizer}
    code = doc_blocks.snippet(doc_blocks.ROOT / page, "report_to=", PAGES[page])
    exec(compile(code, page, "exec"), names)
    batch = fixed_batch()
    for _ in range(12):
        optimizer.zero_grad()
        mse_loss(model, batch).backward()
        optimizer.step()
    names["watch"].stop()  # waits until the trackers got everything
    run = mlflow.active_run().info.run_id
    mlflow.end_run()
    assert store.get_run(run).data.tags["diagkit/status"] == "error"
    series = store.get_metric_history(run, "diagkit/errors")
    assert series and all(m.value >= 1 for m in series)
    table = store.download_artifacts(run, "diagkit/findings_table.json", str(tmp_path))
    rows = json.loads(open(table).read())
    assert "fc2.weight" in json.dumps(rows) and "extend(" in json.dumps(rows)


def test_the_tensorboard_snippet_writes_beside_out(tmp_path, monkeypatch):
    """docs/integrations.md, "TensorBoard": event files in runs/diagkit/ beside `out`, read
    back with tensorboard's own reader; `out` holds the diagnosis alone."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    names = {"diagkit": diagkit, "model": model, "optimizer": optimizer}
    code = doc_blocks.snippet(doc_blocks.ROOT / "docs/integrations.md", '"tensorboard"',
                              "### TensorBoard")
    exec(compile(code, "docs/integrations.md", "exec"), names)
    batch = fixed_batch()
    for _ in range(25):
        optimizer.zero_grad()
        mse_loss(model, batch).backward()
        optimizer.step()
    names["watch"].stop()
    events = EventAccumulator(str(tmp_path / "runs" / "diagkit"), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("diagkit/errors")][-1] >= 1
    assert "diagkit/findings/text_summary" in events.Tags()["tensors"]
    assert diagkit.load(tmp_path / "diag").verdicts()["fc2.weight"] >= {"orphan"}
