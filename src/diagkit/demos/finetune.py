"""Second seed: a finetune model built from a pretraining checkpoint keeps heads it never uses.

The finetune forward calls the encoder and a new FFN task head only; the vocabulary head, the
cMIM decoder and one encoder readout stay trainable and in the optimizer, so DDP needs
`find_unused_parameters=True` and every checkpoint carries their bytes.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import TargetError
from ..core.shipped import shipped
from .common import decay_groups

CHECKPOINT_NAME = "finetune_heads_pretrain.pt"
VOCAB, D, TASKS = 48, 32, 3


class Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()) for _ in range(layers))
        self.readout_atom = nn.Linear(d, d)   # per-token readout: pretraining only
        self.readout_mol = nn.Linear(d, d)    # pooled readout: used by the finetune head

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer(h)
        return h


class PretrainModel(nn.Module):
    def __init__(self, vocab: int = VOCAB, d: int = D):
        super().__init__()
        self.encoder = Encoder(vocab, d)
        self.vocab_head = nn.Linear(d, vocab)
        self.cmim_decoder = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))

    def pretrain_loss(self, ids):
        h = self.encoder(ids)
        logits = self.vocab_head(self.encoder.readout_atom(h))
        recon = self.cmim_decoder(self.encoder.readout_mol(h.mean(dim=1)))
        return (F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))
                + recon.pow(2).mean())


class FinetuneModel(PretrainModel):
    def __init__(self, tasks: int = TASKS, vocab: int = VOCAB, d: int = D):
        super().__init__(vocab, d)
        self.ffn_head = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, tasks))

    def forward(self, ids):
        pooled = self.encoder.readout_mol(self.encoder(ids).mean(dim=1))
        return self.ffn_head(pooled)


def build_pretrain_state(seed: int = 0, steps: int = 3) -> dict[str, torch.Tensor]:
    """A few deterministic pretraining steps; what `scripts/make_demo_data.py` saves."""
    torch.manual_seed(seed)
    model = PretrainModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model.pretrain_loss(torch.randint(VOCAB, (8, 10), generator=gen)).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def default_checkpoint() -> Path:
    return shipped("data") / CHECKPOINT_NAME


def finetune_heads(steps: int = 5, seed: int = 0, checkpoint: str | None = None,
                   batch: int = 8, lr: float = 1e-3, weight_decay: float = 0.01):
    torch.manual_seed(seed)
    model = FinetuneModel()
    path = Path(checkpoint) if checkpoint else default_checkpoint()
    if path.is_file():
        state = torch.load(path, map_location="cpu", weights_only=True)
    elif checkpoint:
        raise TargetError(f"no such checkpoint: {checkpoint}")
    else:  # installed without the repository's data/: rebuild the same state in memory
        state = build_pretrain_state()
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys or any(not k.startswith("ffn_head.") for k in result.missing_keys):
        raise TargetError(f"{path} does not match the finetune model: "
                          f"missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    optimizer = torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)

    def batch_fn():
        return torch.randint(VOCAB, (batch, 10), generator=gen), torch.randn(batch, TASKS,
                                                                           generator=gen)

    def loss_fn(model, data):
        ids, target = data
        return F.mse_loss(model(ids), target)

    return {"model": model, "optimizer": optimizer, "batch_fn": batch_fn, "loss_fn": loss_fn,
            "steps": steps}
