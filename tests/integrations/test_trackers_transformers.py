"""report_to under a Hugging Face `Trainer` (docs/integrations.md, "Trackers"), with the real
packages in their local modes: TensorBoard's event files read back with tensorboard's reader, an
MLflow file store read back with `MlflowClient`. The default follows `args.report_to`; diagkit's
series lands at the Trainer's own logged steps; its end reaches the trackers before HF's tracker
callbacks close them (diagkit's callback runs first at `on_train_end`); a tracker that fails is
one line and training goes on; a process other than the main one sends nothing."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from integration_helpers import Sequences, head_left_out_trainer, tiny_classifier, training_args

transformers = pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from diagkit.integrations import Attachment  # noqa: E402
from diagkit.integrations.transformers import DiagkitCallback  # noqa: E402

FIX = "p.requires_grad_(False)"  # the orphan's fix: freeze what no optimizer steps


HeadLeftOut = head_left_out_trainer()  # the head `score` left out of the optimizer


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local MLflow file store (MLFLOW_TRACKING_URI, read by HF's MLflowCallback); nothing
    leaves the machine: MLflow's telemetry off."""
    for name in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(name, "true")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield mlflow.MlflowClient(uri)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture
def said():
    """The lines diagkit says through transformers' logger."""
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("transformers.integrations.diagkit")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def train(tmp_path, callback, *others, **overrides):
    """6 steps of the orphan's Trainer, every step logged, reporting to TensorBoard and MLflow."""
    args = training_args(tmp_path, max_steps=6, logging_strategy="steps", logging_steps=1,
                         report_to=["tensorboard", "mlflow"], **overrides)
    trainer = HeadLeftOut(model=tiny_classifier(), args=args, train_dataset=Sequences(),
                          callbacks=[callback, *others])
    trainer.train()
    return trainer


def board(tmp_path):
    """HF's TensorBoard run dir (output_dir/runs/<date>), its event files, their events."""
    (folder,) = (tmp_path / "trainer" / "runs").iterdir()
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    return folder, sorted(p.name for p in folder.glob("events.out.tfevents.*")), events.Reload()


def steps_of(events, tag) -> list[int]:
    return [e.step for e in events.Scalars(tag)]


def text(events, tag) -> str:
    (event,) = events.Tensors(f"{tag}/text_summary")
    return event.tensor_proto.string_val[0].decode()


def the_run(client):
    """The one MLflow run HF's MLflowCallback opened."""
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


@pytest.mark.parametrize("steps, observed", [(None, [0, 1, 2, 3, 4]), (3, [0, 2, 4])])
def test_the_orphan_lands_in_tensorboard_and_mlflow_at_the_trainers_steps(
        tmp_path, store, said, steps, observed):
    callback = DiagkitCallback(steps=steps, every=2)
    trainer = train(tmp_path, callback)
    diagnosis = callback.diagnosis
    assert sorted(set(int(s) for s in diagnosis.steps["step"])) == observed
    (orphan,) = [f for f in diagnosis.findings if f.code == "orphan"]
    assert orphan.module == "score" and FIX in orphan.fix
    # HF's own series: state.global_step after each step (1..6)
    ours = [s + 1 for s in observed]  # diagkit's step s is the Trainer's step s + 1

    folder, files, events = board(tmp_path)
    assert steps_of(events, "train/loss") == [1, 2, 3, 4, 5, 6]
    series = steps_of(events, "diagkit/errors")
    assert series[:len(ours)] == ours and set(series) <= {1, 2, 3, 4, 5, 6}
    assert text(events, "diagkit/status") == "error"
    table = text(events, "diagkit/findings")
    row = next(line for line in table.splitlines() if "| orphan |" in line)
    assert row.startswith("| score.weight | orphan | error | score |") and FIX in row
    # one event file: diagkit wrote into HF's writer before HF closed it (not into a new one)
    assert len(files) == 1, files

    run = the_run(store)
    assert run.info.status == "FINISHED" and run.data.tags["diagkit/status"] == "error"
    history = store.get_metric_history(run.info.run_id, "diagkit/errors")
    loss = [m.step for m in store.get_metric_history(run.info.run_id, "loss")]
    assert loss == [1, 2, 3, 4, 5, 6]
    assert [m.step for m in history][:len(ours)] == ours
    assert {m.step for m in history} <= set(loss) and history[-1].value == 1.0
    # every value reached the run before HF's MLflowCallback ended it
    assert max(m.timestamp for m in history) <= run.info.end_time
    rows = json.loads((tmp_path / "mlruns").joinpath(
        run.info.experiment_id, run.info.run_id, "artifacts", "diagkit",
        "findings_table.json").read_text())
    found = dict(zip(rows["columns"], next(r for r in rows["data"] if r[1] == "orphan")))
    assert found["name"] == "score.weight" and FIX in found["fix"]
    assert not any("diagkit/" in k for log in trainer.state.log_history for k in log)
    assert said == []
    # diagkit's callback is back where the user put it (after HF's trackers)
    names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert names == ["DefaultFlowCallback", "TensorBoardCallback", "MLflowCallback",
                     "DiagkitCallback", "PrinterCallback"]


def test_report_to_none_sends_nothing_and_a_word_narrows_the_trainers(tmp_path, store):
    """The callback's `report_to` overrides `args.report_to`: "none" sends nothing; "mlflow"
    only to MLflow (HF's TensorBoard file holds none of diagkit's values)."""
    train(tmp_path / "none", DiagkitCallback(steps=2, report_to="none"))
    assert "diagkit/errors" not in board(tmp_path / "none")[2].Tags()["scalars"]
    assert "diagkit/status" not in the_run(store).data.tags

    train(tmp_path / "one", DiagkitCallback(steps=2, report_to="mlflow"))
    assert "diagkit/errors" not in board(tmp_path / "one")[2].Tags()["scalars"]
    runs = store.search_runs([e.experiment_id for e in store.search_experiments()])
    assert sorted(str(r.data.tags.get("diagkit/status")) for r in runs) == ["None", "error"]


def test_a_failing_tracker_and_one_without_a_run_are_each_one_line(tmp_path, store, said):
    """An MLflow run that does not exist (each write raises) and W&B without a run open: one
    line each; training runs to its end, and TensorBoard and HF's own MLflow run get
    everything."""
    missing = (store, "0" * 32)  # a (client, run id) pair whose run is not in the store
    callback = DiagkitCallback(steps=None, every=2, report_to=["tensorboard", missing, "wandb"])
    trainer = train(tmp_path, callback)
    assert trainer.state.global_step == 6 and callback.watch.done
    assert len(said) == 2, said
    assert said[0].startswith("diagkit: report_to 'wandb': no W&B run is open")
    assert said[1].startswith("diagkit: could not send to mlflow: MlflowException: Run ")
    assert said[1].endswith("(the run goes on; diagkit stops sending to it)")
    events = board(tmp_path)[2]
    assert steps_of(events, "diagkit/errors")[:5] == [1, 2, 3, 4, 5]
    assert text(events, "diagkit/status") == "error"
    run = the_run(store)  # HF's own: the callback's report_to left it out
    assert run.info.status == "FINISHED" and "diagkit/status" not in run.data.tags


def test_a_process_other_than_the_main_one_opens_no_tracker(tmp_path):
    """The code path of a rank other than 0 (`main_process=False`): its watch gets no
    trackers, even when `report_to` names one, and writes no event file. (Under a process
    group the watch leaves them to rank 0 too: `Watch._begin`.)"""
    from diagkit.integrations._tracking import context
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    run = Attachment({"steps": 2, "report_to": "tensorboard", "out": None})
    tracking = context(["tensorboard"], framework="transformers", after=1, out=None,
                       say=print, tensorboard_dir=str(tmp_path / "tb"))
    watch = run.start(model, opt, main_process=False, say=print, tracking=tracking)
    assert watch is not None and watch.trackers is None
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    run.stop()
    assert watch.done and not (tmp_path / "tb").exists()

    main = Attachment({"steps": 2, "out": None})
    watch = main.start(model, opt, main_process=True, say=print, tracking=tracking)
    assert watch.trackers is not None  # the same on the main process: it sends
    main.stop()
