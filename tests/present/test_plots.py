"""Figures of the presenting layer: on the demos, on empty runs, on hostile names, at scale
(the shared results are in tests/helpers/samples.py)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from matplotlib.text import Annotation

import diagkit
from diagkit.present import matrix, plots
from diagkit.present.figure import LABEL_WIDTH
from samples import HOSTILE, MEM, ORPHANS, demo, failing_run, hostile_diag, synthetic


# ------------------------------------------------------------------ shared data


def render(fig) -> None:
    """Draw the figure, as saving it into a report does, turning every warning into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.savefig(io.BytesIO(), format="png", dpi=50)


def named_lines(ax) -> list[str]:
    return [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def texts(fig) -> str:
    ax = fig.axes[0]
    return "\n".join([t.get_text() for t in ax.texts] + [ax.get_title()])


# ------------------------------------------------------------------ gradient norms
def test_orphan_is_labelled_annotated_and_rising():
    d = demo("meta_memory")
    fig = plots.grad_norm_figure(d.steps, d.params)
    render(fig)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = named_lines(ax)
    mem = [ln for ln in ax.get_lines() if ln.get_label().startswith(MEM)]
    assert len(mem) == 1 and "orphan" in mem[0].get_label()
    assert np.all(np.diff(mem[0].get_ydata()) > 0)  # the .grad the optimizer sees keeps rising
    notes = [a.get_text() for a in ax.texts if isinstance(a, Annotation)]
    assert any("mem_tokens" in t and "orphan" in t and "never cleared" in t for t in notes)
    # the eight trained tensors are the grey median/band, not eight more named lines
    assert sum("other tensors" in lb for lb in labels) == 1
    assert len(labels) == 2


@pytest.mark.parametrize("name", ["meta_memory", "finetune_heads", "clean"])
@pytest.mark.parametrize("figure", ["grad_norm_figure", "update_ratio_figure"])
def test_step_figures_on_demos(name, figure):
    d = demo(name)
    fig = getattr(plots, figure)(d.steps, d.params, top=3)
    render(fig)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() == "step" and ax.get_ylabel()
    assert ax.get_yscale() == "log"
    assert 6 <= fig.get_figwidth() <= 12 and 3 <= fig.get_figheight() <= 8
    solid = [lb for lb in named_lines(ax) if "other tensor" not in lb and not lb.startswith("0:")]
    assert 1 <= len(solid) <= 3
    for line in ax.get_lines():  # nothing non-positive reaches the log axis
        y = np.asarray(line.get_ydata(), dtype=float)
        assert not (y[np.isfinite(y)] <= 0).any()


def test_unused_tensors_are_counted_not_drawn():
    d = demo("finetune_heads")
    fig = plots.grad_norm_figure(d.steps, d.params)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("8 flagged tensors without gradient" in t and "unused: 8" in t for t in legend)
    assert not any("cmim_decoder" in t for t in legend)


def test_update_ratio_puts_never_changing_tensors_on_a_floor():
    d = demo("meta_memory")
    fig = plots.update_ratio_figure(d.steps, d.params)
    render(fig)
    ax = fig.axes[0]
    mem = next(ln for ln in ax.get_lines() if ln.get_label().startswith(MEM))
    floor = next(ln for ln in ax.get_lines() if ln.get_label().startswith("0: no change"))
    y = np.asarray(mem.get_ydata(), dtype=float)
    assert np.all(y == floor.get_ydata()[0]) and y[0] > 0
    trained = d.params.loc[d.params["update_ratio"] > 0, "update_ratio"]
    assert y[0] < trained.min() and ax.get_ylim()[0] > 0
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    # the frozen base (no optimizer, no grad: 8 weights and 3 zero LayerNorm biases) is
    # checked without a copy: changed or not, never a ratio (docs/cost.md)
    assert "11 tensors checked without a copy (changed or not, no ratio)" in legend
    assert not any("never changed" in t or "value norm 0" in t for t in legend)


# ------------------------------------------------------------------ wiring matrix
def test_wiring_matrix_flagged_rows_first():
    d = demo("finetune_heads")
    fig = matrix.wiring_matrix_figure(d.params)
    render(fig)
    ax = fig.axes[0]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert len(rows) == len(d.params)
    dead = ("vocab_head.", "encoder.readout_atom.", "cmim_decoder.")
    assert all(r.startswith(dead) for r in rows[:8])
    assert not any(r.startswith(dead) for r in rows[8:])
    assert rows[0] == "vocab_head.weight"  # the largest of them
    assert [t.get_text() for t in ax.get_xticklabels()] == list(matrix.MATRIX_COLUMNS)
    cells = [t.get_text() for t in ax.texts]
    assert cells[:4] == ["yes", "yes", "0/5", "0/5"]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()


def test_wiring_matrix_aggregates_past_max_rows():
    d = demo("finetune_heads")
    fig = matrix.wiring_matrix_figure(d.params, max_rows=5)
    render(fig)
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(rows) == 5 + 3  # five flagged tensors, then encoder, ffn_head, cmim_decoder
    assert "encoder (12 tensors)" in rows[5:] and "ffn_head (4 tensors)" in rows[5:]
    assert sum(int(r.rsplit("(", 1)[1].split()[0]) for r in rows[5:]) == len(d.params) - 5
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert "92%" in cells  # 11 of encoder's 12 remaining tensors are used


def test_wiring_matrix_truncates_long_names_from_the_left():
    d = demo("meta_memory")
    fig = matrix.wiring_matrix_figure(d.params)
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert rows[0] == MEM
    long = [r for r in rows if r.startswith("…")]
    assert long and all(len(r) == LABEL_WIDTH for r in long)
    assert "…dule.metamodel.model.layers.0.norm.weight" in rows


# ------------------------------------------------------------------ empty, hostile, large
def test_no_step_completed_says_no_data():
    d = failing_run(0)
    assert d.steps.empty and d.failure is not None
    for figure in (plots.grad_norm_figure, plots.update_ratio_figure):
        fig = figure(d.steps, d.params)
        render(fig)
        assert "no data" in texts(fig)
        assert fig.axes[0].get_xlabel() == "step"
    fig = matrix.wiring_matrix_figure(d.params)
    render(fig)
    assert "no step completed" in fig.axes[0].get_title()
    assert [t.get_text() for t in fig.axes[0].texts][:4] == ["yes", "yes", "n/a", "n/a"]
    # an empty table of parameters, too
    fig = matrix.wiring_matrix_figure(d.params.iloc[:0])
    render(fig)
    assert "no data" in texts(fig)
    fig = plots.grad_norm_figure(d.steps.iloc[:0], d.params.iloc[:0])
    assert "no data" in texts(fig)


def test_update_ratio_under_delta_off_says_why_it_is_empty():
    d = diagkit.diagnose(diagkit.load_target("diagkit.demos:clean"), steps=2, delta="off")
    fig = plots.update_ratio_figure(d.steps, d.params)
    render(fig)
    assert 'change norms not measured (delta="off")' in texts(fig)


def test_steps_before_a_failure_are_drawn():
    d = failing_run(2)
    fig = plots.grad_norm_figure(d.steps, d.params)
    render(fig)
    lines = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert lines and all(list(ln.get_xdata()) == [0, 1] for ln in lines)


def test_hostile_names_draw_as_text():
    d = hostile_diag()
    params, steps = d.params.copy(), d.steps.copy()
    rename = {n: n.replace("0.", "$\\frac{a$_") for n in params["name"] if n.startswith("0.")}
    params["name"] = params["name"].replace(rename)
    steps["name"] = steps["name"].replace(rename)
    for fig in (plots.grad_norm_figure(steps, params), plots.update_ratio_figure(steps, params),
                matrix.wiring_matrix_figure(params)):
        render(fig)  # an unbalanced `$` in a name would break mathtext if it were parsed
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert f"{HOSTILE}.weight" in rows


def test_large_run_stays_bounded():
    params, steps = synthetic()
    top = 8
    fig = plots.grad_norm_figure(steps, params, top=top)
    ax = fig.axes[0]
    labels = named_lines(ax)
    assert len(ax.get_lines()) <= 2 * top + 1  # solid + dashed per named tensor, one median
    assert len(labels) <= top + 1
    for i in plots_orphans(params):
        assert any(lb.startswith(i) for lb in labels)
    assert any("of 1982 other tensors" in lb for lb in labels)  # 2000 - 18 flagged
    render(fig)

    fig = plots.update_ratio_figure(steps, params, top=top)
    assert len(fig.axes[0].get_lines()) <= top + 2
    render(fig)

    fig = matrix.wiring_matrix_figure(params, max_rows=40)
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(rows) <= 40 + matrix.MAX_GROUPS
    assert sum(not r.endswith("tensors)") for r in rows) == 18  # every flagged tensor
    assert any(r.startswith("(other modules)") for r in rows)
    render(fig)


def plots_orphans(params) -> list[str]:
    return [params["name"].iloc[i] for i in ORPHANS]


# ------------------------------------------------------------------ the timeline
def spans_frame():
    import pandas as pd
    return pd.DataFrame([
        {"code": "decay_on_norm_or_bias", "severity": "info", "module": "norm", "since": 1,
         "until": 40, "ended": None},
        {"code": "grad_not_cleared", "severity": "warning", "module": "head", "since": 12,
         "until": 40, "ended": None},
        {"code": "orphan", "severity": "error", "module": "head", "since": 12, "until": 40,
         "ended": None},
        {"code": "unused", "severity": "warning", "module": "", "since": 3, "until": 9,
         "ended": 10},
    ])


def test_the_timeline_lists_errors_first_and_its_legend_covers_no_bar():
    """An info finding was listed above the error, and the legend of the wiring changes sat
    in the axes' corner, over the bars that reach the end of the run."""
    from diagkit.present import timeline
    events = [{"step": 12, "what": "head replaced"}]
    fig = timeline.timeline_figure(spans_frame(), events, 40)
    render(fig)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "orphan: head", "unused: (model)", "grad_not_cleared: head",
        "decay_on_norm_or_bias: norm"]
    legend = ax.get_legend().get_window_extent()
    axes_box = ax.get_window_extent()
    assert legend.x0 >= axes_box.x1                       # beside the axes, not over them
    for bar in ax.patches:
        assert not bar.get_window_extent().overlaps(legend)
    alt = timeline.timeline_alt(spans_frame(), events)
    assert alt.startswith("Timeline of the findings over the run: error orphan in head from "
                          "step 12 to the end; warning unused in the model from step 3 to "
                          "step 9 (ended)")
    assert alt.endswith("Wiring changes at step 12.")
    assert "no finding held" in timeline.timeline_alt(spans_frame().iloc[:0], [])
