"""Exact mode at the memory of what trains (issue 35, item 3; docs/cost.md, "Cost of observation").

`delta="exact"` snapshots what an optimizer holds or what requires grad, and fingerprints the
rest: tensors no optimizer holds that do not require grad (the frozen base of a fine-tune), and
integer or quantised storage of any kind. Meta tensors are never read. Checked: which tensors go
where, that a frozen tensor changed by hand still reads as changed (and as
`frozen_but_changing`, through `diagnose` and `watch`), a property test that the split gives
the plain exact probe's `changed` on random tensors and edits, the CUDA memory budget's choice
(a pure function, and its wiring with the device faked), and the bytes a LoRA fine-tune's probe
allocates.

The frozen base is read when observing begins and ends, not at each step (`FrozenWindow`;
docs/cost.md, "When the frozen base is read"): a change is marked on the last recorded step.
The window's own tests (reads counted, `diagnose`, `watch`, the whole run, restore) are in
tests/measure/change/test_frozen_window.py.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import diagkit
from diagkit.measure.change import split_probe
from diagkit.measure.change.exact_probe import ExactProbe
from diagkit.measure.model.inventory import take_inventory
from diagkit.measure.step.observer import Observer
from diagkit.measure.change.probes import make_probe
from diagkit.measure.batched.readback import Pending
from diagkit.measure.tables.step_records import StepRecords
from tensor_edits import ORACLE, apply, edits, tensors

MiB = 1 << 20


def one_step(probe, ts, change, consecutive=False):
    """(delta, changed, ratio) of one step of `probe` while `change(ts)` edits in place."""
    probe.begin(consecutive=consecutive)
    with torch.no_grad():
        change(ts)
    pending = Pending()
    probe.end(pending)
    return probe.resolve(pending.read())


def recorded(n: int, steps) -> StepRecords:
    """Records of `steps` [(delta, changed)], over `n` tensors: what `FrozenWindow.close`
    marks (only `changed` and `delta_norm` are read)."""
    records = StepRecords([str(k) for k in range(n)], False)
    for i, (delta, changed) in enumerate(steps):
        records.add(i, {"delta_norm": delta, "changed": changed})
    return records


def mixed():
    """held + trains, held + frozen, unheld + trains, unheld + frozen (float), int8 held,
    bool, float8, a meta tensor, uint8 unheld (distinct shapes: no bucket groups)."""
    torch.manual_seed(0)
    return [torch.randn(5), torch.randn(6), torch.randn(7), torch.randn(8),
            torch.arange(9, dtype=torch.int8), torch.tensor([True, False, True]),
            torch.randn(10).to(torch.float8_e4m3fn), torch.empty(11, device="meta"),
            torch.arange(12, dtype=torch.uint8)]


FROZEN = {3, 5, 6, 7, 8}  # held by no optimizer, not requiring grad (the observer's rule)


def test_exact_mode_snapshots_what_can_train_and_fingerprints_the_rest():
    ts = mixed()
    probe = make_probe("exact", ts, likely_static={1, 2} | FROZEN, frozen=FROZEN)
    assert probe.split.snapshot == [0, 1, 2]
    assert probe.split.prints == [3, 4, 5, 6, 8]  # integers, bool and float8 whatever holds them
    assert probe.split.meta == [7]
    probe.attach()
    try:
        assert probe.allocated_bytes() == 4 * (5 + 6 + 7)  # copies of what can train only

        def change(ts):
            ts[0].add_(1.0)
            ts[3][2] = 5.0
            ts[4][1] = -3
            ts[6][0] = torch.tensor(2.0).to(torch.float8_e4m3fn)
        delta, changed, ratio = one_step(probe, ts, change)
        # Printed each step: int8 held (4). The frozen base (3, 5, 6, 8): not read per step.
        assert probe.window.indices == [3, 5, 6, 8] and probe.prints.indices == [4]
        assert changed.tolist() == [True, False, False, False, True, False, False, False, False]
        assert delta[0] == pytest.approx(math.sqrt(5.0)) and delta[1] == delta[2] == 0.0
        # Fingerprinted per step: NaN (not measured) when its print changed, else 0.
        assert math.isnan(delta[4])
        assert np.isnan(delta[[3, 5, 6, 8]]).all()  # the window's: not measured per step
        assert math.isnan(delta[7]) and math.isnan(ratio[7])  # meta: nothing read
        assert np.isnan(ratio[3:]).all() and np.isnan(probe.value_norm[3:]).all()
        steps = [(delta, changed)]
        delta, changed, _ = one_step(probe, ts, lambda ts: None, consecutive=True)
        assert not changed.any() and math.isnan(delta[7]) and delta[4] == 0.0
        steps.append((delta, changed))
        records = recorded(len(ts), steps)
        assert probe.window.close(records) == {3, 6}  # read at the end: on the last step
        assert records.one(1)["changed"].tolist() == [False] * 3 + [True, False, False, True,
                                                                    False, False]
        assert not records.one(0)["changed"][[3, 6]].any()
        assert probe.window.close(recorded(len(ts), steps)) == set()  # goes on from there
    finally:
        probe.detach()


@pytest.mark.parametrize("mode", ["sampled", "off"])
def test_bounded_modes_fingerprint_integers_and_never_read_meta(mode):
    ts = mixed()
    probe = make_probe(mode, ts, likely_static=set(), sample=16)
    assert probe.exact.indices == [0, 1, 2, 3]  # small floats only: snapshots
    assert probe.big == [4, 5, 6, 8]
    probe.attach()
    try:
        _, changed, _ = one_step(probe, ts, lambda ts: ts[8].__setitem__(0, 7))
    finally:
        probe.detach()
    assert changed.tolist() == [False] * 8 + [True]


@st.composite
def same_values(draw, ts):
    """Edits that change bits, not values: a zero's sign, a NaN's payload (floats only)."""
    out = []
    for _ in range(draw(st.integers(0, 2))):
        k = draw(st.integers(0, len(ts) - 1))
        if ts[k].numel() and ts[k].dtype.is_floating_point:
            out.append((k, draw(st.integers(0, ts[k].numel() - 1))))
    return out


def apply_same_values(ts, edit_list) -> None:
    for k, i in edit_list:
        flat = ts[k].view(-1) if ts[k].is_contiguous() else None
        if flat is None or ts[k].dim() == 0:
            continue
        if flat[i] == 0:
            flat[i] = -flat[i]
        elif torch.isnan(flat[i]):
            bits = flat[i:i + 1].view({2: torch.int16, 4: torch.int32, 8: torch.int64}[
                flat.element_size()])
            bits[0] ^= 1  # the lowest payload bit: still a NaN (a quiet one keeps its bit)


@ORACLE
@given(data=st.data())
def test_the_split_gives_the_plain_exact_probes_changed(data):
    """Fast paths never change a verdict: on random tensors of every dtype, random frozen sets
    and random edits (sign flips of pairs, bit flips, NaN in and out, -0.0 for +0.0, changes
    while unobserved), the split probe's `changed` is the plain exact probe's, step by step.
    Where both snapshot, the norms agree too; where the split fingerprints, its norm is 0 for
    no change and NaN for a change. The frozen base (the window) is read at the end only: it
    is marked changed exactly when its values at the end differ from those at attach (floats
    as a snapshot compares them, the rest bit for bit, as they are printed)."""
    ts = data.draw(st.lists(tensors(), min_size=1, max_size=5))
    twins = [t.clone() for t in ts]
    start = [t.clone() for t in ts]
    frozen = data.draw(st.sets(st.integers(0, len(ts) - 1)))
    split = make_probe("exact", ts, likely_static=frozen, frozen=frozen)
    plain = ExactProbe(twins, range(len(twins)), frozen)
    split.attach()
    plain.attach()
    windowed, steps = set(split.window.indices), []
    try:
        for step in range(data.draw(st.integers(1, 3))):
            gap = data.draw(st.booleans()) and step > 0
            if gap:
                unseen = data.draw(edits(ts))
                with torch.no_grad():
                    apply(ts, unseen)
                    apply(twins, unseen)
            edit, same = data.draw(edits(ts)), data.draw(same_values(ts))

            def change(ts):
                apply(ts, edit)
                apply_same_values(ts, same)
            got = one_step(split, ts, change, step > 0 and not gap)
            want = one_step(plain, twins, change, step > 0 and not gap)
            steps.append(got[:2])
            for k in range(len(ts)):
                if k in windowed:
                    assert not got[1][k] and math.isnan(got[0][k])
                else:
                    assert got[1][k] == want[1][k], (k, ts, edit)
            for k in split.split.snapshot:
                assert got[0][k] == pytest.approx(want[0][k], rel=1e-5, nan_ok=True)
            for k in set(split.split.prints) - windowed:
                assert got[0][k] == 0.0 if not got[1][k] else math.isnan(got[0][k])
        marked = split.window.close(recorded(len(ts), steps))
        assert marked == {k for k in windowed if values_differ(start[k], ts[k])}, (start, ts)
    finally:
        split.detach()
        plain.detach()


def values_differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    """As the frozen base's print tells: a float's values (NaN equal to NaN, +0.0 to -0.0),
    anything else's bits."""
    if a.dtype.is_floating_point and a.element_size() > 1:
        return not bool(((a == b) | (a.isnan() & b.isnan())).all())
    return not torch.equal(_bytes(a), _bytes(b))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes. A copy, laid out anew: a one-element view with a stride of 2 counts as
    contiguous to torch (`contiguous()` keeps it), and `view(uint8)` refuses its stride."""
    return t.reshape(-1).clone(memory_format=torch.contiguous_format).view(torch.uint8)


def test_a_signed_zero_or_another_nan_is_no_change_in_the_frozen_base():
    """A frozen tensor's prints compare values, as a snapshot does: +0.0 -> -0.0 and a NaN of
    another payload are no change (a different value is)."""
    ts = [torch.tensor([0.0, math.nan, 1.0]), torch.zeros(4, dtype=torch.bfloat16)]
    probe = make_probe("exact", ts, likely_static={0, 1}, frozen={0, 1})
    probe.attach()
    try:
        def same_values(ts):
            ts[0][0] = -0.0
            ts[0].view(torch.int32)[1] = 0x7FC00123  # another NaN
            ts[1][3] = -0.0
        step = one_step(probe, ts, same_values)
        assert probe.window.close(recorded(2, [step[:2]])) == set()
        step = one_step(probe, ts, lambda ts: ts[1].__setitem__(0, 1e-3), consecutive=True)
        assert probe.window.close(recorded(2, [step[:2]])) == {1}
    finally:
        probe.detach()


def frozen_base():
    """A frozen layer no optimizer holds, then a trained head."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    model[0].requires_grad_(False)
    return model, torch.optim.SGD(model[2].parameters(), lr=0.1), torch.randn(4, 8)


def check_frozen_but_changing(diag) -> None:
    """0.weight changed at step 2, read from its fingerprint when observing ended: marked
    changed on the last step (dated to the window; its norm never measured), and judged
    frozen_but_changing; 0.bias, fingerprinted and untouched, is not."""
    rows = diag.steps[diag.steps["name"] == "0.weight"].sort_values("step")
    assert rows["changed"].tolist() == [False, False, False, True]
    assert rows["delta_norm"].isna().all()
    assert "frozen_but_changing" in diag.verdicts()["0.weight"]
    assert "frozen_but_changing" not in diag.verdicts()["0.bias"]


def test_a_frozen_tensor_changed_by_hand_is_frozen_but_changing_in_diagnose():
    model, opt, x = frozen_base()
    calls = []

    def loss_fn(m, b):
        calls.append(1)
        if len(calls) == 3:  # the third step: an in-place write to the frozen base
            with torch.no_grad():
                m[0].weight[1, 2] += 0.5
        return m(b).pow(2).mean()
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: x, loss_fn=loss_fn, steps=4)
    check_frozen_but_changing(diag)


def test_a_frozen_tensor_changed_by_hand_is_frozen_but_changing_in_watch():
    model, opt, x = frozen_base()
    w = diagkit.watch(model, opt, steps=4)
    for i in range(4):
        opt.zero_grad()
        if i == 2:
            with torch.no_grad():
                model[0].weight.data[1, 2] += 0.5  # through .data: no version bump either
        model(x).pow(2).mean().backward()
        opt.step()
    check_frozen_but_changing(w.diagnosis)


def test_over_budget_fingerprints_the_largest_first():
    sizes = [10, 50, 20, 50]
    assert split_probe.over_budget(sizes, 130) == []
    assert split_probe.over_budget(sizes, 80) == [3]  # ties: the later one goes first
    assert split_probe.over_budget(sizes, 79) == [1, 3]
    assert split_probe.over_budget(sizes, 30) == [1, 3]
    assert split_probe.over_budget(sizes, 0) == [0, 1, 2, 3]
    assert split_probe.over_budget([], 0) == []


def test_the_budget_moves_snapshots_to_prints_before_allocating(monkeypatch, caplog):
    """The CUDA check, with the device faked on the CPU: snapshots past `memory_budget` of the
    free memory go to the fingerprint, largest first, before anything is allocated; one line
    says so; `changed` stays exact."""
    monkeypatch.setattr(split_probe, "budgeted", lambda t: True)
    monkeypatch.setattr(split_probe, "free_device_bytes", lambda device: 400)
    ts = [torch.randn(10), torch.randn(40), torch.randn(20)]  # 40, 160, 80 bytes
    probe = make_probe("exact", ts, likely_static=set(), memory_budget=0.5)  # 200 bytes
    with caplog.at_level(logging.INFO, logger="diagkit"):
        probe.attach()
    try:
        assert probe.over_budget == [1]
        assert probe.exact.indices == [0, 2] and probe.prints.indices == [1]
        assert probe.allocated_bytes() == 120
        lines = [r for r in caplog.records if r.name == "diagkit"]
        assert len(lines) == 1 and "memory_budget=0.5" in lines[0].getMessage()
        _, changed, _ = one_step(probe, ts, lambda ts: ts[1].__setitem__(7, 0.0))
        assert changed.tolist() == [False, True, False]
    finally:
        probe.detach()


def lora_llama(layers: int = 2, hidden: int = 64, vocab: int = 512):
    """A LoRA fine-tune (r=8 on q_proj/v_proj, peft) of a LlamaConfig model, random init."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4))
    model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return model, opt


def test_a_lora_fine_tunes_snapshots_take_the_bytes_of_what_trains():
    """The goal of issue 35: extra memory <= what trains + 64 MiB. Here, by the probe's own
    count (deterministic): the adapters' bytes, plus at most as much again for the ping-pong
    buffers of their bucket groups (`ExactProbe.PINGPONG_BYTES`), nothing of the frozen base."""
    model, opt = lora_llama()
    trained = sum(p.nbytes for p in model.parameters() if p.requires_grad)
    whole = sum(p.nbytes for p in model.parameters())
    obs = Observer(take_inventory(model, [opt]), [opt])
    obs.attach()
    try:
        got = obs.probe.allocated_bytes()
    finally:
        obs.detach()
    assert trained <= got <= 2 * trained, (got, trained, whole)
    assert got <= trained + 64 * MiB and whole > 20 * trained


def test_the_70b_lora_plan_counts_only_what_trains():
    """On the meta device (no memory), the plan of LLaMA-70B's shape with LoRA on q/v and an
    optimizer of the trainable tensors: snapshots of the adapters only (`split`, values=False:
    meta tensors planned as if materialised)."""
    pytest.importorskip("peft")
    from diagkit.demos.llama_lora import SIZES
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    with torch.device("meta"):
        base = LlamaForCausalLM(LlamaConfig(**{**SIZES["70b"], "num_hidden_layers": 4},
                                            tie_word_embeddings=False))
        model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    inv = take_inventory(model, [torch.optim.AdamW(trainable, lr=1e-4)])
    held = {int(k) for ks in inv.held_by(1) for k in ks}
    frozen = {k for k, t in enumerate(inv.tensors) if not t.requires_grad and k not in held}
    plan = split_probe.split(inv.tensors, frozen, values=False)
    planned = split_probe.snapshot_bytes(inv.tensors, plan.snapshot)
    assert planned == sum(p.numel() * p.element_size() for p in trainable)
    assert split_probe.split(inv.tensors, frozen).snapshot == []  # in a real run: never read


RSS_CHILD = textwrap.dedent("""
    import json, sys, torch
    from torch import nn
    import diagkit, diagkit.run.watch.watch, pandas  # imports are not the watch's memory
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(40000, 1024), nn.Linear(1024, 8))  # 156 MiB frozen
    model[0].requires_grad_(False)
    opt = torch.optim.AdamW(model[1].parameters(), lr=1e-3)
    x = torch.randint(0, 40000, (4, 16))

    def step():
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    def hwm():
        return [int(l.split()[1]) for l in open("/proc/self/status")
                if l.startswith("VmHWM")][0] * 1024
    for _ in range(3):
        step()
    before = hwm()
    w = diagkit.watch(model, opt, steps=3)
    for _ in range(3):
        step()
    assert w.diagnosis is not None
    trained = sum(p.nbytes for p in model[1].parameters())
    print(json.dumps({"extra": hwm() - before, "trained": trained}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_watch_adds_rss_for_what_trains_not_for_the_frozen_base():
    """Peak RSS of a fresh process: a 156 MiB frozen embedding no optimizer holds and a small
    trained head; the default exact watch must stay within trained + 64 MiB (a copy of the
    embedding alone would pass it by ~90 MiB)."""
    done = subprocess.run([sys.executable, "-c", RSS_CHILD], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert got["extra"] <= got["trained"] + 64 * MiB, got
