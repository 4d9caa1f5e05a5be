"""Under the callbacks a fix names the model and the optimizer as a notebook reaches them after
training: `trainer.model` and `trainer.optimizer` (Hugging Face), `trainer.lightning_module` and
`trainer.optimizers[0]` (Lightning); the code, run as it is beside the trainer, does what it
says."""

from __future__ import annotations

import pytest
import torch

from diagkit.core import fixtext
from integration_helpers import Sequences, dead_head_module, tiny_classifier, training_args


def test_hugging_face_trainer_names_trainer_model_and_trainer_optimizer(tmp_path):
    pytest.importorskip("transformers")
    from transformers import Trainer

    from diagkit.integrations.transformers import DiagkitCallback
    model = tiny_classifier()
    model.model.embed_tokens.weight.requires_grad_(False)  # frozen, yet handed to the optimizer
    callback = DiagkitCallback(steps=2)
    trainer = Trainer(model=model, args=training_args(tmp_path, max_steps=3),
                      train_dataset=Sequences(), callbacks=[callback],
                      optimizers=(torch.optim.AdamW(model.parameters(), lr=1e-3), None))
    trainer.train()
    diag = callback.diagnosis
    assert diag.meta["names"] == {"model": "trainer.model", "optimizers": ["trainer.optimizer"]}
    (frozen,) = [f for f in diag.findings if f.code == "frozen_in_optimizer"]
    code = fixtext.first_code(frozen.fix)
    assert code.startswith("for g in trainer.optimizer.param_groups: ")
    exec(code, {"trainer": trainer})  # noqa: S102 - pasted beside the trainer
    held = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert not any(p is model.model.embed_tokens.weight for p in held)


def test_lightning_names_the_lightning_module(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from diagkit.integrations.lightning import DiagkitCallback

    torch.manual_seed(0)
    callback = DiagkitCallback(steps=2)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[callback])
    data = torch.utils.data.TensorDataset(torch.randn(16, 4))
    trainer.fit(dead_head_module(L), torch.utils.data.DataLoader(data, batch_size=4))
    diag = callback.diagnosis
    assert diag.meta["names"] == {"model": "trainer.lightning_module",
                                  "optimizers": ["trainer.optimizers[0]"]}
    (unused,) = [f for f in diag.findings if f.code == "unused"]
    code = fixtext.first_code(unused.fix)
    assert code.splitlines() == [
        "for p in trainer.lightning_module.dead.parameters(): p.requires_grad_(False)",
        'for g in trainer.optimizers[0].param_groups: g["params"] = '
        '[p for p in g["params"] if p.requires_grad]']
    exec(code, {"trainer": trainer})  # noqa: S102
    assert all(p.requires_grad for g in trainer.optimizers[0].param_groups for p in g["params"])
