"""Fine-tune a small sequence classifier with the Hugging Face Trainer: an ordinary training
program, with a bug planted in it, and diagkit watching (the lines marked `# diagkit`).

The bug: the optimizer's param groups are picked by name, with the head's name copied from a
BERT script (`classifier.`). This Llama model calls its head `score`, so the head is in no group:
it gets a gradient on every step and never trains. diagkit says `orphan` for `score.weight`,
and `ok` for everything else. The optimizer is handed to the Trainer as `optimizers=`, so the
finding's fix names that argument and the line that built the optimizer (file:line), and its
source shows the groups' name filters in `optimizer_for`. The run is tiny and
offline: a randomly initialised 2-layer model built from a config, a synthetic dataset, the CPU.

    python examples/hf_trainer.py --output-dir runs/hf    # the diagnosis: runs/hf/diagkit
    python -c "import diagkit; print(diagkit.load('runs/hf/diagkit').findings)"
"""

import argparse

import torch
from transformers import (LlamaConfig, LlamaForSequenceClassification, Trainer,
                          TrainingArguments)

from diagkit.integrations.transformers import DiagkitCallback  # diagkit


def build_model() -> LlamaForSequenceClassification:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=32, num_labels=2, pad_token_id=0)
    return LlamaForSequenceClassification(config)


class Sequences(torch.utils.data.Dataset):
    """Random token sequences (no padding); the label: is the first token in the upper half."""

    def __init__(self, n: int = 64, length: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 64, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": int(self.ids[i, 0] >= 32)}


def optimizer_for(model) -> torch.optim.Optimizer:
    """The body at a low learning rate, the new head at a higher one."""
    named = list(model.named_parameters())
    body = [p for n, p in named if n.startswith("model.")]
    head = [p for n, p in named if n.startswith("classifier.")]  # the bug: it is `score.` here
    return torch.optim.AdamW([{"params": body, "lr": 1e-3}, {"params": head, "lr": 1e-2}],
                             weight_decay=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/hf_trainer")
    parser.add_argument("--max-steps", type=int, default=6)
    args = parser.parse_args()

    model = build_model()
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_grad_norm=1.0, use_cpu=True, seed=0,
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(
        model=model, args=training, train_dataset=Sequences(),
        optimizers=(optimizer_for(model), None),
        callbacks=[DiagkitCallback(steps=4, out=f"{args.output_dir}/diagkit")],  # diagkit
    )
    result = trainer.train()
    print(f"trained {result.global_step} steps, loss {result.training_loss:.4f}")
    print(trainer.pop_callback(DiagkitCallback).diagnosis)  # diagkit


if __name__ == "__main__":
    main()
