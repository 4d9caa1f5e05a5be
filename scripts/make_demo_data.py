"""Write data/finetune_heads_pretrain.pt, the pretraining checkpoint of the finetune demo.

Deterministic: the same torch version writes the same tensors. Run with `make data`.
"""

from pathlib import Path

import torch

from diagkit.demos.finetune import CHECKPOINT_NAME, build_pretrain_state

if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "data" / CHECKPOINT_NAME
    out.parent.mkdir(exist_ok=True)
    torch.save(build_pretrain_state(), out)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
