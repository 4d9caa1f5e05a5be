"""`diagkit.watch` on a peft LoRA model (a tiny Llama built from a config, never downloaded):
the LoRA factors train (`ok`), the frozen base model raises nothing, under its peft names, in a
plain loop and under the Trainer."""

from __future__ import annotations

import pytest
import torch

import diagkit
from integration_helpers import (NO_HOOKS, Sequences, hooks_left, observed_steps,
                                 tiny_llama_config)

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")


def lora_model(**config):
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_llama_config())
    lora = peft.LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0,
                           target_modules=["q_proj", "v_proj"], **config)
    return peft.get_peft_model(base, lora)


def split(verdicts):
    lora = {n: v for n, v in verdicts.items() if ".lora_" in n}
    return lora, {n: v for n, v in verdicts.items() if n not in lora}


def test_lora_factors_are_ok_and_the_frozen_base_raises_nothing():
    model = lora_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    w = diagkit.watch(model, opt, steps=3)
    data = Sequences(n=8, labels="ids")
    for i in range(4):
        batch = data[i]
        opt.zero_grad()
        model(input_ids=batch["input_ids"][None], labels=batch["labels"][None]).loss.backward()
        opt.step()
    assert w.done and hooks_left(model, [opt]) == NO_HOOKS
    diag = w.diagnosis
    lora, base = split(diag.verdicts())
    # 2 layers x (q, v) x (A, B), under peft's own names
    assert len(lora) == 8 and set().union(*lora.values()) == {"ok"}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" in lora
    assert base and set().union(*base.values()) == {"ok"}
    assert diag.findings == []
    frozen = diag.params[~diag.params["name"].str.contains(".lora_", regex=False)]
    assert not frozen["requires_grad"].any()


def test_lora_under_the_trainer(tmp_path):
    from transformers import Trainer, TrainingArguments
    from diagkit.integrations.transformers import DiagkitCallback
    model = lora_model(task_type="CAUSAL_LM")
    callback = DiagkitCallback(steps=50)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, use_cpu=True, seed=0, report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Sequences(n=16, labels="ids"),
                      callbacks=[callback])
    trainer.train()
    assert callback.watch.done and hooks_left(model, [trainer.optimizer]) == NO_HOOKS
    diag = callback.diagnosis
    assert observed_steps(diag) == [0, 1, 2]
    lora, base = split(diag.verdicts())
    assert len(lora) == 8 and set().union(*lora.values(), *base.values()) == {"ok"}
