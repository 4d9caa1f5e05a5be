"""The three bundled demos, diagnosed end to end, give exactly the verdicts they reproduce."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

import diagkit
from diagkit.demos.finetune import CHECKPOINT_NAME, build_pretrain_state

REPO = Path(__file__).resolve().parents[2]
MEM = "module.metamodel.model.mem_tokens"
DEAD_PREFIXES = ("encoder.readout_atom.", "vocab_head.", "cmim_decoder.")


# ------------------------------------------------------------------ meta_memory (first seed)
def test_meta_memory_orphan(meta):
    verdicts = meta.verdicts()
    assert verdicts[MEM] == {"orphan", "grad_not_cleared"}
    assert {n: v for n, v in verdicts.items() if n != MEM} == {
        n: {"ok"} for n in verdicts if n != MEM}


def test_meta_memory_frozen_backbone_is_ok(meta):
    p = meta.params
    backbone = p[p["name"].str.startswith("module.metamodel.") & (p["name"] != MEM)]
    assert len(backbone) == 11
    assert not backbone["requires_grad"].any()
    assert (backbone["verdicts"] == ("ok",)).all()
    assert (backbone["optimizer"].isna()).all()


def test_meta_memory_orphan_grad_rises_and_value_never_changes(meta):
    s = meta.steps[meta.steps["name"] == MEM].sort_values("step")
    assert list(s["step"]) == [0, 1, 2, 3, 4]
    total = s["grad_total_norm"].to_numpy()
    assert np.all(np.diff(total) > 0), total
    assert total[-1] > s["grad_norm"].max()  # more than any one step's own gradient
    assert list(s["carried_grad"]) == [False, True, True, True, True]
    assert not s["changed"].any()
    assert s["used"].all() and s["requires_grad"].all()
    row = meta.params.set_index("name").loc[MEM]
    assert pd_na(row["optimizer"]) and row["used_steps"] == 5 and row["changed_steps"] == 0


def test_meta_memory_findings(meta):
    codes = [(f.code, f.severity, f.params) for f in meta.findings]
    assert codes == [("orphan", "error", (MEM,)), ("grad_not_cleared", "warning", (MEM,))]
    assert meta.worst() == "error" and meta.fails("error")
    assert "`module.`" in meta.findings[0].message + meta.findings[0].fix


def test_meta_memory_trained_tensors_change(meta):
    p = meta.params
    trained = p[p["optimizer"].notna()]
    assert len(trained) == 8
    assert (trained["changed_steps"] == 5).all() and (trained["used_steps"] == 5).all()


# ------------------------------------------------------------------ finetune_heads (second seed)
def test_finetune_heads_exactly_the_dead_heads_are_unused(finetune):
    verdicts = finetune.verdicts()
    dead = {n for n in verdicts if n.startswith(DEAD_PREFIXES)}
    assert dead == {"encoder.readout_atom.weight", "encoder.readout_atom.bias",
                    "vocab_head.weight", "vocab_head.bias",
                    "cmim_decoder.0.weight", "cmim_decoder.0.bias",
                    "cmim_decoder.2.weight", "cmim_decoder.2.bias"}
    assert {n: v for n, v in verdicts.items() if n in dead} == {n: {"unused"} for n in dead}
    assert {n: v for n, v in verdicts.items() if n not in dead} == {
        n: {"ok"} for n in verdicts if n not in dead}


def test_finetune_heads_advice(finetune):
    p = finetune.params
    dead_bytes = int(p.loc[p["name"].str.startswith(DEAD_PREFIXES), "bytes"].sum())
    fup = finetune.advice["find_unused_parameters"]
    assert fup["value"] is True
    assert fup["unused_bytes"] == dead_bytes > 0
    assert set(fup["unused"]) == set(p.loc[p["name"].str.startswith(DEAD_PREFIXES), "name"])
    assert fup["intermittent"] == []
    assert finetune.advice["static_graph"]["value"] is True


def test_finetune_heads_findings_one_per_dead_subtree(finetune):
    found = sorted((f.code, f.module, f.count) for f in finetune.findings)
    assert found == [("unused", "cmim_decoder", 4), ("unused", "encoder.readout_atom", 2),
                     ("unused", "vocab_head", 2)]
    assert finetune.worst() == "warning"
    assert not finetune.fails("error") and finetune.fails("warning")


def test_finetune_heads_loads_the_committed_checkpoint():
    setup = diagkit.load_target("diagkit.demos:finetune_heads")
    state = torch.load(REPO / "data" / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    model_state = setup.model.state_dict()
    for key, value in state.items():
        assert torch.equal(model_state[key], value), key


# ------------------------------------------------------------------ clean
def test_clean_is_all_ok(clean):
    assert set(map(frozenset, clean.verdicts().values())) == {frozenset({"ok"})}
    assert clean.findings == []
    assert clean.worst() is None and not clean.fails("info")
    assert clean.advice["find_unused_parameters"]["value"] is False
    assert clean.advice["static_graph"]["value"] is True
    assert (clean.params["used_steps"] == 5).all() and (clean.params["changed_steps"] == 5).all()


def test_demo_steps_argument():
    diag = diagkit.diagnose(diagkit.load_target("diagkit.demos:clean", steps=2))
    assert diag.meta["steps_observed"] == 2
    assert set(diag.steps["step"]) == {0, 1}


# ------------------------------------------------------------------ committed data
# Matrix kernels round differently on different CPUs, and a few AdamW steps carry that into
# the state: the committed file, made on another machine, differs from a rebuild on an AMD EPYC
# by up to 9.4 float32 steps of a tensor's largest element. Allow 64 of them, no more.
ULPS = 64


def within_ulps(a: torch.Tensor, b: torch.Tensor, ulps: int = ULPS) -> bool:
    """Same dtype and shape, and every element within `ulps` float steps of the tensor's
    largest magnitude (exactly equal for integer tensors)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    scale = float(torch.maximum(a.abs().max(), b.abs().max())) if a.numel() else 0.0
    return bool(((a - b).abs() <= ulps * torch.finfo(a.dtype).eps * scale).all())


def assert_same_state(expected: dict, got: dict) -> None:
    """What the demo promises of its checkpoint: the names in order, each dtype and shape
    exactly, and values within a few ulps (trained floats are not bitwise across CPUs)."""
    assert list(expected) == list(got)
    for key in got:
        assert expected[key].dtype == got[key].dtype, key
        assert expected[key].shape == got[key].shape, key
        assert within_ulps(expected[key], got[key]), key


def finetune_verdicts(state: dict, folder: Path) -> dict:
    path = folder / "state.pt"
    torch.save(state, path)
    return diagkit.diagnose(diagkit.load_target("diagkit.demos:finetune_heads",
                                                checkpoint=str(path)), steps=2).verdicts()


def test_committed_pretrain_checkpoint_matches_its_generator(tmp_path):
    committed = torch.load(REPO / "data" / CHECKPOINT_NAME, map_location="cpu",
                           weights_only=True)
    rebuilt = build_pretrain_state()
    assert_same_state(committed, rebuilt)
    # ... and leads to exactly the verdicts the committed file leads to.
    assert finetune_verdicts(rebuilt, tmp_path) == finetune_verdicts(committed, tmp_path)


def test_the_checkpoint_check_holds_where_rounding_differs(tmp_path):
    """Another CPU's kernels give values one ulp off: still the same state, same verdicts;
    a real difference is still caught."""
    rebuilt = build_pretrain_state()
    up = {k: torch.nextafter(v, torch.full_like(v, math.inf)) if v.is_floating_point() else v
          for k, v in rebuilt.items()}
    assert any(not torch.equal(up[k], rebuilt[k]) for k in rebuilt)
    assert_same_state(rebuilt, up)
    assert finetune_verdicts(up, tmp_path) == finetune_verdicts(rebuilt, tmp_path)
    key = next(k for k, v in rebuilt.items() if v.is_floating_point() and v.numel() > 1)
    moved = rebuilt[key].clone()
    moved.view(-1)[0] += 1e-3
    assert not within_ulps(rebuilt[key], moved)
    assert not within_ulps(rebuilt[key], rebuilt[key].double())


def test_pretrain_state_is_deterministic():
    a, b = build_pretrain_state(), build_pretrain_state()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = build_pretrain_state(seed=1)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def pd_na(value) -> bool:
    import pandas as pd
    return value is pd.NA or (isinstance(value, float) and np.isnan(value))
