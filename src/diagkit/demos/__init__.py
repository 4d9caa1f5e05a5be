"""Bundled demo targets, each a small faithful reproduction of a real wiring bug.

    diagkit check diagkit.demos:meta_memory     # orphan mem_tokens (first seed)
    diagkit check diagkit.demos:finetune_heads  # dead pretraining heads under DDP (second seed)
    diagkit check diagkit.demos:clean           # correctly wired: all ok
"""

from .finetune import finetune_heads
from .metamem import meta_memory
from .wired import clean

DEMOS = ("meta_memory", "finetune_heads", "clean")

__all__ = ["meta_memory", "finetune_heads", "clean", "DEMOS"]
