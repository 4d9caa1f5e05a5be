"""What the integration tests share: offline Hugging Face settings, tiny randomly initialised
models built from configs (nothing is ever downloaded), and a count of every hook diagkit could
leave behind."""

from __future__ import annotations

import os

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}
os.environ.update(OFFLINE)  # before transformers is imported: huggingface_hub reads it then

import torch  # noqa: E402


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig
    values = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                  num_labels=2, pad_token_id=0)
    values.update(overrides)
    return LlamaConfig(**values)


def head_left_out_trainer():
    """The seed demo's orphan under the HF Trainer: a `Trainer` whose optimizer is built from a
    name filter that misses the classifier head `score` (AdamW over `model.*` only)."""
    from transformers import Trainer

    class HeadLeftOut(Trainer):
        def create_optimizer(self):
            if self.optimizer is None:
                self.optimizer = torch.optim.AdamW(
                    [p for n, p in self.model.named_parameters() if n.startswith("model.")],
                    lr=1e-3, weight_decay=0.0)
            return self.optimizer
    return HeadLeftOut


def tiny_classifier():
    from transformers import LlamaForSequenceClassification
    torch.manual_seed(0)
    return LlamaForSequenceClassification(tiny_llama_config())


class Sequences(torch.utils.data.Dataset):
    """Random token sequences without padding; label: the first token is in the upper half."""

    def __init__(self, n: int = 48, length: int = 8, seed: int = 0, labels: str = "class"):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 64, (n, length), generator=g)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        label = int(self.ids[i, 0] >= 32) if self.labels == "class" else self.ids[i]
        return {"input_ids": self.ids[i], "labels": label}


def training_args(tmp_path, max_steps: int = 4, **overrides):
    """The HF `TrainingArguments` of the Trainer tests: `max_steps` steps on the CPU, nothing
    logged, saved or reported."""
    from transformers import TrainingArguments
    values = dict(output_dir=str(tmp_path / "trainer"), max_steps=max_steps,
                  per_device_train_batch_size=4, use_cpu=True, seed=0, report_to=[],
                  save_strategy="no", logging_strategy="no", disable_tqdm=True)
    values.update(overrides)
    return TrainingArguments(**values)


def inner_optimizers(optimizers) -> list:
    """The torch optimizers under accelerate's / Lightning's wrappers, and the wrappers."""
    found = []
    for opt in optimizers:
        while opt is not None and opt not in found:
            found.append(opt)
            opt = getattr(opt, "optimizer", None) or getattr(opt, "_optimizer", None)
    return found


def hooks_left(model, optimizers) -> dict:
    """Every hook diagkit sets: on each tensor, and each optimizer's step pre-/post-hooks."""
    from torch.optim import optimizer as optim_mod
    opts = inner_optimizers(optimizers)
    return {
        "tensors": sum(len(p._backward_hooks or {}) for p in model.parameters()),
        "optimizer_pre": sum(len(getattr(o, "_optimizer_step_pre_hooks", {})) for o in opts),
        "optimizer_post": sum(len(getattr(o, "_optimizer_step_post_hooks", {})) for o in opts),
        "global": len(optim_mod._global_optimizer_pre_hooks)
        + len(optim_mod._global_optimizer_post_hooks),
    }


NO_HOOKS = {"tensors": 0, "optimizer_pre": 0, "optimizer_post": 0, "global": 0}


def observed_steps(diag) -> list[int]:
    return sorted(int(s) for s in diag.steps["step"].unique())


def dead_head_module(L):
    """A LightningModule (of `L`: lightning or lightning.pytorch) whose head `dead` its
    training_step never uses: the callbacks' `unused` case."""
    from torch import nn

    class WithDeadHead(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.body, self.dead = nn.Linear(4, 4), nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return self.body(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return WithDeadHead()
