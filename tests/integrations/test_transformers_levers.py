"""Under a real HF `Trainer`, an orphan's finding names what decided the optimizer's groups and
the user's lever (the docs' "Where the optimizer was built (`Finding.source`)"): the
`optimizers=` argument with the user's lines that built it, or the Trainer's own
`create_optimizer` with what was seen of the tensor when it built its groups (frozen then, not
in the model then, or neither). Tiny random models from configs, the CPU, no network."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from integration_helpers import Sequences, tiny_classifier, training_args

transformers = pytest.importorskip("transformers")
from transformers import Trainer, TrainerCallback  # noqa: E402

from diagkit.integrations.transformers import DiagkitCallback  # noqa: E402
from diagkit.present.source import short_path, source_label  # noqa: E402

HERE = Path(__file__).name


def line_of(mark: str) -> int:
    """The line of this file that carries `mark` (a comment), for file:line in the fixes."""
    lines = Path(__file__).read_text().splitlines()
    (found,) = [i for i, line in enumerate(lines, 1) if line.rstrip().endswith(mark)]
    return found


def train(tmp_path, model, *callbacks, steps=3, **trainer_kwargs) -> list:
    """The findings of a DiagkitCallback(steps=steps) over a 3-step `train()`."""
    callback = DiagkitCallback(steps=steps)
    Trainer(model=model, args=training_args(tmp_path, max_steps=3), train_dataset=Sequences(),
            callbacks=[*callbacks, callback], **trainer_kwargs).train()
    return callback.diagnosis.findings


def the_orphan(findings):
    (orphan,) = [f for f in findings if f.code == "orphan"]
    assert orphan.params == ("score.weight",)
    return orphan


def body_only(model) -> torch.optim.Optimizer:
    """The user's helper: a name filter that misses the head (`score`)."""
    body = [p for n, p in model.named_parameters() if n.startswith("model.")]  # MARK-filter
    return torch.optim.AdamW([{"params": body, "weight_decay": 0.0}], lr=1e-3)  # MARK-built


def test_a_handed_optimizer_names_optimizers_and_the_helper_that_built_it(tmp_path):
    model, callback = tiny_classifier(), DiagkitCallback(steps=2)
    Trainer(model=model, args=training_args(tmp_path, max_steps=3), train_dataset=Sequences(),
            callbacks=[callback],
            optimizers=(body_only(model), None)).train()  # MARK-handed-call
    orphan = the_orphan(callback.diagnosis.findings)
    at = f"{HERE}:{line_of('MARK-handed-call')}"
    assert f"handed as `Trainer(optimizers=...)` ({at}) and builds none" in orphan.message
    assert orphan.fix.startswith("Put it in the optimizer you pass as `Trainer(optimizers="
                                 f"(optimizer, scheduler))` ({at}), built at {HERE}:"
                                 f"{line_of('MARK-built')}: include [model.score.weight]")
    (source,) = orphan.source  # the helper's group, its name filter first
    assert source["file"] == __file__ and source["how"] == "assigned"
    assert source["lines"][0].endswith("# MARK-filter") and source["lever"] == "optimizers"
    assert "add_param_group" not in orphan.fix


def test_a_handed_optimizer_assigned_first_shows_that_assignment(tmp_path):
    model = tiny_classifier()
    opt = torch.optim.SGD([p for n, p in model.named_parameters()
                           if not n.startswith("score")], lr=0.1)  # MARK-assigned
    handed = (opt, None)  # a name for the pair is followed too
    callback = DiagkitCallback(steps=2)
    Trainer(model=model, args=training_args(tmp_path, max_steps=3), train_dataset=Sequences(),
            callbacks=[callback], optimizers=handed).train()
    orphan = the_orphan(callback.diagnosis.findings)
    (source,) = orphan.source
    assert source["how"] == "call" and source["class"] == "SGD"
    assert source["lines"][-1].endswith("# MARK-assigned")
    assert source_label(source).endswith(f"built at {short_path(__file__)}:"
                                         f"{line_of('MARK-assigned') - 1}")


def test_a_handed_optimizer_from_code_that_cannot_be_read_still_names_the_argument(tmp_path):
    """`Trainer(...)` run from a string: no lines to show, only the lever, said without a
    location (never a wrong one)."""
    model = tiny_classifier()
    code = ("Trainer(model=model, args=args, train_dataset=Sequences(), callbacks=[callback],"
            " optimizers=(body_only(model), None)).train()")
    callback = DiagkitCallback(steps=2)
    exec(code, {**globals(), "model": model, "callback": callback,  # noqa: S102
                "args": training_args(tmp_path, max_steps=3)})
    orphan = the_orphan(callback.diagnosis.findings)
    assert "handed as `Trainer(optimizers=...)` and builds none" in orphan.message
    assert orphan.fix.startswith("Put it in the optimizer you pass as `Trainer(optimizers="
                                 "(optimizer, scheduler))`: include")
    assert source_label(orphan.source[0]) == (
        "optimizer 0 group 0 (AdamW), handed to Trainer(optimizers=...)")


class UnfreezeAtStep1(TrainerCallback):
    """A hand-written staged unfreeze: the head becomes trainable at step 1."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 1:
            model.score.weight.requires_grad_(True)


def test_the_trainers_own_optimizer_and_a_tensor_frozen_when_it_was_built(tmp_path):
    model = tiny_classifier()
    model.score.weight.requires_grad_(False)
    model.model.embed_tokens.weight.requires_grad_(False)  # stays frozen: not the finding's
    orphan = the_orphan(train(tmp_path, model, UnfreezeAtStep1()))
    assert ("The optimizer is the Trainer's own: its `create_optimizer` (trainer.py:"
            in orphan.message)
    assert ("built it as `train()` began, and never again: the parameters of `trainer.model` "
            "that required grad at that moment, in two groups (weight decay for the names "
            "`get_decay_parameter_names` returns, none for the rest: biases and norms). When "
            "they were built, it did not require grad. A tensor unfrozen later does not join "
            "them.") in orphan.message
    assert orphan.fix.startswith("Make it trainable before trainer.train().\nOr give the "
                                 "Trainer groups that hold it from the start")
    assert "optimizers=(torch.optim.AdamW(model.parameters()" in orphan.fix
    assert "override `Trainer.create_optimizer`" in orphan.fix
    decay, no_decay = orphan.source  # the Trainer's rule, its two groups' own lines
    assert [s["how"] for s in orphan.source] == ["trainer", "trainer"]
    assert "n in decay_parameters and p.requires_grad" in "".join(decay["lines"])
    assert "n not in decay_parameters and p.requires_grad" in "".join(no_decay["lines"])
    assert decay["rule"] is True and decay["frozen_then"] == ["score.weight"]  # its own only
    assert source_label(decay).startswith(
        "optimizer 0 group 0 (AdamW), built by the Trainer's create_optimizer at ")


class ReplaceHead(TrainerCallback):
    """A new head put in as training begins (before diagkit's callback) or at step 1."""

    def __init__(self, at_step=None):
        self.at_step = at_step

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.at_step is None:
            model.score = nn.Linear(16, 2, bias=False)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.at_step:
            model.score = nn.Linear(16, 2, bias=False)


def test_a_head_attached_after_the_trainer_built_its_optimizer(tmp_path):
    orphan = the_orphan(train(tmp_path, tiny_classifier(), ReplaceHead()))
    assert ("When they were built, it was not a parameter of the model they were built from."
            in orphan.message)
    assert orphan.fix.startswith("Attach it to the model before trainer.train().\nOr give the "
                                 "Trainer groups that hold it: pass `Trainer(..., optimizers="
                                 "(optimizer, None))` with an optimizer built after it was "
                                 "attached")


def test_a_head_replaced_during_a_whole_run(tmp_path):
    """The whole run sees the replacement; its windows' findings carry the sources too."""
    findings = train(tmp_path, tiny_classifier(), ReplaceHead(at_step=1), steps=None)
    orphan = the_orphan(findings)
    assert ("When they were built, a tensor by this name required grad and went into them: "
            "this one was put in its place afterwards, or the groups were changed."
            in orphan.message)
    assert orphan.fix.startswith('Put the new tensor in the optimizer as you put it in the '
                                 'model. Add it to the optimizer group that fits it (group 0: ')
    assert ('\n    trainer.optimizer.param_groups[0]["params"].append(trainer.model.score.weight)'
            '\n') in orphan.fix


def test_groups_not_by_the_trainers_rule_say_which_setting_chose_them(tmp_path):
    """`params` passed through `optimizer_cls_and_kwargs` replace the Trainer's groups inside
    its own `create_optimizer`: seen as it returns (the rule does not hold)."""
    model = tiny_classifier()
    body = [p for n, p in model.named_parameters() if n.startswith("model.")]
    orphan = the_orphan(train(tmp_path, model, optimizer_cls_and_kwargs=(
        torch.optim.AdamW, {"params": body, "lr": 1e-3})))
    assert ("not by its default rule (every parameter of `trainer.model` that requires grad): "
            "`Trainer(optimizer_cls_and_kwargs=...)` chose them." in orphan.message)
    assert orphan.fix.startswith("Give the Trainer groups that hold it: pass `Trainer(..., "
                                 "optimizers=(optimizer, None))`, or override")
    assert orphan.source[0]["rule"] is False


def test_an_override_that_calls_the_trainers_create_optimizer_is_the_lever(tmp_path):
    """The Trainer's own construction inside the user's override (`super()`): the override is
    named, and nothing is claimed of the Trainer's rule (checked only as the override
    returned, after it changed requires_grad back)."""

    class FreezesTheHeadWhileBuilding(Trainer):
        def create_optimizer(self, model=None):
            self.model.score.weight.requires_grad_(False)
            built = super().create_optimizer(model)  # MARK-super
            self.model.score.weight.requires_grad_(True)
            return built

    callback = DiagkitCallback(steps=2)
    FreezesTheHeadWhileBuilding(model=tiny_classifier(), args=training_args(tmp_path, max_steps=3),
                                train_dataset=Sequences(), callbacks=[callback]).train()
    orphan = the_orphan(callback.diagnosis.findings)
    mine = f"{HERE}:{line_of('MARK-super')}"
    assert f"called from your `create_optimizer` ({mine})." in orphan.message
    assert orphan.fix.startswith(f"Put it in the optimizer your `create_optimizer` ({mine}) "
                                 "returns")
    assert "rule" not in orphan.message and orphan.source[0]["rule"] is None
    # the override's code names the model self.model
    assert 'self.optimizer.add_param_group({"params": [self.model.score.weight]})' in orphan.fix
