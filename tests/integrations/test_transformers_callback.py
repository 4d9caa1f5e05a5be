"""`diagkit.integrations.transformers.DiagkitCallback` on a real Hugging Face `Trainer`: it
watches the optimizer the Trainer built or was given (through accelerate's wrapper), counts
optimizer steps (not accumulation micro-batches), leaves no hook behind, and fails on a bad
option as it is built."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

import diagkit
from integration_helpers import (NO_HOOKS, Sequences, hooks_left, observed_steps,
                                 tiny_classifier, training_args)

transformers = pytest.importorskip("transformers")
from transformers import Trainer, TrainerState  # noqa: E402

from diagkit.integrations.transformers import DiagkitCallback  # noqa: E402


def head_left_out(model) -> torch.optim.Optimizer:
    """A name filter that misses the head (`score`): an orphan."""
    return torch.optim.AdamW([p for n, p in model.named_parameters() if n.startswith("model.")],
                             lr=1e-3, weight_decay=0.0)


def test_the_trainers_own_optimizer_with_accumulation_and_clipping(tmp_path):
    model = tiny_classifier()
    callback = DiagkitCallback(steps=50, out=tmp_path / "diag")
    trainer = Trainer(model=model, args=training_args(tmp_path, gradient_accumulation_steps=3,
                                                      max_grad_norm=0.5),
                      train_dataset=Sequences(), callbacks=[callback])
    trainer.train()
    assert type(trainer.optimizer).__name__ == "AcceleratedOptimizer"
    # ended by the end of training (reading `diagnosis` would end it too: not yet)
    assert callback.watch.done and hooks_left(model, [trainer.optimizer]) == NO_HOOKS
    diag = callback.diagnosis
    # one step per optimizer step: 4, not the 12 micro-batches
    assert trainer.state.global_step == 4
    assert observed_steps(diag) == [0, 1, 2, 3] and diag.meta["optimizer_steps"] == 4
    assert set().union(*diag.verdicts().values()) == {"ok"}
    assert diagkit.load(tmp_path / "diag").verdicts() == diag.verdicts()


def test_an_orphan_is_just_orphan_because_the_trainer_zeroes_the_model(tmp_path):
    model = tiny_classifier()
    callback = DiagkitCallback(steps=3)
    trainer = Trainer(model=model, args=training_args(tmp_path, max_steps=5,
                                                      gradient_accumulation_steps=2),
                      train_dataset=Sequences(), optimizers=(head_left_out(model), None),
                      callbacks=[callback])
    trainer.train()
    assert callback.watch.done and hooks_left(model, [trainer.optimizer]) == NO_HOOKS
    verdicts = callback.diagnosis.verdicts()
    assert verdicts.pop("score.weight") == {"orphan"}
    assert set().union(*verdicts.values()) == {"ok"}
    # detached by itself after 3 steps; training went on
    assert callback.diagnosis.meta["optimizer_steps"] == 3 and trainer.state.global_step == 5


def test_a_second_train_call_gets_a_new_watch(tmp_path):
    model = tiny_classifier()
    callback = DiagkitCallback(steps=50, out=tmp_path / "diag")
    trainer = Trainer(model=model, args=training_args(tmp_path, max_steps=2),
                      train_dataset=Sequences(), callbacks=[callback])
    trainer.train()
    first = callback.watch
    trainer.train()
    assert callback.watch is not first and first.done and callback.watch.done
    assert callback.diagnosis.meta["optimizer_steps"] == 2
    assert hooks_left(model, [trainer.optimizer]) == NO_HOOKS


def test_after_a_train_that_raises_reading_the_diagnosis_ends_the_watch(tmp_path):
    class Broken(Sequences):
        calls = 0

        def __getitem__(self, i):
            Broken.calls += 1
            if Broken.calls == 17:  # in the 5th batch of 4
                raise RuntimeError("a corrupt sample")
            return super().__getitem__(i)

    model = tiny_classifier()
    callback = DiagkitCallback(steps=50)
    trainer = Trainer(model=model, args=training_args(tmp_path, max_steps=8,
                                                      dataloader_drop_last=True),
                      train_dataset=Broken(n=32), callbacks=[callback])
    with pytest.raises(RuntimeError, match="a corrupt sample"):
        trainer.train()
    assert not callback.watch.done  # the Trainer said nothing
    completed = trainer.state.global_step  # the optimizer steps before the error
    assert completed >= 2 and observed_steps(callback.diagnosis) == list(range(completed))
    assert callback.watch.done and hooks_left(model, [trainer.optimizer]) == NO_HOOKS


def test_only_the_main_process_writes(tmp_path):
    """Without a process group, a process that is not world process zero gets no `out`."""
    model = tiny_classifier()
    opt = head_left_out(model)
    callback = DiagkitCallback(steps=1, out=tmp_path / "diag")
    state = TrainerState(is_world_process_zero=False)
    callback.on_train_begin(None, state, None, model=model, optimizer=opt)
    batch = Sequences()[0]
    model.zero_grad()
    loss = model(input_ids=batch["input_ids"][None], labels=torch.tensor([batch["labels"]])).loss
    loss.backward()
    opt.step()
    assert callback.watch.done and callback.diagnosis.verdicts()["score.weight"] == {"orphan"}
    assert not (tmp_path / "diag").exists()


@pytest.mark.parametrize("options, message", [
    ({"steps": 0}, "steps must be a positive int"),
    ({"delta": "fast"}, "delta must be one of exact, sampled, off"),
    ({"every": True}, "every must be a positive int"),
    ({"stpes": 3}, "unknown option 'stpes'; diagkit.watch takes steps, every, delta"),
])
def test_a_bad_option_fails_as_the_callback_is_built(options, message):
    with pytest.raises(diagkit.DiagkitError, match=message) as err:
        DiagkitCallback(**options)
    assert "\n" not in str(err.value)


def test_an_out_diagkit_may_not_replace_fails_as_the_callback_is_built(tmp_path):
    (tmp_path / "mine.txt").write_text("not diagkit's")
    with pytest.raises(diagkit.DiagkitError, match="non-empty folder that diagkit did not write"):
        DiagkitCallback(out=tmp_path)


def test_without_transformers_the_import_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what an absent package looks like
    monkeypatch.delitem(sys.modules, "diagkit.integrations.transformers")
    with pytest.raises(diagkit.DiagkitError, match=r"pip install diagkit\[transformers\]") as err:
        importlib.import_module("diagkit.integrations.transformers")
    assert "\n" not in str(err.value)


def test_an_orphan_points_at_the_users_create_optimizer(tmp_path):
    """A `create_optimizer` the user overrode (the Trainer calls it inside `train()`, after
    `on_init_end`) is the lever the orphan's fix names, with the user's lines as its source;
    the Trainer's own construction (tested above) names none."""

    class HeadLeftOut(Trainer):
        def create_optimizer(self, model=None):
            if self.optimizer is None:
                self.optimizer = head_left_out(self.model)  # MARK-create
            return self.optimizer

    model = tiny_classifier()
    callback = DiagkitCallback(steps=2)
    init = torch.optim.Optimizer.__init__
    trainer = HeadLeftOut(model=model, args=training_args(tmp_path, max_steps=2),
                          train_dataset=Sequences(), callbacks=[callback])
    assert torch.optim.Optimizer.__init__ is init  # noted only while create_optimizer runs
    trainer.train()
    assert "create_optimizer" not in vars(trainer) and torch.optim.Optimizer.__init__ is init
    orphan = next(f for f in callback.diagnosis.findings if f.code == "orphan")
    assert orphan.params == ("score.weight",)
    (source,) = orphan.source  # the helper's lines, called from the user's create_optimizer
    assert source["function"] == "head_left_out" and "n.startswith" in source["lines"][0]
    assert source["callers"][0][0] == "create_optimizer"
    assert "your `create_optimizer` builds (test_transformers_callback.py:" in orphan.fix
    assert "add_param_group" not in orphan.fix
    # written as a Trainer's method names the model: self.model
    assert "include [self.model.score.weight] in the params it passes" in orphan.fix
