"""W&B and Trackio under a framework (docs/integrations.md, "Trackers", "Under a Hugging Face
`Trainer` or Lightning"): the real HF `Trainer` with `report_to=["wandb"]` (W&B offline, the run
file read back) and `report_to=["trackio"]` (a local Trackio store, in a process of its own), and
Lightning with a `WandbLogger(offline=True)`. The orphan of tests/integrations/
test_trackers_transformers.py (the head `score` left out of the optimizer) is watched for the
whole run: diagkit's series lands at the Trainer's own steps, its end (status, table) lands before
HF's tracker callbacks end their runs, its one alert is there, and the Trainer's own rows carry
none of diagkit's keys.

Nothing leaves the machine: W&B offline with every folder in the module's temporary folder (its
service ended at the module's end), Trackio with `TRACKIO_DIR` there, no Space, Hugging Face
offline (tests/helpers/tracker_readers.py has the settings and the readers).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest

from integration_helpers import Sequences, observed_steps, tiny_classifier, training_args
from tracker_readers import (diagkit_rows, read_back, trackio_read, trackio_script_stored,
                             wandb_offline, wandb_table)

HERE = Path(__file__).resolve()
PROJECT = "diagkit-tests"
ORPHAN_ALERT = ("diagkit: orphan in score",  # diagkit's step 0 is the Trainer's step 1
                "diagkit: error: orphan in score (1 tensor) from step 1; fix: "
                "for p in [trainer.model.score.weight]: p.requires_grad_(False)")
COLUMNS = ["name", "verdict", "severity", "module", "bytes", "from_step", "fix"]
needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="wandb is not installed")
needs_trackio = pytest.mark.skipif(importlib.util.find_spec("trackio") is None,
                                   reason="trackio is not installed")


def train_hf(output, **args):
    """The orphan's Trainer for 6 steps, every step logged, watched for the whole run; the
    trainer, the callback and what diagkit said through transformers' logger."""
    from diagkit.integrations.transformers import DiagkitCallback
    from integration_helpers import head_left_out_trainer
    HeadLeftOut = head_left_out_trainer()
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("transformers.integrations.diagkit")
    logger.addHandler(handler)
    try:
        callback = DiagkitCallback(steps=None)
        trainer = HeadLeftOut(model=tiny_classifier(), train_dataset=Sequences(),
                              callbacks=[callback],
                              args=training_args(output, max_steps=6, logging_strategy="steps",
                                                 logging_steps=1, **args))
        trainer.train()
    finally:
        logger.removeHandler(handler)
    return trainer, callback, said


def what_the_trainer_did(trainer, callback, said) -> dict:
    """What the tests judge besides the tracker: diagkit's own view and the Trainer's."""
    return {"observed": observed_steps(callback.diagnosis),
            "findings": sorted([f.code, f.module] for f in callback.diagnosis.findings),
            "logged_keys": sorted({k for log in trainer.state.log_history for k in log}),
            "callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks],
            "said": said}


# ------------------------------------------------------------------------------------- W&B
@pytest.fixture(scope="module")
def wandb(tmp_path_factory):
    """W&B offline, every folder under this module's temporary folder; its service ended at
    the end (the suite fails on a process left behind)."""
    wandb = pytest.importorskip("wandb")
    with pytest.MonkeyPatch.context() as mp:
        wandb_offline(mp, tmp_path_factory.mktemp("wandb"))
        mp.setenv("WANDB_PROJECT", PROJECT)  # HF's WandbCallback's project
        yield wandb
        if wandb.run is not None:
            wandb.run.finish()
        wandb.teardown()


@pytest.fixture(scope="module")
def hf_wandb(wandb, tmp_path_factory) -> dict:
    """The Trainer with `report_to=["wandb"]`: HF's WandbCallback opens the run, diagkit sends
    to it; the run read back once finished."""
    trainer, callback, said = train_hf(tmp_path_factory.mktemp("hf-wandb"), report_to=["wandb"])
    run = wandb.run
    left_open = run is not None  # HF leaves its run open at the end; diagkit too
    run.finish()
    return {**what_the_trainer_did(trainer, callback, said), "left_open": left_open,
            **read_back(run)}


@pytest.fixture(scope="module")
def lightning_wandb(wandb, tmp_path_factory) -> dict:
    """Lightning with a `WandbLogger(offline=True)` (its run opened as the fit starts)."""
    L = pytest.importorskip("lightning.pytorch")
    from diagkit.integrations.lightning import DiagkitCallback
    from lightning_runs import fit
    folder = tmp_path_factory.mktemp("lightning-wandb")
    logger = L.loggers.WandbLogger(offline=True, save_dir=str(folder), project=PROJECT)
    callback = DiagkitCallback(steps=None)
    trainer = fit(folder, callback, [logger])
    run = logger.experiment
    run.finish()
    return {"observed": observed_steps(callback.diagnosis), "global_step": trainer.global_step,
            **read_back(run)}


@needs_wandb
def test_the_trainers_wandb_run_gets_the_series_at_its_steps_the_end_and_one_alert(hf_wandb):
    got = hf_wandb
    assert got["findings"] == [["orphan", "score"]] and got["said"] == []
    assert got["observed"] == [0, 1, 2, 3, 4, 5]
    theirs = [h for h in got["history"] if "train/loss" in h]  # HF's WandbCallback's rows
    assert [h["train/global_step"] for h in theirs] == [1, 2, 3, 4, 5, 6]
    # the same step (docs "Steps"): diagkit's point for an optimizer step carries the
    # Trainer's own train/global_step of that step (diagkit's step + 1)
    series = diagkit_rows(got["history"])
    assert [step for step, _, _ in series] == [s + 1 for s in got["observed"]]
    assert {step for step, _, _ in series} <= {h["train/global_step"] for h in theirs}
    assert {(errors, warnings) for _, errors, warnings in series} == {(1, 0)}
    assert ("diagkit/*", "diagkit/step") in got["metric"]
    summary = got["summary"]  # diagkit's end reached the run (HF leaves it open: so do we)
    assert got["left_open"]
    assert (summary["diagkit/errors"], summary["diagkit/warnings"],
            summary["diagkit/status"]) == (1, 0, "error")
    table = wandb_table(got)
    assert table["columns"] == COLUMNS
    (row,) = table["data"]
    assert row[:6] == ["score.weight", "orphan", "error", "score", 128, 1]
    assert "p.requires_grad_(False)" in row[6]
    assert got["alert"] == [(*ORPHAN_ALERT, "ERROR")]
    # nothing of the old counts through Trainer.log: the Trainer's rows carry no diagkit key
    assert not [k for h in theirs for k in h if k.startswith("diagkit/")]
    assert not [k for k in got["logged_keys"] if "diagkit" in k]
    assert got["callbacks"] == ["DefaultFlowCallback", "WandbCallback", "DiagkitCallback",
                                "PrinterCallback"]  # back where the user put it


@needs_wandb
def test_a_wandb_loggers_run_gets_the_series_at_lightnings_steps(lightning_wandb):
    got = lightning_wandb
    assert got["global_step"] == 6 and got["observed"] == [0, 1, 2, 3, 4, 5]
    theirs = [h for h in got["history"] if "loss" in h]  # Lightning's: the step before it
    assert [h["trainer/global_step"] for h in theirs] == [0, 1, 2, 3, 4, 5]
    series = diagkit_rows(got["history"])
    assert [step for step, _, _ in series] == got["observed"]
    assert not [k for h in theirs for k in h if k.startswith("diagkit/")]
    assert got["summary"]["diagkit/status"] == "error"
    # Lightning clears only what its optimizer holds: the orphan's .grad is never cleared
    assert [r[:3] for r in wandb_table(got)["data"]] == [
        ["head.weight", "orphan", "error"], ["head.bias", "orphan", "error"],
        ["head.weight", "grad_not_cleared", "warning"],
        ["head.bias", "grad_not_cleared", "warning"]]
    assert sorted((title, level) for title, _, level in got["alert"]) == [
        ("diagkit: grad_not_cleared in head", "WARN"), ("diagkit: orphan in head", "ERROR")]


@needs_wandb
@pytest.mark.parametrize("framework, step_key", [("hf", "train/global_step"),
                                                 ("lightning", "trainer/global_step")])
def test_wandb_plots_the_series_against_diagkits_step(framework, step_key, request):
    got = request.getfixturevalue(f"{framework}_wandb")
    rows = [h for h in got["history"] if "diagkit/errors" in h]
    assert rows and [h.get(step_key, h["diagkit/step"]) for h in rows] == \
        [h["diagkit/step"] for h in rows]


# ----------------------------------------------------------------------------------- Trackio
@pytest.fixture(scope="module")
def hf_trackio(tmp_path_factory) -> dict:
    """The Trainer with `report_to=["trackio"]`, in a process of its own (this file as a
    script, below: Trackio reads `TRACKIO_DIR` as it is imported); what it read back."""
    folder = tmp_path_factory.mktemp("hf-trackio")
    return trackio_script_stored(HERE, folder, timeout=240)


@needs_trackio
def test_the_trainers_trackio_run_gets_the_series_at_its_steps_the_end_and_one_alert(
        hf_trackio):
    got = hf_trackio
    assert got["findings"] == [["orphan", "score"]] and got["said"] == []
    assert got["observed"] == [0, 1, 2, 3, 4, 5]
    assert got["current_run_after"] is None  # HF's TrackioCallback finished its run
    theirs = [r for r in got["logs"] if "train/loss" in r]
    assert [r["train/global_step"] for r in theirs] == [1, 2, 3, 4, 5, 6]
    points = [r for r in got["logs"] if "diagkit/errors" in r and "diagkit/status" not in r]
    series = [(r["diagkit/step"], r["diagkit/errors"], r["diagkit/warnings"]) for r in points]
    assert series == [(s + 1, 1.0, 0.0) for s in got["observed"]]  # the Trainer's steps
    # the end, sent before HF's on_train_end called trackio.finish(): the status row and the
    # table at the last step sent
    last = max(r["step"] for r in points)
    (status,) = [r for r in got["logs"] if "diagkit/status" in r]
    assert status == {"step": last, "diagkit/errors": 1, "diagkit/warnings": 0,
                      "diagkit/status": "error"}
    (table,) = [r for r in got["logs"] if "diagkit/findings" in r]
    assert table["step"] == last and table["diagkit/findings"]["_type"] == "trackio.table"
    (row,) = table["diagkit/findings"]["_value"]
    assert [row[c] for c in COLUMNS[:6]] == ["score.weight", "orphan", "error", "score", 128, 1]
    assert "p.requires_grad_(False)" in row["fix"]
    assert got["alerts"] == [{"title": ORPHAN_ALERT[0], "text": ORPHAN_ALERT[1],
                              "level": "error", "step": 1}]
    assert not [k for r in theirs for k in r if k.startswith("diagkit/")]
    assert not [k for k in got["logged_keys"] if "diagkit" in k]
    assert got["callbacks"] == ["DefaultFlowCallback", "TrackioCallback", "DiagkitCallback",
                                "PrinterCallback"]


@needs_trackio
def test_diagkit_leaves_the_trainers_own_trackio_numbering_as_it_was(hf_trackio):
    """HF's TrackioCallback logs without `step=`: Trackio numbers the Trainer's rows by its own
    counter. diagkit's points never move that counter on (docs/integrations.md, "Trackio"), so
    the Trainer's rows stay at 0, 1, 2, ... and diagkit's sit among them."""
    theirs = [r["step"] for r in hf_trackio["logs"] if "train/loss" in r]
    assert theirs == list(range(len(theirs)))
    rows = [r["step"] for r in hf_trackio["logs"] if not any(k.startswith("diagkit/") for k in r)]
    points = [r["step"] for r in hf_trackio["logs"]
              if "diagkit/errors" in r and "diagkit/status" not in r]
    assert points and max(points) <= max(rows)  # never past a step the Trainer used


# ------------------------------------------------------------------ the trackio side (a script)
def main(folder: Path) -> None:
    """The Trainer reporting to Trackio (HF's TrackioCallback opens a local run: no Space, no
    static Space); what the store holds -> stored.json."""
    import trackio
    trainer, callback, said = train_hf(folder, report_to=["trackio"],
                                       project=PROJECT, run_name="hf",
                                       trackio_static_space_id=False)
    out = {**what_the_trainer_did(trainer, callback, said), **trackio_read(PROJECT, "hf"),
           "current_run_after": trackio.context_vars.current_run.get()}
    (folder / "stored.json").write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
