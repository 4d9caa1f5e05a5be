"""Zero by design is not a finding (issue 35, item 5b), on a real peft LoRA model built from a
config (nothing downloaded): a fresh adapter's `lora_A` gets exactly zero gradients on its first
step (`lora_B` starts at zero), which one step cannot tell from a tensor that cannot influence
the loss: no finding, every tensor `ok`, and the result's one line (`meta["not_judged"]`) says
so, also when saved and loaded, and a whole-run watch too; a gradient that stays zero after its
partners moved is still `zero_gradient`; findings of one verdict on sibling modules are one
finding. Also `nothing_trains` for an adapter loaded with PEFT's default `is_trainable=False`."""

from __future__ import annotations

import html

import pytest
import torch

import diagkit
from diagkit.judge.rules_change import untold_why
from diagkit.present.sections import diagnosis_html
from diagkit.present.text import render_findings
from models import ZeroGate, fixed_batch, mse_loss

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

LORA_A = "base_model.model.model.layers.*.self_attn.*.lora_A"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2))


def lora():
    return peft.get_peft_model(llama(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


def trained(model, steps, **adamw):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                            **adamw)
    w = diagkit.watch(model, opt, steps=steps)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(1, 64, (4, 12), generator=g)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        if loss.requires_grad:
            loss.backward()
        opt.step()
    assert w.done
    return w.diagnosis


def test_one_step_of_a_fresh_lora_is_no_finding_and_one_line(tmp_path):
    diag = trained(lora(), 1)
    zero_a = diag.steps[diag.steps["name"].str.contains(".lora_A.")]
    assert len(zero_a) == 4 and (zero_a["grad_norm"] == 0).all()  # the zeros are there
    assert diag.findings == [] and diag.worst() is None  # no finding at all
    assert set(diag.params["verdicts"]) == {("ok",)}
    why = diag.meta["not_judged"]["zero_gradient"]
    assert why.startswith(f"4 tensors ({LORA_A}) got only exactly-zero gradients, on steps "
                          "that cannot tell")
    assert set(diag.meta["not_judged"]) == {"zero_gradient"}  # an optimizer: no other entry
    line = f"zero_gradient not judged: {why}."
    assert line.endswith("observe more steps.")
    text = " ".join(render_findings(diag).split())  # the terminal (diagkit check), unwrapped
    assert line in text and "no findings: every tensor is ok" in text
    assert html.escape(line) in diagnosis_html(diag)  # the notebook and the report's banner
    diag.save(tmp_path / "diag")
    back = diagkit.load(tmp_path / "diag")
    assert back.meta["not_judged"] == diag.meta["not_judged"]
    assert line in " ".join(render_findings(back).split())


@pytest.mark.parametrize("adamw", [{}, {"weight_decay": 0.0}], ids=["decay", "no-decay"])
def test_several_steps_of_a_fresh_lora_are_clean(adamw):
    diag = trained(lora(), 3, **adamw)
    assert diag.findings == [] and "not_judged" not in diag.meta  # steps 1 and 2 tell


def test_lora_a_behind_a_frozen_lora_b_is_still_zero_gradient():
    """lora_B frozen at its zeros (a freeze loop that matched it): A's gradient is zero for
    good, and the steps after its partners moved tell it, as one finding for the 4."""
    model = lora()
    for name, p in model.named_parameters():
        if ".lora_B." in name:
            p.requires_grad_(False)
    diag = trained(model, 3)
    found = {(f.code, f.module, f.count) for f in diag.findings}
    assert ("zero_gradient", LORA_A, 4) in found and diag.worst() == "warning"
    assert "not_judged" not in diag.meta


def test_a_gate_multiplied_by_zero_is_zero_gradient_from_its_second_step():
    """Its partner (fc) moves on step 0: step 1 tells, step 0 alone cannot."""
    def gate(steps):
        torch.manual_seed(0)
        model = ZeroGate()
        x = fixed_batch()
        diag = diagkit.diagnose(model, torch.optim.SGD(model.parameters(), lr=0.05),
                                batch_fn=lambda: x, loss_fn=mse_loss, steps=steps)
        return diag.verdicts()["gate"], diag.meta.get("not_judged", {})
    assert gate(1) == ({"stalled"}, {"zero_gradient": untold_why(1, "gate")})
    assert gate(2) == ({"zero_gradient", "stalled"}, {})


def test_an_adapter_loaded_not_trainable_is_nothing_trains(tmp_path):
    lora().save_pretrained(tmp_path / "adapter")
    model = peft.PeftModel.from_pretrained(llama(), tmp_path / "adapter")  # is_trainable=False
    assert not any(p.requires_grad for p in model.parameters())
    # the HF Trainer's groups: decay and no decay, each filtered to what requires grad
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": trainable}, {"params": [], "weight_decay": 0.0}],
                            lr=1e-3)
    w = diagkit.watch(model, opt, steps=2)
    for _ in range(2):
        x = torch.randint(1, 64, (4, 12))
        assert not model(input_ids=x, labels=x).loss.requires_grad
        opt.step()
    (f,) = [f for f in w.diagnosis.findings if f.code == "nothing_trains"]
    assert f.severity == "error" and f.count == len(w.diagnosis.params)
    assert f.message.index("PEFT adapter") < f.message.index("freeze loop")  # the likely one


def whole_run(steps: int):
    model = lora()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    w = diagkit.watch(model, opt, steps=None, every=2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(1, 64, (4, 12), generator=g)
        opt.zero_grad()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
    w.stop()
    return w.diagnosis


def test_a_whole_run_watch_says_it_only_while_no_window_could_tell():
    """Each window is judged on its own steps: the run's line names the tensors some window
    could not tell and none could (the first burst's later steps tell lora_A)."""
    one = whole_run(1)
    assert one.findings == [] and set(one.params["verdicts"]) == {("ok",)}
    assert one.meta["not_judged"]["zero_gradient"].startswith(f"4 tensors ({LORA_A})")
    more = whole_run(6)
    assert more.findings == [] and "not_judged" not in more.meta
