"""Checkpoint comparison (`diagkit.compare`, SPEC 4 `diagkit compare`, 5, 6): what changed
between two saves, on the meta_memory demo's checkpoints (the pair compared once, for the
module), how it is presented, and what is written. Hand-made files, bad input and streaming
memory are test_compare_files.py; the compare notebook under papermill and the command line,
test_compare_notebook.py."""

from __future__ import annotations

import json
import math

import pytest
import torch
from matplotlib.figure import Figure
from safetensors.torch import save_file

from checkpoint_pairs import MEM, STEP2, STEP5, codes_of, saved_model, status_of
from diagkit.measure.checkpoints import diff as checkpoint_diff
from diagkit.present import comparison
from diagkit.run.workbook import compare
from diagkit.present.text import comparison_text
from diagkit.run.workbook.compare import compare_checkpoints

TRAINED = ("module.hypernet.", "module.metalora.", "module.lm_head.")


@pytest.fixture(scope="module")
def demo():
    return compare_checkpoints(STEP2, STEP5)


# ------------------------------------------------------------------ the demo pair
def test_demo_data_are_two_small_weights_only_saves_of_the_demo():
    for path, step in ((STEP2, 2), (STEP5, 5)):
        assert path.stat().st_size < 200_000
        obj = torch.load(path, map_location="cpu", weights_only=True)
        assert obj["step"] == step and set(obj) == {"model", "optimizer", "step"}
        assert MEM in obj["model"]
    assert not torch.equal(saved_model(STEP2)["module.lm_head.weight"],
                           saved_model(STEP5)["module.lm_head.weight"])


def test_demo_pair_names_mem_tokens_in_one_unchanged_finding_per_subtree(demo):
    status = status_of(demo)
    assert status[MEM] == "unchanged"
    backbone = [n for n in status if n.startswith("module.metamodel.")]
    assert len(backbone) == 12 and all(status[n] == "unchanged" for n in backbone)
    unchanged = [f for f in demo.findings if f.code == "unchanged"]
    assert len(unchanged) == 1  # the frozen backbone and mem_tokens: one subtree, one finding
    f = unchanged[0]
    assert f.severity == "warning" and f.module == "module.metamodel"
    assert set(f.params) == set(backbone) and f.count == 12
    assert f.bytes == int(demo.table.loc[demo.table["name"].isin(backbone), "bytes"].sum())
    assert MEM in f.message  # the hand-added tensor is named, not only counted
    assert "module.metamodel.model.embed.weight" not in f.message
    assert "optimizer" in f.fix and "module." in f.fix
    assert demo.worst() == "warning"
    assert demo.fails("warning") and demo.fails("info") and not demo.fails("error")
    assert not demo.fails("never")


def test_demo_pair_trained_tensors_changed(demo):
    t = demo.table.set_index("name")
    trained = [n for n in t.index if n.startswith(TRAINED)]
    assert len(trained) == 8
    for name in trained:
        row = t.loc[name]
        assert row["status"] == "changed" and not row["identical"]
        assert 0 < row["relative_change"] < 1
        assert row["max_abs_diff"] > 0
        assert math.isclose(row["relative_change"], row["delta_norm"] / row["norm_a"])
    a, b = saved_model(STEP2)["module.lm_head.weight"], saved_model(STEP5)["module.lm_head.weight"]
    row = t.loc["module.lm_head.weight"]
    assert math.isclose(row["delta_norm"], float((b.double() - a.double()).norm()), rel_tol=1e-9)
    assert math.isclose(row["norm_a"], float(a.double().norm()), rel_tol=1e-9)
    assert math.isclose(row["max_abs_diff"], float((b.double() - a.double()).abs().max()))
    assert t.loc[MEM, "relative_change"] == 0 and t.loc[MEM, "norm_a"] > 0
    s = demo.summary
    assert (s["tensors"], s["changed"], s["unchanged"], s["only_in_a"], s["only_in_b"]) == \
        (20, 8, 12, 0, 0)
    assert s["bytes"] == int(demo.table["bytes"].sum()) > 0


def test_table_columns_and_shapes(demo):
    assert list(demo.table.columns) == list(checkpoint_diff.COLUMNS)
    for col in ("name", "module", "in_a", "in_b", "shape_a", "shape_b", "dtype_a", "dtype_b",
                "numel", "bytes", "identical", "max_abs_diff", "delta_norm", "norm_a",
                "relative_change"):
        assert col in demo.table.columns
    row = demo.table.set_index("name").loc[MEM]
    assert row["shape_a"] == row["shape_b"] == (4, 32)
    assert row["dtype_a"] == "torch.float32" and row["numel"] == 128 and row["bytes"] == 512
    assert row["module"] == "module.metamodel.model"


def test_render_text_and_strict_json(demo):
    text = comparison_text(demo)
    first = text.splitlines()[0]
    assert str(STEP2) in first and str(STEP5) in first and "12 unchanged" in first
    assert "[warning] unchanged: module.metamodel" in text and MEM in text and "fix:" in text
    payload = demo.to_json_dict()
    json.dumps(payload, allow_nan=False)
    assert payload["worst"] == "warning" and len(payload["tensors"]) == 20
    assert payload["findings"][0]["code"] == "unchanged"
    mem = next(r for r in payload["tensors"] if r["name"] == MEM)
    assert mem["shape_a"] == [4, 32] and mem["identical"] is True


def test_module_prefix_on_one_side_aligns(tmp_path, demo):
    bare = tmp_path / "bare.pt"
    torch.save({k.removeprefix("module."): v for k, v in saved_model(STEP5).items()}, bare)
    forward = compare_checkpoints(STEP2, bare)
    assert status_of(forward) == status_of(demo)  # A's spelling kept: module.…
    assert forward.table["in_a"].all() and forward.table["in_b"].all()
    backward = compare_checkpoints(bare, STEP2)
    assert set(backward.table["name"]) == {n.removeprefix("module.") for n in status_of(demo)}
    assert status_of(backward)["metamodel.model.mem_tokens"] == "unchanged"
    assert backward.summary["changed"] == 8


def test_safetensors_and_pt_of_the_same_weights_are_identical(tmp_path, demo):
    st2, st5 = tmp_path / "step2.safetensors", tmp_path / "step5.bin"  # .bin: found by content
    save_file(saved_model(STEP2), str(st2))
    save_file(saved_model(STEP5), str(st5))
    same = compare_checkpoints(STEP2, st2)
    assert set(same.table["status"]) == {"unchanged"} and codes_of(same) == ["nothing_changed"]
    assert same.table["dtype_b"].eq("torch.float32").all()
    mixed = compare_checkpoints(st2, STEP5)
    assert status_of(mixed) == status_of(demo)
    both = compare_checkpoints(st2, st5)
    assert status_of(both) == status_of(demo)
    t, d = both.table.set_index("name"), demo.table.set_index("name")
    assert (t["delta_norm"] - d["delta_norm"]).abs().max() == 0


def test_extra_tensor_and_missing_tensor_are_reported(tmp_path, demo):
    state = saved_model(STEP5)
    state["module.new_head.weight"] = torch.ones(3, 4)
    state["module.new_head.bias"] = torch.zeros(3)
    del state["module.lm_head.bias"]
    extra = tmp_path / "extra.pt"
    torch.save({"state_dict": state}, extra)
    cmp = compare_checkpoints(STEP2, extra)
    status = status_of(cmp)
    assert status["module.new_head.weight"] == status["module.new_head.bias"] == "only_in_b"
    assert status["module.lm_head.bias"] == "only_in_a"
    only_b = next(f for f in cmp.findings if f.code == "only_in_b")
    assert only_b.severity == "info" and only_b.module == "module.new_head"
    assert set(only_b.params) == {"module.new_head.weight", "module.new_head.bias"}
    assert only_b.bytes == 12 * 4 + 3 * 4 and str(extra) in only_b.message
    only_a = next(f for f in cmp.findings if f.code == "only_in_a")
    assert only_a.params == ("module.lm_head.bias",)
    row = cmp.table.set_index("name").loc["module.new_head.weight"]
    assert not row["in_a"] and row["in_b"] and row["shape_a"] is None
    assert math.isnan(row["relative_change"])
    json.dumps(cmp.to_json_dict(), allow_nan=False)  # NaN -> null


# ------------------------------------------------------------------ presenting
def test_change_figure_marks_unchanged_tensors(demo):
    fig = comparison.change_figure(demo)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "unchanged (bitwise identical)" in labels and "changed" in labels
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ticks) == 20 and any(t.endswith("mem_tokens") for t in ticks)
    marked = next(c for c in ax.collections if c.get_label().startswith("unchanged"))
    assert len(marked.get_offsets()) == 12


def test_write_outputs(tmp_path, demo):
    assert compare.write_outputs(demo, "") == []
    written = compare.write_outputs(demo, str(tmp_path / "out"))
    assert written == ["comparison.csv", "findings.json"]
    csv = (tmp_path / "out" / "comparison.csv").read_text().splitlines()
    assert len(csv) == 21 and csv[0].startswith("name,module,status")
    findings = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert findings["worst"] == "warning" and findings["summary"]["unchanged"] == 12
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == written  # no temp left
