"""Train a small text classifier with a plain loop under Hugging Face accelerate: an ordinary
training program, with a bug planted in it, and diagkit watching (the lines marked `# diagkit`).

The bug: the embedding is frozen ("keep the pretrained vectors") after the optimizer was built
from `model.parameters()`, so the optimizer still holds it: its state costs memory, and any
momentum or weight decay could still move it. diagkit says `frozen_in_optimizer` for
`embed.weight`, and `ok` for everything else. Gradients are accumulated over two batches
(`accelerator.accumulate`): diagkit counts optimizer steps, as the loop does.

    python examples/accelerate_loop.py --output-dir runs/acc   # the diagnosis: runs/acc/diagkit
"""

import argparse

import torch
from accelerate import Accelerator
from torch import nn

import diagkit  # diagkit


class BagClassifier(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 8, classes: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.out(torch.relu(self.hidden(self.embed(ids).mean(dim=1))))


def loader(n: int = 64, length: int = 6, seed: int = 0) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 32, (n, length), generator=g)
    labels = ids[:, 0] % 3
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids, labels), batch_size=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/accelerate_loop")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = BagClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.embed.requires_grad_(False)  # the bug: after the optimizer took every parameter
    model, optimizer, data = accelerator.prepare(model, optimizer, loader())
    watch = diagkit.watch(model, optimizer, steps=4, out=f"{args.output_dir}/diagkit")  # diagkit

    for _ in range(args.epochs):
        for ids, labels in data:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(ids), labels)
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
    print(f"final loss {loss.item():.4f}")
    print(watch.diagnosis)  # diagkit


if __name__ == "__main__":
    main()
