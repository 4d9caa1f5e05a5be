"""The fix preview (`diagkit.run.diagnose.try_fix`): each kind of fix, tried on a fresh copy of a real
target, turns its verdict ok; a fix that does not help is named; the user's objects are never
changed; the notebook's `try_fix` cell runs under papermill."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
import pytest
import torch

import fix_targets
from diagkit import DiagkitError
from diagkit.present.fix_preview import preview_html, render_preview
from diagkit.run.workbook import notebook
from diagkit.run.diagnose.try_fix import try_fixes

TESTS = Path(__file__).resolve().parents[2]
TARGETS = "fix_targets"  # on sys.path: tests/conftest.py puts tests/helpers/ there (as `models`)
NOTEBOOK = TESTS.parent / "notebooks" / "diagnose.ipynb"


def preview_of(name: str, **kwargs):
    return try_fixes(f"{TARGETS}:{name}", kwargs)


def rows_by_code(preview) -> dict:
    return {(r["code"], r["module"]): r for r in preview.rows}


def test_orphan_joins_its_neighbours_group():
    p = preview_of("orphan")
    row = rows_by_code(p)[("orphan", "fc2.bias")]
    assert row["action"] == "join_group" and (row["optimizer"], row["group"]) == (0, 1)
    assert row["after"] == ("ok",) and row["helped"]
    after = p.after.params.set_index("name")
    # it joined fc2.weight's group (its lr, no decay), and it trains now
    assert after.loc["fc2.bias", "lr"] == 0.05 and after.loc["fc2.bias", "weight_decay"] == 0.0
    assert after.loc["fc2.bias", "changed_steps"] > 0
    # its grad_not_cleared goes with the orphan's fix; AdamW adds 2 x 4 B for its 3 elements
    assert rows_by_code(p)[("grad_not_cleared", "fc2.bias")]["action"] == "covered"
    assert row["added_bytes"] == 2 * 4 * 3
    assert p.all_ok and not p.after.findings


def test_unused_is_frozen_and_dropped_and_its_state_counted():
    p = preview_of("unused")
    (row,) = p.rows
    assert (row["code"], row["module"], row["after"]) == ("unused", "dead", ("ok",))
    after = p.after.params.set_index("name")
    assert not after.loc["dead.weight", "requires_grad"]
    assert after.loc[["dead.weight", "dead.bias"], "optimizer"].isna().all()
    assert p.state_bytes_saved == 1 * 4 * (4 * 2 + 2)  # SGD momentum: 1 slot per element
    assert p.find_unused_parameters is False and p.all_ok


def test_frozen_in_optimizer_is_dropped():
    p = preview_of("frozen_in_optimizer")
    (row,) = p.rows
    assert row["code"] == "frozen_in_optimizer" and row["helped"]
    assert p.after.params.set_index("name").loc[["fc1.weight", "fc1.bias"], "optimizer"] \
        .isna().all()
    assert p.state_bytes_saved == 2 * 4 * (4 * 5 + 5)  # Adam: exp_avg + exp_avg_sq, float32


def test_norm_and_bias_move_to_a_no_decay_group():
    p = preview_of("decay_on_norm")
    assert {r["code"] for r in p.rows} == {"decay_on_norm_or_bias"} and p.all_ok
    after = p.after.params.set_index("name")
    for name in ("ln.weight", "ln.bias", "fc.bias"):
        assert after.loc[name, "weight_decay"] == 0.0 and after.loc[name, "lr"] == 0.01
    assert after.loc["fc.weight", "weight_decay"] == 0.1


def test_in_multiple_optimizers_keeps_the_first():
    p = preview_of("in_two_optimizers")
    (row,) = p.rows
    assert row["code"] == "in_multiple_optimizers" and row["helped"]
    after = p.after.params.set_index("name")
    assert list(after.loc["fc2.weight", "memberships"]) == [(0, 0)]


def test_not_in_model_is_dropped_from_the_optimizer():
    p = preview_of("stale_tensor")
    codes = {r["code"]: r for r in p.rows}
    assert codes["not_in_model"]["after"] == ("gone",) and codes["not_in_model"]["helped"]
    assert not p.after.params["name"].str.startswith("<optimizer").any()
    assert p.all_ok


def test_a_fix_that_does_not_help_is_named():
    """The orphan's neighbours have lr 0: put with them, it is stalled, not ok."""
    p = preview_of("orphan", lr=0.0)
    row = rows_by_code(p)[("orphan", "fc2.bias")]
    assert row["after"] == ("stalled",) and not row["helped"]
    stalled = rows_by_code(p)[("stalled", "fc2.weight")]
    assert not stalled["automatic"] and stalled["applied"] == "no automatic fix"
    text = render_preview(p)
    assert "orphan -> stalled (did not help)" in text
    assert "did not help: the fix of orphan on fc2.bias" in text
    assert "stalled -> stalled (no automatic fix)" in text
    assert not p.all_ok and p.fails("error")


def test_the_users_objects_are_never_changed():
    built = fix_targets.BUILT  # a module target: the module the test imported
    built.clear()
    p = preview_of("unused")
    assert p.all_ok
    (first, taken), (second, _) = built  # the run as it is, then the fresh copy
    model, opt = first["model"], first["optimizer"]
    now = fix_targets.snapshot(model, [opt])
    for name, value in taken["state"].items():
        assert torch.equal(now["state"][name], value), name  # bitwise
    assert now == {**taken, "state": now["state"]}  # flags, groups by identity, no state
    assert model.dead.weight.requires_grad and len(opt.state) == 0
    # the fresh copy is the one that was fixed
    assert second["model"] is not model and not second["model"].dead.weight.requires_grad


def test_a_target_that_returns_the_same_objects_is_refused():
    with pytest.raises(DiagkitError, match="same model or optimizer on every call"):
        preview_of("shared")


def test_html_is_escaped():
    p = preview_of("unused")
    object.__setattr__(p, "target", "<b>x</b>")
    html = preview_html(p)
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert "unused" in html and "frozen (requires_grad_(False))" in html


def test_try_fix_refused_with_meta_or_a_saved_diagnosis():
    with pytest.raises(DiagkitError, match="'try_fix'.*'meta'"):
        notebook.validate({"try_fix": True, "meta": True})
    with pytest.raises(DiagkitError, match="try_fix' needs a target"):
        notebook.validate({"try_fix": True, "diagnosis": "somewhere"})


def test_the_notebook_cell_shows_the_preview(tmp_path):
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(out), kernel_name="python3",
                               progress_bar=False, cwd=str(tmp_path),
                               parameters={"target": "diagkit.demos:finetune_heads", "steps": 2,
                                           "try_fix": True, "interactive": False})
    nb = nbformat.read(out, as_version=4)
    html = "".join(o.get("data", {}).get("text/html", "") for c in nb.cells
                   if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Fix preview: diagkit.demos:finetune_heads" in html
    assert html.count("frozen (requires_grad_(False)), dropped from the optimizer") == 3
    assert "every finding is ok after the fixes" in html
