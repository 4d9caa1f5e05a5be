"""A realistic shape: a 2-layer transformer with ~200 tensors, 20 observed steps.

Timing is a benchmark concern (benchmarks/); here we check that a model of this shape is
diagnosed completely and correctly: every tensor tabled on every step, every verdict right.
"""

import torch
from torch import nn

import diagkit


class SmallTransformer(nn.Module):
    def __init__(self, vocab=100, d=64, heads=45):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, 4, 128, batch_first=True, dropout=0.0) for _ in range(2))
        # Many small per-feature heads bring the count to ~200 tensors, like a real model's.
        self.heads = nn.ModuleList(nn.Sequential(nn.Linear(d, 8), nn.LayerNorm(8))
                                   for _ in range(heads))
        self.dead = nn.Linear(d, d)  # never called: must be the only 'unused' subtree
        self.out = nn.Linear(d, vocab)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        aux = sum(head(h).pow(2).mean() for head in self.heads)
        return self.out(h), aux


def test_two_layer_transformer_twenty_steps():
    torch.manual_seed(0)
    model = SmallTransformer()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    gen = torch.Generator().manual_seed(1)

    def loss_fn(m, x):
        logits, aux = m(x)
        return nn.functional.cross_entropy(logits.reshape(-1, 100), x.reshape(-1)) + 0.01 * aux

    diag = diagkit.diagnose(model, opt, batch_fn=lambda: torch.randint(100, (8, 16), generator=gen),
                            loss_fn=loss_fn, steps=20)
    n = len(list(model.parameters()))
    assert 190 <= n <= 220
    assert len(diag.params) == n
    assert len(diag.steps) == 20 * n
    verdicts = diag.verdicts()
    assert {k for k, v in verdicts.items() if v != {"ok"}} == {"dead.weight", "dead.bias"}
    assert verdicts["dead.weight"] == {"unused"}
    [finding] = diag.findings
    assert (finding.code, finding.module, finding.count) == ("unused", "dead", 2)
    assert diag.advice["find_unused_parameters"]["value"] is True
    assert diag.advice["find_unused_parameters"]["unused_bytes"] == (64 * 64 + 64) * 4
    live = diag.params[~diag.params["name"].str.startswith("dead.")]
    assert (live["changed_steps"] == 20).all() and (live["used_steps"] == 20).all()
