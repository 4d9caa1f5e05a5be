"""What diagkit refuses to watch as training begins never stops a real HF `Trainer.train()` or
Lightning `Trainer.fit()`: one line through the framework's logger, and training completes
unwatched (docs/integrations.md, "In a Hugging Face `Trainer`, Lightning or accelerate run").
A bad option is still the user's error, raised as the callback is built.

The refusal is a real one: an optimizer over one flat copy of the model's tensors (the flat
buffers of a wrapper diagkit does not know) trains nothing of the model, so membership
verdicts would all be wrong; `watch` refuses it with a `DiagkitError`, which the callbacks
raised out of training until now."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import diagkit
from integration_helpers import NO_HOOKS, Sequences, hooks_left, tiny_classifier, training_args

REFUSED = "diagkit: not watching this run: DiagkitError: diagkit cannot observe this optimizer"


def flat_optimizer(module) -> torch.optim.Optimizer:
    """SGD over one flat copy of `module`'s trainable tensors, none of the module's own."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters() if p.requires_grad])
    return torch.optim.SGD([nn.Parameter(flat)], lr=0.1)


def test_the_hf_trainer_logs_a_refusal_and_trains_on(tmp_path):
    transformers = pytest.importorskip("transformers")
    from diagkit.integrations.transformers import DiagkitCallback

    model = tiny_classifier()
    callback = DiagkitCallback(steps=3, out=tmp_path / "diag")
    trainer = transformers.Trainer(
        model=model, args=training_args(tmp_path, max_steps=4), train_dataset=Sequences(),
        optimizers=(flat_optimizer(model), None), callbacks=[callback])
    # A handler on the very logger the callback says it through: each line it emits once
    # (through pytest's handler, propagation set by other tests could show a record twice).
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = seen.append
    said = logging.getLogger("transformers.integrations.diagkit")
    said.addHandler(handler)
    try:
        trainer.train()
    finally:
        said.removeHandler(handler)
    assert trainer.state.global_step == 4  # trained to the end
    ours = [r for r in seen if "diagkit" in r.getMessage()]
    assert len(ours) == 1 and ours[0].name.startswith("transformers.")
    assert ours[0].getMessage().startswith(REFUSED) and "\n" not in ours[0].getMessage()
    assert callback.refused.startswith(REFUSED)
    assert callback.watch is None and callback.diagnosis is None
    assert hooks_left(model, [trainer.optimizer]) == NO_HOOKS
    assert not (tmp_path / "diag").exists()


def lightning_module(base):
    class FlatOptimizer(base):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 4)

        def training_step(self, batch, batch_idx):
            return self.body(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return flat_optimizer(self)

    return FlatOptimizer


@pytest.mark.parametrize("package, module", [
    ("lightning.pytorch", "diagkit.integrations.lightning"),
    ("pytorch_lightning", "diagkit.integrations.pytorch_lightning"),
])
def test_lightning_warns_a_refusal_and_fits_on(tmp_path, package, module):
    framework = pytest.importorskip(package)
    callback = pytest.importorskip(module).DiagkitCallback(steps=3)
    torch.manual_seed(0)
    net = lightning_module(framework.LightningModule)()
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=4)
    trainer = framework.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=tmp_path,
                                callbacks=[callback])
    with pytest.warns(UserWarning) as warned:
        trainer.fit(net, data)
    assert trainer.global_step == 4  # fitted to the end
    ours = [str(w.message) for w in warned if "diagkit" in str(w.message)]
    assert len(ours) == 1 and ours[0].startswith(REFUSED) and "\n" not in ours[0]
    assert callback.refused.startswith(REFUSED) and callback.watch is None
    assert hooks_left(net, trainer.optimizers) == NO_HOOKS


def test_a_bad_option_still_fails_as_the_callback_is_built():
    pytest.importorskip("lightning.pytorch")
    from diagkit.integrations.lightning import DiagkitCallback
    with pytest.raises(diagkit.DiagkitError, match="steps must be a positive int"):
        DiagkitCallback(steps=0)
