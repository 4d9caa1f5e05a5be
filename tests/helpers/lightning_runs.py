"""A Lightning fit of the seed demo's orphan, for the tracker tests under Lightning
(tests/integrations/test_trackers_lightning.py and the W&B/Trackio ones): imports Lightning, so
only a test that has skipped without it imports this."""

from __future__ import annotations

import lightning.pytorch as L
import torch
from torch import nn


class HeadLeftOut(L.LightningModule):
    """The seed demo's orphan: `head` is used but left out of the optimizer."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        loss = self.head(self.body(batch[0])).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.body.parameters(), lr=0.1)


def fit(tmp_path, callback, loggers):
    """6 steps (24 samples, batches of 4), every step logged."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(24, 4, generator=torch.Generator()
                                                      .manual_seed(0)))
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=loggers,
                        log_every_n_steps=1, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, callbacks=[callback])
    trainer.fit(HeadLeftOut(), torch.utils.data.DataLoader(data, batch_size=4))
    return trainer
