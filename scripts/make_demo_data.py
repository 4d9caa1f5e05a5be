"""Write the demo data under data/. Run with `make data`.

- data/finetune_heads_pretrain.pt: the pretraining checkpoint of the finetune demo.
- data/meta_memory_step2.pt, data/meta_memory_step5.pt: two saves of the meta_memory demo's
  standard training loop, after step 2 and after step 5 (`diagkit compare` and
  notebooks/compare_checkpoints.ipynb show what changed between them: not `mem_tokens`).

Deterministic: the same torch version writes the same tensors.
"""

from pathlib import Path

import torch

from diagkit.demos.finetune import CHECKPOINT_NAME, build_pretrain_state
from diagkit.demos.metamem import meta_memory

META_MEMORY_SAVES = (2, 5)  # steps after which the meta_memory demo's state is saved


def save_meta_memory_checkpoints(folder: Path, saves=META_MEMORY_SAVES) -> list[Path]:
    """Run the demo's standard loop (SPEC 2.1) and save {model, optimizer, step} after the
    given steps; every value loads with weights_only=True."""
    setup = meta_memory()
    model, optimizer = setup["model"], setup["optimizer"]
    written = []
    for step in range(1, max(saves) + 1):
        optimizer.zero_grad(set_to_none=True)
        batch = setup["batch_fn"]()
        loss = setup["loss_fn"](model, batch)
        loss.backward()
        optimizer.step()
        if step in saves:
            path = folder / f"meta_memory_step{step}.pt"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step}, path)
            written.append(path)
    return written


if __name__ == "__main__":
    data = Path(__file__).resolve().parents[1] / "data"
    data.mkdir(exist_ok=True)
    out = data / CHECKPOINT_NAME
    torch.save(build_pretrain_state(), out)
    for path in [out, *save_meta_memory_checkpoints(data)]:
        print(f"wrote {path} ({path.stat().st_size} bytes)")
