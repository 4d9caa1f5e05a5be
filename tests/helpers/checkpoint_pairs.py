"""The meta_memory demo's two checkpoints (data/, steps 2 and 5) that the compare tests
(tests/e2e/test_compare*.py) read, and what they read off a comparison."""

from __future__ import annotations

from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
STEP2 = REPO / "data" / "meta_memory_step2.pt"
STEP5 = REPO / "data" / "meta_memory_step5.pt"
MEM = "module.metamodel.model.mem_tokens"  # the tensor the demo's optimizer leaves out


def saved_model(path) -> dict[str, torch.Tensor]:
    """The model's tensors of one of the demo's saves."""
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def status_of(cmp) -> dict[str, str]:
    """{tensor name: its status} of a comparison."""
    return dict(zip(cmp.table["name"], cmp.table["status"]))


def codes_of(cmp) -> list[str]:
    """The codes of a comparison's findings, in order."""
    return [f.code for f in cmp.findings]
