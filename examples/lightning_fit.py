"""Train a small regressor with Lightning's `Trainer.fit`: an ordinary training program, with two
bugs planted in it, and diagkit watching (the lines marked `# diagkit`).

The first bug is the first seed report's: the encoder is frozen (as if pretrained) except its
input offset, re-enabled for training, and `configure_optimizers` leaves the frozen encoder out
by name (`not n.startswith("encoder.")`), which drops the offset too. It gets a gradient on
every step and never trains, and `optimizer.zero_grad()` never clears its `.grad`. diagkit says
`orphan` and `grad_not_cleared` for `encoder.offset`, and the finding shows the lines of
`configure_optimizers` that built the optimizer, its fix naming that hook with file:line.

The second: an auxiliary head whose loss was switched off (`aux_weight=0.0`) still sits in the
module, so it is trainable, but the forward never calls it: it never gets a gradient. diagkit
says `unused` for `aux_head.weight` and `aux_head.bias` (under DDP this is what needs
`find_unused_parameters=True`), and `ok` for everything else. The run is tiny and offline:
plain modules, a synthetic dataset, the CPU, no logger and no checkpoints.

    python examples/lightning_fit.py --output-dir runs/pl     # the diagnosis: runs/pl/diagkit
    python -c "import diagkit; print(diagkit.load('runs/pl/diagkit').findings)"
"""

import argparse

import lightning.pytorch as L
import torch
from torch import nn

from diagkit.integrations.lightning import DiagkitCallback  # diagkit


class Encoder(nn.Module):
    """Two layers after a learned offset of the input."""

    def __init__(self, d_in: int, d_hidden: int):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(d_in))
        self.layers = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(),
                                    nn.Linear(d_hidden, d_hidden), nn.ReLU())

    def forward(self, x):
        return self.layers(x + self.offset)


class Regressor(L.LightningModule):
    def __init__(self, d_in: int = 8, d_hidden: int = 16, aux_weight: float = 0.0):
        super().__init__()
        self.aux_weight = aux_weight
        self.encoder = Encoder(d_in, d_hidden)
        self.encoder.requires_grad_(False)  # frozen, as if pretrained...
        self.encoder.offset.requires_grad_(True)  # ...but for its offset, trained here
        self.head = nn.Linear(d_hidden, 1)
        self.aux_head = nn.Linear(d_hidden, d_in)  # reconstructs the input; the 2nd bug: unused

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.encoder(x)
        loss = nn.functional.mse_loss(self.head(h).squeeze(-1), y)
        if self.aux_weight > 0:
            loss = loss + self.aux_weight * nn.functional.mse_loss(self.aux_head(h), x)
        return loss

    def configure_optimizers(self):
        # the frozen encoder is left out by name; the bug: so is its trainable offset
        params = [p for n, p in self.named_parameters() if not n.startswith("encoder.")]
        return torch.optim.Adam(params, lr=1e-3)


def loader(n: int = 64, d_in: int = 8, seed: int = 0) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    y = x.sum(dim=1)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/lightning_fit")
    parser.add_argument("--max-steps", type=int, default=6)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        max_steps=args.max_steps, accumulate_grad_batches=2, gradient_clip_val=1.0,
        accelerator="cpu", devices=1, default_root_dir=args.output_dir, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[DiagkitCallback(steps=4, out=f"{args.output_dir}/diagkit")],  # diagkit
    )
    module = Regressor()
    trainer.fit(module, loader())
    print(f"trained {trainer.global_step} optimizer steps")
    print(next(c for c in trainer.callbacks if isinstance(c, DiagkitCallback)).diagnosis)  # diagkit


if __name__ == "__main__":
    main()
