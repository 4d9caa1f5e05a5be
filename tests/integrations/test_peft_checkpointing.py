"""The canonical LoRA recipe: peft on a frozen base, gradient checkpointing (reentrant), and
`enable_input_require_grads()`, which makes the frozen embedding's output a leaf that requires
grad, a fresh one each forward. That activation is not state: never `unregistered`, never
kept alive or copied (docs/unregistered.md). In the user's loop and under the real HF `Trainer`
with gradient accumulation."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import diagkit
from integration_helpers import NO_HOOKS, Sequences, hooks_left, observed_steps

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def checkpointed_lora(enable_inputs: bool = True):
    """The issue's recipe: a 2-layer Llama, checkpointed, LoRA on q/v."""
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2))
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    if enable_inputs:
        base.enable_input_require_grads()
    return peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                     task_type="CAUSAL_LM"))


def test_the_recipe_in_a_plain_loop_is_clean_and_keeps_no_activation():
    model = checkpointed_lora()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    leaves = []  # the embedding's output, a fresh leaf each forward (weakly)
    embed = model.get_input_embeddings()
    handle = embed.register_forward_hook(lambda m, a, out: leaves.append(weakref.ref(out)))
    w = diagkit.watch(model, opt, steps=5)

    def step():
        x = torch.randint(1, 64, (4, 12))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    for _ in range(4):
        step()
    gc.collect()
    assert len(leaves) == 4 and all(ref() is None for ref in leaves)  # none kept alive
    assert w.observer.unregistered.tensors == []  # nor measured (copied) each step
    step()
    handle.remove()
    diag = w.diagnosis
    assert diag.findings == [], [f.message for f in diag.findings]
    assert not any(n.startswith("<unregistered") for n in diag.params["name"])
    assert len(diag.params) == len(list(model.parameters()))  # the model's tensors, no more
    assert set().union(*diag.verdicts().values()) == {"ok"}
    assert hooks_left(model, [opt]) == NO_HOOKS


def test_the_recipe_under_the_trainer_with_accumulation_is_clean(tmp_path):
    from transformers import Trainer, TrainingArguments
    from diagkit.integrations.transformers import DiagkitCallback
    model = checkpointed_lora(enable_inputs=False)  # the Trainer enables it itself
    callback = DiagkitCallback(steps=50)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": True},
                             use_cpu=True, seed=0, report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Sequences(n=16, labels="ids"),
                      callbacks=[callback])
    trainer.train()
    diag = callback.diagnosis
    assert observed_steps(diag) == [0, 1, 2]
    assert diag.findings == [], [f.message for f in diag.findings]
    assert not any(n.startswith("<unregistered") for n in diag.params["name"])
    assert set().union(*diag.verdicts().values()) == {"ok"}
    assert hooks_left(model, [trainer.optimizer]) == NO_HOOKS
