"""The README's HF Trainer, Lightning and accelerate snippets run as written (with the objects
they name built small here) and each finds the planted bug."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import diagkit
from integration_helpers import Sequences, tiny_classifier

SUBSECTION = "### In a Hugging Face `Trainer`, Lightning or accelerate run"


def snippet(marker: str) -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    body = text.split(SUBSECTION, 1)[1].split("\n## ", 1)[0]
    return next(b for b in re.findall(r"```python\n(.*?)```", body, flags=re.S) if marker in b)


def test_the_hf_trainer_snippet(tmp_path, monkeypatch):
    from transformers import Trainer, TrainingArguments
    monkeypatch.chdir(tmp_path)
    model = tiny_classifier()
    model.score.requires_grad_(True)
    args = TrainingArguments(output_dir=str(tmp_path / "t"), max_steps=3, use_cpu=True,
                             per_device_train_batch_size=4, report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)
    optimizer = torch.optim.AdamW([p for n, p in model.named_parameters()
                                   if not n.startswith("score")], lr=1e-3)
    names = {"Trainer": lambda **kw: Trainer(**kw, optimizers=(optimizer, None)),
             "model": model, "args": args, "data": Sequences()}
    exec(compile(snippet("transformers"), "README.md", "exec"), names)
    diag = diagkit.load(tmp_path / "diag")
    assert diag.verdicts()["score.weight"] == {"orphan"}
    assert diag.meta["steps_observed"] == 3


def test_the_lightning_snippet(tmp_path, monkeypatch):
    L = pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.body, self.dead = nn.Linear(4, 4), nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return self.body(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(24, 4)), batch_size=4)
    exec(compile(snippet("lightning"), "README.md", "exec"),
         {"module": Module(), "loader": loader})
    v = diagkit.load(tmp_path / "diag").verdicts()
    assert v["dead.weight"] == {"unused"} and v["body.weight"] == {"ok"}


def test_the_accelerate_snippet(tmp_path, monkeypatch):
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState
    monkeypatch.chdir(tmp_path)
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randn(12, 4), batch_size=4)
        names = {"diagkit": diagkit, "accelerator": accelerate.Accelerator(cpu=True),
                 "model": model, "optimizer": optimizer, "loader": loader}
        exec(compile(snippet("accelerator.prepare"), "README.md", "exec"), names)
        for batch in names["loader"]:
            names["optimizer"].zero_grad()
            names["accelerator"].backward(names["model"](batch).sum())
            names["optimizer"].step()
        diag = names["watch"].stop()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert diag.verdicts()["1.weight"] == {"orphan", "grad_not_cleared"}
    assert diag.meta["steps_observed"] == 3
