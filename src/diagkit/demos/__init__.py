"""Bundled demo targets, each a small faithful reproduction of a real wiring bug.

    diagkit check diagkit.demos:meta_memory     # orphan mem_tokens (first seed)
    diagkit check diagkit.demos:finetune_heads  # dead pretraining heads under DDP (second seed)
    diagkit check diagkit.demos:clean           # correctly wired: all ok

For `--nproc 2` (real DDP; each also runs in one process), see `diagkit.demos.ranks`:

    diagkit check diagkit.demos:forward_arg --nproc 2  # forward-argument tensor: rank_divergent
    diagkit check diagkit.demos:rank_branch --nproc 2  # branch used on odd ranks only
    diagkit check diagkit.demos:ddp_strict --nproc 2   # unused head, find_unused_parameters=False
    diagkit check diagkit.demos:hang --nproc 2         # rank 1 hangs (launcher timeout)
    diagkit check diagkit.demos:crash --nproc 2        # rank 1 raises

A 70B LLaMA with LoRA, for the dry run on meta (needs transformers and peft, so it is not
imported here):

    diagkit check diagkit.demos.llama_lora:llama_lora --meta  # optimizer built before the wrap
"""

from .finetune import finetune_heads
from .metamem import meta_memory
from .ranks import crash, ddp_strict, forward_arg, hang, rank_branch
from .wired import clean

# What `diagkit demo` reports on; the rank demos are for `--nproc` and are left out.
DEMOS = ("meta_memory", "finetune_heads", "clean")

__all__ = ["meta_memory", "finetune_heads", "clean", "forward_arg", "rank_branch", "ddp_strict",
           "hang", "crash", "DEMOS"]
