"""An ordinary training script, written without diagkit in mind: one monolithic `main()`.

It carries two wiring bugs that train "fine": the optimizer is built from a name filter that
misses the classifier head (`head.*` never moves, and its .grad grows), and an auxiliary
projection is built but never called. The lines marked `# diagkit` are all it takes to find them
(docs/watch.md, "Diagnose your real training run"); removed, the script runs as it always did.
"""

import torch
from torch import nn

import diagkit  # diagkit


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.aux_proj = nn.Linear(32, 8)  # planned for an auxiliary loss, never called
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.encoder(x))


def main(steps: int = 30) -> None:
    torch.manual_seed(0)
    model = Classifier()
    data = torch.randn(256, 16)
    labels = (data[:, :4].argmax(dim=1))
    trainable = [p for n, p in model.named_parameters() if n.startswith("encoder")]  # bug
    opt = torch.optim.AdamW(trainable, lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    watch = diagkit.watch(model, opt, steps=10, out="diag")  # diagkit
    for step in range(steps):
        idx = torch.randint(0, len(data), (32,))
        loss = nn.functional.cross_entropy(model(data[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    print(watch.diagnosis)  # diagkit


if __name__ == "__main__":
    main()
