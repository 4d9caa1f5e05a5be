"""Training jobs for torchrun (2 processes, gloo, CPU), one per framework, each with its
DiagkitCallback: `python -m torch.distributed.run ... ddp_jobs.py hf|lightning OUT`. Each rank
writes what its callback holds to `OUT_ranks/<rank>.json` (`test_distributed_callbacks.py`
reads them): a file each, since the ranks' lines on torchrun's shared stdout can interleave."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from integration_helpers import Sequences, tiny_classifier


def hf(out: str):
    from transformers import Trainer, TrainingArguments
    from diagkit.integrations.transformers import DiagkitCallback
    model = tiny_classifier()
    body = [p for n, p in model.named_parameters() if n.startswith("model.")]  # `score` left out
    opt = torch.optim.AdamW(body, lr=1e-3, weight_decay=0.0)
    callback = DiagkitCallback(steps=3, out=out)
    args = TrainingArguments(output_dir=f"{out}_trainer", max_steps=4, seed=0, use_cpu=True,
                             per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Sequences(), callbacks=[callback],
                      optimizers=(opt, None))
    trainer.train()
    return callback, type(trainer.model_wrapped).__name__


def lightning(out: str):
    import lightning.pytorch as L
    from diagkit.integrations.lightning import DiagkitCallback

    class WithDeadHead(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.body, self.dead = nn.Linear(4, 4), nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            self.wrapped = type(self.trainer.strategy.model).__name__  # unwrapped at teardown
            return self.body(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    callback = DiagkitCallback(steps=3, out=out)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=2, num_nodes=1,
                        strategy="ddp_find_unused_parameters_true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=f"{out}_trainer",
                        accumulate_grad_batches=2, callbacks=[callback])
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=torch.Generator()
                                                      .manual_seed(0)))
    module = WithDeadHead()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    return callback, module.wrapped


if __name__ == "__main__":
    callback, wrapped = {"hf": hf, "lightning": lightning}[sys.argv[1]](sys.argv[2])
    diag = callback.diagnosis
    ranks = Path(f"{sys.argv[2]}_ranks")
    ranks.mkdir(exist_ok=True)
    (ranks / f"{dist.get_rank()}.json").write_text(json.dumps({
        "rank": dist.get_rank(), "wrapped": wrapped, "done": callback.watch.done,
        "verdicts": None if diag is None else {n: sorted(v) for n, v in diag.verdicts().items()},
        "nproc": None if diag is None else diag.meta.get("nproc"),
        "ranks_in_steps": None if diag is None else sorted(map(int, diag.steps["rank"].unique())),
    }))
    # a gloo group left to the exit aborts ~1 rank in 5 (docs/development.md, "Tests")
    if dist.is_initialized():
        dist.destroy_process_group()
