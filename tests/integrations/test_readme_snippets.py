"""The HF Trainer, Lightning and accelerate snippets run as written (with the objects they name
built small here) and each finds the planted bug: the README's and those of
docs/integrations.md, "In a Hugging Face `Trainer`, Lightning or accelerate run"."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import diagkit
import doc_blocks
from integration_helpers import Sequences, dead_head_module, tiny_classifier

# (page, section): the README's subsection, and the page that stands alone.
PAGES = {"README.md": "### In a Hugging Face `Trainer`, Lightning or accelerate run",
         "docs/integrations.md": None}


def snippet(page: str, marker: str) -> str:
    return doc_blocks.snippet(doc_blocks.ROOT / page, marker, PAGES[page])


@pytest.mark.parametrize("page", PAGES)
def test_the_hf_trainer_snippet(page, tmp_path, monkeypatch):
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
    exec(compile(snippet(page, "transformers"), page, "exec"), names)
    diag = diagkit.load(tmp_path / "diag")
    assert diag.verdicts()["score.weight"] == {"orphan"}
    assert diag.meta["steps_observed"] == 3


@pytest.mark.parametrize("page", PAGES)
def test_the_lightning_snippet(page, tmp_path, monkeypatch):
    L = pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(24, 4)), batch_size=4)
    exec(compile(snippet(page, "lightning"), page, "exec"),
         {"module": dead_head_module(L), "loader": loader})
    v = diagkit.load(tmp_path / "diag").verdicts()
    assert v["dead.weight"] == {"unused"} and v["body.weight"] == {"ok"}


@pytest.mark.parametrize("page", PAGES)
def test_the_accelerate_snippet(page, tmp_path, monkeypatch):
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
        exec(compile(snippet(page, "accelerator.prepare"), page, "exec"), names)
        for batch in names["loader"]:
            names["optimizer"].zero_grad()
            names["accelerator"].backward(names["model"](batch).sum())
            names["optimizer"].step()
        diag = names["watch"].stop()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert diag.verdicts()["1.weight"] == {"orphan", "grad_not_cleared"}
    assert diag.meta["steps_observed"] == 3
