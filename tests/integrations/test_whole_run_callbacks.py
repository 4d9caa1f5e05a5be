"""The whole-run watch under the real framework trainers (docs/whole-run.md, "The whole run"):
staged unfreezing with Lightning's `BackboneFinetuning` done right (clean, the unfreeze on the
timeline) and by hand forgetting the optimizer (`orphan` from that step), an HF `Trainer` resumed
from a checkpoint (clean, or `orphan` from the resume when the rebuilt optimizer leaves the head
out), new findings counted in Lightning's progress bar, and `halt_on` stopping training
cleanly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from integration_helpers import NO_HOOKS, Sequences, hooks_left, tiny_classifier

L = pytest.importorskip("lightning.pytorch")
transformers = pytest.importorskip("transformers")

from diagkit.integrations.lightning import DiagkitCallback as LightningCallback  # noqa: E402
from diagkit.integrations.transformers import DiagkitCallback as HFCallback  # noqa: E402


class Finetuned(L.LightningModule):
    """A backbone and a head; `forget_at`: the epoch a hand-written unfreeze of the backbone
    happens, without adding it to the optimizer."""

    def __init__(self, forget_at=None):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)
        self.forget_at = forget_at
        if forget_at is not None:
            self.backbone.requires_grad_(False)

    def on_train_epoch_start(self):
        if self.current_epoch == self.forget_at:
            self.backbone.requires_grad_(True)

    def training_step(self, batch, batch_idx):
        return self.head(self.backbone(batch[0])).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


def fit(callbacks, module, tmp_path, **overrides):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g))
    values = dict(max_epochs=4, accelerator="cpu", devices=1, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=tmp_path, callbacks=callbacks)
    values.update(overrides)
    trainer = L.Trainer(**values)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))  # 8 steps an epoch
    return trainer


def test_backbone_finetuning_done_right_is_clean_with_the_unfreeze_on_the_timeline(tmp_path):
    from lightning.pytorch.callbacks import BackboneFinetuning
    watch = LightningCallback(steps=None, every=3)
    module = Finetuned()
    fit([BackboneFinetuning(unfreeze_backbone_at_epoch=2), watch], module, tmp_path)
    diag = watch.diagnosis
    assert diag.worst() in (None, "info"), [f.message for f in diag.findings]
    events = {e["kind"]: e["step"] for e in diag.meta["events"]}
    assert events == {"requires_grad": 16, "optimizer": 16}  # epoch 2 begins at step 16
    assert hooks_left(module, []) == {**NO_HOOKS}


def test_a_hand_written_unfreeze_that_forgets_the_optimizer_is_orphan_from_then(tmp_path):
    watch = LightningCallback(steps=None, every=3)
    trainer = fit([watch], Finetuned(forget_at=2), tmp_path,
                  logger=L.loggers.CSVLogger(tmp_path / "logs"))
    (orphan,) = [f for f in watch.diagnosis.findings if f.code == "orphan"]
    assert (orphan.module, orphan.since, orphan.ended) == ("backbone", 17, None)
    # the windows' findings show where the groups were built, as a watch of steps does
    assert "your `configure_optimizers` builds (test_whole_run_callbacks.py:" in orphan.fix
    assert orphan.source[0]["function"] == "configure_optimizers"
    # the progress bar counts the new findings; a CSV logger is no tracker diagkit sends to
    # (report_to: test_trackers_lightning.py)
    assert trainer.progress_bar_metrics.get("diagkit/errors") == 1.0
    logged = tmp_path / "logs" / "lightning_logs" / "version_0" / "metrics.csv"
    assert not logged.exists()  # the module logs nothing, and diagkit nothing there


def test_halt_on_error_stops_the_fit_cleanly(tmp_path):
    watch = LightningCallback(steps=None, every=3, halt_on="error")
    trainer = fit([watch], Finetuned(forget_at=1), tmp_path)
    # epoch 1 begins at step 8; the burst after it (9-12) is judged at the end of step 12
    assert trainer.global_step == 13 and watch.watch.done
    assert any(f.code == "orphan" for f in watch.diagnosis.findings)


# ----------------------------------------------------------------------------- HF Trainer
def args(tmp_path, **overrides):
    from transformers import TrainingArguments
    values = dict(output_dir=str(tmp_path / "trainer"), max_steps=8,
                  per_device_train_batch_size=4, use_cpu=True, seed=0, report_to=[],
                  save_strategy="steps", save_steps=4, logging_strategy="no",
                  disable_tqdm=True)
    values.update(overrides)
    return TrainingArguments(**values)


class HeadLeftOut(transformers.Trainer):
    """A resume whose rebuilt optimizer comes from a filtered list that misses the head."""

    def create_optimizer(self):
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(
                [p for n, p in self.model.named_parameters() if n.startswith("model.")],
                lr=1e-3, weight_decay=0.0)
        return self.optimizer


class StopAt4(transformers.TrainerCallback):
    """A run of 8 steps stopped after 4 (pre-empted), its checkpoint-4 saved."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 4:
            control.should_training_stop = True


def resumed(tmp_path, trainer_class):
    """Train to step 4 of 8 (a checkpoint), then resume to step 8 with a whole-run watch.
    (A first run of max_steps=4 would end its schedule at lr 0: the resumed steps would
    rightly be `stalled` until the new schedule's lr comes in.)"""
    first = transformers.Trainer(model=tiny_classifier(), args=args(tmp_path),
                                 train_dataset=Sequences(), callbacks=[StopAt4()])
    first.train()
    checkpoint = tmp_path / "trainer" / "checkpoint-4"
    if trainer_class is HeadLeftOut:  # its groups no longer match the saved state's
        (checkpoint / "optimizer.pt").unlink()
    callback = HFCallback(steps=None, every=2)
    trainer = trainer_class(model=tiny_classifier(), args=args(tmp_path),
                            train_dataset=Sequences(), callbacks=[callback])
    trainer.train(resume_from_checkpoint=str(checkpoint))
    return trainer, callback


def test_a_resumed_hf_run_is_clean_and_counts_on_from_the_checkpoint(tmp_path):
    trainer, callback = resumed(tmp_path, transformers.Trainer)
    diag = callback.diagnosis
    assert diag.worst() in (None, "info"), [f.message for f in diag.findings]
    assert min(diag.steps["step"]) == 4 and diag.meta["optimizer_steps"] == 8
    assert not any("diagkit/" in k for log in trainer.state.log_history for k in log)


def test_a_resume_that_rebuilds_the_optimizer_without_the_head_is_orphan_from_it(tmp_path):
    trainer, callback = resumed(tmp_path, HeadLeftOut)
    (orphan,) = [f for f in callback.diagnosis.findings if f.code == "orphan"]
    assert (orphan.module, orphan.since) == ("score", 4)
    assert "your `create_optimizer` builds (test_whole_run_callbacks.py:" in orphan.fix
    # the trackers get diagkit's series through report_to (test_trackers_transformers.py),
    # not through Trainer.log
    assert not any("diagkit/" in k for log in trainer.state.log_history for k in log)


def test_halt_on_error_stops_the_hf_run_cleanly(tmp_path):
    callback = HFCallback(steps=None, every=2, halt_on="error")
    model = tiny_classifier()
    trainer = HeadLeftOut(model=model, args=args(tmp_path, save_strategy="no", max_steps=20),
                          train_dataset=Sequences(), callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 4  # the first burst (0-3) is judged at step 3's end
    assert callback.watch.done and hooks_left(model, [trainer.optimizer]) == NO_HOOKS
