"""Checkpoints in every form diagkit reads, written by the real writers, for the sharded
checkpoint tests (tests/e2e/test_checkpoint_sharded*.py): a Hugging Face sharded checkpoint (an
index and its shards) and a `torch.distributed.checkpoint` folder, of the finetune demo's
pretraining checkpoint or of a small net; and whether two load reports agree."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn

PRETRAIN = Path(__file__).resolve().parents[2] / "data" / "finetune_heads_pretrain.pt"


def save_hf_shards(state: dict, folder: Path, per_shard: int = 4, suffix=".safetensors") -> Path:
    """`state` as a Hugging Face sharded checkpoint: shards of `per_shard` tensors and the
    index naming each tensor's shard (what `save_pretrained` writes, by hand)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    groups = [names[i:i + per_shard] for i in range(0, len(names), per_shard)]
    weight_map = {}
    stem = "model" if suffix == ".safetensors" else "pytorch_model"
    for i, group in enumerate(groups, 1):
        shard = f"{stem}-{i:05d}-of-{len(groups):05d}{suffix}"
        part = {n: state[n].contiguous() for n in group}
        if suffix == ".safetensors":
            save_file(part, str(folder / shard), metadata={"format": "pt"})
        else:
            torch.save(part, folder / shard)
        weight_map.update({n: shard for n in group})
    index = folder / f"{stem}{suffix}.index.json"
    total = sum(t.numel() * t.element_size() for t in state.values())
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return index


def save_dcp(obj: dict, folder: Path) -> Path:
    """`obj` written by torch.distributed.checkpoint.save, in this one process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(obj, checkpoint_id=str(folder))
    assert (folder / ".metadata").is_file() and list(folder.glob("__*_*.distcp"))
    return folder


def pretrain() -> dict[str, torch.Tensor]:
    """The finetune demo's pretraining checkpoint: 19 tensors."""
    return torch.load(PRETRAIN, map_location="cpu", weights_only=True)


def tiny_gpt2():
    """A 2-layer GPT-2 from a config, seed 0 (nothing downloaded)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16, bos_token_id=0, eos_token_id=0))


def net():
    """Linear, ReLU, Linear, seed 0."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def same_report(a, b) -> bool:
    """Two load reports agree in everything but the path they read."""
    da, db = a.to_dict(), b.to_dict()
    da.pop("path"), db.pop("path")
    return da == db
