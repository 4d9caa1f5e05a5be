"""A LLaMA-architecture model with a LoRA wrapper, its optimizer built before the wrap: the
optimizer holds the base weights that peft then freezes, and the LoRA adapters, the only
tensors that train, are in no optimizer.

    diagkit check diagkit.demos.llama_lora:llama_lora --meta               # 70B, no memory
    diagkit check diagkit.demos.llama_lora:llama_lora --meta --arg size=tiny

`size="70b"` is LLaMA-3-70B's shape (hidden 8192, 80 layers, 64 heads, 8 KV heads,
intermediate 28672, vocab 128256: 70.6B parameters, 282 GB in float32): build it only on the
meta device (`--meta`). `size="tiny"` is the same wiring small enough for a real run. The
model is built from a `transformers.LlamaConfig` with random init (`from_config`), never
downloaded. transformers and peft are optional extras: imported here, when the target is
built, and this module is not imported by `diagkit.demos`.
"""

from __future__ import annotations

import torch

from ..core.errors import TargetError

SIZES = {
    "70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, intermediate_size=28672, vocab_size=128256),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=256),
}
SEQ = 16


def llama_lora(size: str = "70b", batch: int = 1, rank: int = 8):
    """The target: the optimizer-before-wrap bug on a LLaMA model of `size`."""
    if size not in SIZES:
        raise TargetError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    try:
        from peft import LoraConfig, get_peft_model
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise TargetError(f"the 70B LLaMA + LoRA demo needs transformers and peft ({exc}): "
                          "pip install 'diagkit[demos]'") from None

    config = LlamaConfig(**SIZES[size], tie_word_embeddings=False)
    base = LlamaForCausalLM(config)  # random init, on the meta device under --meta
    # The bug: the optimizer is built from every base weight, then peft wraps the model. peft
    # freezes those weights, and its new LoRA adapters are held by no optimizer.
    optimizer = torch.optim.AdamW(base.parameters(), lr=1e-4, weight_decay=0.1)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank,
                                            target_modules=["q_proj", "v_proj"]))
    vocab = config.vocab_size

    def batch_fn():
        ids = torch.randint(0, vocab, (batch, SEQ), device="cpu")  # integer ids stay real
        return {"input_ids": ids, "labels": ids}

    def loss_fn(m, b):
        return m(**b).loss

    return {"model": model, "optimizer": optimizer, "batch_fn": batch_fn, "loss_fn": loss_fn,
            "steps": 1}
