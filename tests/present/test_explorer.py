"""The notebook explorer: filters, selection, plot data, escaping, empty and large tables, and
the widget wiring (ipywidgets models work without a kernel)."""

from __future__ import annotations

import base64
import io
import time
import warnings

import ipywidgets as widgets
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

import diagkit
from diagkit.present.explorer import Explorer, explore
from diagkit.present.explorer_state import MAX_LINES, MAX_OPTIONS, METRICS, ExplorerState
from diagkit.core.schema import PARAMS_COLUMNS, STEPS_COLUMNS

MEM = "module.metamodel.model.mem_tokens"
CMIM = ["cmim_decoder.0.weight", "cmim_decoder.0.bias", "cmim_decoder.2.weight",
        "cmim_decoder.2.bias"]


@pytest.fixture(scope="module")
def hostile():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2))
    model.add_module("<script>x", nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return diagkit.diagnose(model, opt, batch_fn=lambda: torch.randn(4, 2),
                            loss_fn=lambda m, b: m(b).pow(2).mean(), steps=2)


def lines_of(fig: Figure) -> dict[str, np.ndarray]:
    """label prefix (the tensor name) -> y data of each plotted line."""
    ax = fig.axes[0]
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    return {label.split(" [")[0].split(" (")[0]: np.asarray(line.get_ydata(), dtype=float)
            for label, line in zip(labels, ax.get_lines())}


def png_of(plot) -> bytes:
    """The PNG an explorer's plot (an HTML <img> with a data URL) shows."""
    return base64.b64decode(plot.value.split("base64,", 1)[1].split("'", 1)[0])


def figure_text(fig: Figure) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


# ------------------------------------------------------------------ filters
def test_verdict_filter_orphan_is_only_mem_tokens(meta):
    state = ExplorerState.from_diagnosis(meta)
    assert len(state.filtered_params()) == 20
    state.verdicts = {"orphan"}
    assert state.filtered_params()["name"].tolist() == [MEM]
    state.verdicts = {"orphan", "ok"}
    assert len(state.filtered_params()) == 20
    state.verdicts = {"stalled"}                 # a verdict no tensor has: nothing matches
    assert state.filtered_params().empty
    assert "0 of 20 tensors match" in state.message
    state.verdicts = set()
    assert len(state.filtered_params()) == 20
    assert ("orphan (1)", "orphan") in state.verdict_choices()


def test_module_prefix_is_a_dotted_subtree(finetune):
    state = ExplorerState.from_diagnosis(finetune)
    state.module_prefix = "cmim_decoder"
    assert sorted(state.filtered_params()["name"]) == sorted(CMIM)
    state.module_prefix = "cmim_decoder."          # a trailing dot means the same subtree
    assert sorted(state.filtered_params()["name"]) == sorted(CMIM)
    state.module_prefix = "cmim"                   # not a module: no partial-word matches
    assert state.filtered_params().empty
    assert "no module is named 'cmim'" in state.message
    state.module_prefix = "encoder.layers.1"
    assert set(state.filtered_params()["module"]) == {"encoder.layers.1.0", "encoder.layers.1.1"}
    assert "cmim_decoder" in state.module_choices()
    assert "encoder.layers" in state.module_choices()


def test_regex_filter_and_invalid_regex_is_reported_not_raised(finetune):
    state = ExplorerState.from_diagnosis(finetune)
    state.name_regex = r"head\.\d\.bias$"
    assert set(state.filtered_params()["name"]) == {"ffn_head.0.bias", "ffn_head.2.bias"}
    state.module_prefix = "cmim_decoder"
    state.name_regex = r"weight"
    assert set(state.filtered_params()["name"]) == {"cmim_decoder.0.weight",
                                                     "cmim_decoder.2.weight"}
    state.name_regex = "weight(["                   # invalid: reported, filters nothing
    assert state.regex_error and "invalid regex" in state.message
    assert sorted(state.filtered_params()["name"]) == sorted(CMIM)
    state.name_regex = "bias"
    assert state.regex_error is None and "invalid" not in state.message
    assert set(state.filtered_params()["name"]) == {"cmim_decoder.0.bias", "cmim_decoder.2.bias"}


def test_problems_come_first_and_default_selection_is_problem_tensors(finetune, meta):
    state = ExplorerState.from_diagnosis(finetune, top=6)
    names = state.filtered_params()["name"].tolist()
    unused = [n for n, v in finetune.verdicts().items() if "unused" in v]
    assert len(unused) == 8
    assert set(names[:8]) == set(unused)
    # unused tensors have no grad_norm: the default plots tensors that have one, and says why
    assert not set(state.selected) & set(unused) and len(state.selected) == 6
    grad = state.params.set_index("name").loc[state.selected, "grad_norm"]
    assert list(grad) == sorted(grad, reverse=True)
    assert "not plotted: 8 problem tensors (unused) without grad_norm" in state.message
    assert "switch the metric to delta_norm" in state.message
    state.metric = "delta_norm"                        # they never change: 0 is data
    assert set(state.selected) <= set(unused) and len(state.selected) == 6
    assert state.selected == names[:6]                 # model order within a severity
    assert "not plotted" not in state.message

    m = ExplorerState.from_diagnosis(meta, top=4)
    assert m.selected[0] == MEM
    # then ok tensors that have data for the metric, largest first (not the frozen backbone)
    rest = m.params.set_index("name").loc[m.selected[1:], "grad_norm"]
    assert rest.notna().all() and list(rest) == sorted(rest, reverse=True)


def test_explicit_selection_is_kept_while_it_passes_the_filters(finetune):
    state = ExplorerState.from_diagnosis(finetune)
    state.selected = ["ffn_head.0.bias", "encoder.embed.weight"]
    assert state.selected == ["ffn_head.0.bias", "encoder.embed.weight"]
    state.metric = "delta_norm"                       # not a filter: the choice stays
    assert state.selected == ["ffn_head.0.bias", "encoder.embed.weight"]
    state.module_prefix = "ffn_head"
    assert state.selected == ["ffn_head.0.bias"]
    state.module_prefix = "cmim_decoder"              # nothing picked passes: the default
    assert sorted(state.selected) == sorted(CMIM)
    state.module_prefix = ""
    assert state.selected == ["ffn_head.0.bias", "encoder.embed.weight"]
    state.selected = []
    assert state.selected == state.default_selection()


def test_taking_the_last_pick_off_says_the_plot_is_back_to_the_default(finetune):
    """A ctrl-click on the last picked tensor empties the pick: the plot silently showed the
    default again; the status line now says so, until something is picked again."""
    state = ExplorerState.from_diagnosis(finetune)
    assert "no tensor is picked now" not in state.message
    state.selected = ["ffn_head.0.bias"]
    assert "no tensor is picked now" not in state.message
    state.selected = []
    assert state.selected == state.default_selection()
    assert "no tensor is picked now: the plot is back to the default selection" in state.message
    state.selected = ["encoder.embed.weight"]
    assert "no tensor is picked now" not in state.message


# ------------------------------------------------------------------ plot data
def test_metric_switch_changes_the_plotted_data(meta):
    state = ExplorerState.from_diagnosis(meta)
    state.log_scale = False
    state.selected = [MEM, "module.lm_head.weight"]
    expected = meta.steps[meta.steps["name"] == MEM].sort_values("step")
    seen = {}
    for metric in METRICS:
        state.metric = metric
        assert list(state.series().columns) == [MEM, "module.lm_head.weight"]
        ydata = lines_of(state.figure())[MEM]
        np.testing.assert_array_equal(ydata, expected[metric].to_numpy(dtype=float))
        np.testing.assert_array_equal(state.series()[MEM].to_numpy(), ydata)
        seen[metric] = ydata
    assert not np.array_equal(seen["grad_norm"], seen["grad_total_norm"])   # the orphan's .grad
    assert np.all(np.diff(seen["grad_total_norm"]) > 0)                     # keeps growing
    assert np.all(seen["delta_norm"] == 0)                                  # never trained
    with pytest.raises(ValueError, match="metric must be one of"):
        state.metric = "loss"


def test_log_scale_with_zeros_and_nan_warns_nothing(meta, finetune):
    state = ExplorerState.from_diagnosis(meta)
    state.metric = "update_ratio"              # zeros for the orphan, NaN for norm biases
    state.selected = [MEM, "module.metamodel.model.norm.bias", "module.lm_head.weight"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = state.figure()
        fig.savefig(io.BytesIO(), format="png")
        assert fig.axes[0].get_yscale() == "log"
        ydata = lines_of(fig)[MEM]
        assert np.all(ydata > 0)               # zeros drawn at the floor (test_explorer_zeros)
        state.selected = [MEM]                 # only zeros: still drawn, at the floor
        fig = state.figure()
        fig.savefig(io.BytesIO(), format="png")
        assert fig.axes[0].get_yscale() == "log"
        assert "a 0 is drawn at 1e-06" in fig.axes[0].get_title()
        ft = ExplorerState.from_diagnosis(finetune)
        ft.verdicts = {"unused"}               # never a gradient: every grad_norm is NaN
        fig = ft.figure()
        fig.savefig(io.BytesIO(), format="png")
        assert "no data" in figure_text(fig) and "NaN on every step" in figure_text(fig)


def test_no_match_says_no_data(meta):
    state = ExplorerState.from_diagnosis(meta)
    state.name_regex = "does-not-exist"
    assert state.selected == [] and state.series().shape[1] == 0
    fig = state.figure()
    assert "no data" in figure_text(fig) and "no tensor matches" in figure_text(fig)
    assert state.options().choices == [] and state.options().note == "no tensor matches the filters"


# ------------------------------------------------------------------ escaping
def test_hostile_names_are_escaped(hostile):
    names = list(hostile.params["name"])
    assert "<script>x.weight" in names
    state = ExplorerState.from_diagnosis(hostile)
    page = state.table_html()
    assert "&lt;script&gt;x.<wbr>weight" in page and "<script>" not in page
    state.name_regex = "<script>"
    assert set(state.filtered_params()["name"]) == {"<script>x.weight", "<script>x.bias"}
    assert "&lt;script&gt;x.<wbr>bias" in state.table_html()
    state.name_regex = "<script>("                           # invalid, and hostile
    w = explore(state)
    status = w.controls.status.value
    assert "&lt;script&gt;(" in status and "<script>" not in status
    assert "<script>" not in w.controls.table.value
    assert any(v == "<script>x.weight" for _, v in w.controls.tensors.options)


# ------------------------------------------------------------------ empty / failed
def test_failed_diagnosis_with_no_steps():
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def boom(step):
        raise RuntimeError("data loader died")

    diag = diagkit.diagnose(model, opt, train_step=boom, steps=2)
    assert len(diag.steps) == 0 and diag.failure is not None
    state = ExplorerState.from_diagnosis(diag)
    assert len(state.filtered_params()) == 2
    assert state.series().empty
    assert "no data" in figure_text(state.figure())
    assert "stopped at step 0" in state.message and "data loader died" in state.message
    assert "weight" in state.table_html()
    w = explore(diag)
    assert "data loader died" in w.controls.status.value
    assert png_of(w.controls.plot)[:4] == b"\x89PNG"


def test_empty_tables():
    params = pd.DataFrame(columns=list(PARAMS_COLUMNS))
    steps = pd.DataFrame(columns=list(STEPS_COLUMNS))
    state = ExplorerState(params, steps)
    assert state.filtered_params().empty and state.selected == []
    assert "no data" in figure_text(state.figure())
    assert "0 of 0 tensors match" in state.message and "<tbody></tbody>" in state.table_html()
    explore(state)


# ------------------------------------------------------------------ scale
def synthetic(n_tensors: int = 2000, n_steps: int = 200) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(0)
    names = np.array([f"blocks.{i // 4}.{'fc' if i % 4 < 2 else 'norm'}."
                      f"{'weight' if i % 2 == 0 else 'bias'}" for i in range(n_tensors)],
                     dtype=object)
    modules = np.array([n.rsplit(".", 1)[0] for n in names], dtype=object)
    verdicts = [("ok",)] * n_tensors
    for i in range(0, n_tensors, 97):
        verdicts[i] = ("unused",)
    for i in range(5, n_tensors, 401):
        verdicts[i] = ("orphan", "grad_not_cleared")
    params = pd.DataFrame({col: [None] * n_tensors for col in PARAMS_COLUMNS})
    params = params.assign(
        name=names, aliases=[()] * n_tensors, module=modules, module_type="Linear",
        shape=[(4,)] * n_tensors, numel=4, bytes=16, dtype="torch.float32", device="cpu",
        in_model=True, requires_grad=True, optimizer=pd.array([0] * n_tensors, dtype="Int64"),
        group=pd.array([0] * n_tensors, dtype="Int64"), memberships=[((0, 0),)] * n_tensors,
        n_optimizers=1, lr=0.1, weight_decay=0.0, steps=n_steps, rg_steps=n_steps,
        used_steps=n_steps, changed_steps=n_steps, carried_steps=0, nonfinite_steps=0,
        skipped_steps=0,
        grad_norm=rng.random(n_tensors), grad_total_norm=rng.random(n_tensors),
        delta_norm=rng.random(n_tensors), update_ratio=rng.random(n_tensors),
        verdicts=verdicts)[list(PARAMS_COLUMNS)]
    total = n_tensors * n_steps
    steps = pd.DataFrame({
        "step": np.repeat(np.arange(n_steps), n_tensors),
        "name": np.tile(names, n_steps),
        "requires_grad": True, "used": True,
        "grad_norm": rng.random(total),
        "grad_total_norm": rng.random(total), "carried_grad": False,
        "delta_norm": rng.random(total), "update_ratio": rng.random(total),
        "changed": True, "lr": 0.1, "nonfinite": False, "skipped": False,
    })[list(STEPS_COLUMNS)]
    return params, steps


def test_two_thousand_tensors_by_two_hundred_steps_stays_responsive():
    params, steps = synthetic()
    started = time.perf_counter()
    state = ExplorerState(params, steps)
    opts = state.options()
    assert opts.total == 2000 and len(opts.choices) == MAX_OPTIONS
    assert "first 500 of 2,000" in opts.note and "narrow" in state.message
    assert state.selected[0] == "blocks.1.fc.bias"          # an orphan first (severity error)
    series = state.series()
    assert series.shape == (200, 6)
    name = state.selected[2]
    expected = steps.loc[steps["name"] == name].sort_values("step")["grad_norm"].to_numpy()
    np.testing.assert_array_equal(series[name].to_numpy(), expected)
    state.figure()
    assert state.table_html().count("<tr") == 51                # header + 50 rows
    wide = state.data.wide()
    for metric in METRICS:                                       # each switch: no new pivot
        state.metric = metric
        assert state.series().shape == (200, 6)
    assert state.data.wide() is wide
    state.module_prefix = "blocks.7"
    assert len(state.filtered_params()) == 4
    state.module_prefix = ""
    state.name_regex = r"norm\.weight$"
    assert len(state.filtered_params()) == 500
    state.selected = list(state.filtered_params()["name"][:100])
    assert "plotting the first 40 of 100" in state.message
    assert len(state.figure().axes[0].get_lines()) == MAX_LINES
    w = explore(state)
    w.controls.regex.value = r"fc\.bias$"
    assert len(w.controls.tensors.options) == MAX_OPTIONS
    assert time.perf_counter() - started < 8


# ------------------------------------------------------------------ widget wiring
def walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


def test_widget_controls_drive_the_state_and_redraw(finetune):
    w = explore(finetune, top=3)
    assert isinstance(w, widgets.Widget) and isinstance(w, Explorer)
    c = w.controls
    inside = set(map(id, walk(w)))
    for control in (c.verdicts, c.module, c.regex, c.metric, c.tensors, c.log, c.plot, c.table,
                    c.status):
        assert id(control) in inside
    png0 = png_of(c.plot)
    assert png0[:4] == b"\x89PNG" and "23 of 23 tensors match" in c.status.value
    assert len(c.tensors.value) == 3 and c.tensors.value == tuple(w.state.selected)

    c.module.value = "cmim_decoder"
    assert w.state.module_prefix == "cmim_decoder"
    assert sorted(v for _, v in c.tensors.options) == sorted(CMIM)
    assert "4 of 23 tensors match" in c.status.value and "ffn_head" not in c.table.value
    assert set(c.tensors.value) <= set(CMIM)

    c.module.value = ""
    c.verdicts.value = ("unused",)
    assert w.state.verdicts == {"unused"} and "8 of 23 tensors match" in c.status.value
    assert c.table.value.count("<tr") == 9

    c.verdicts.value = ()
    c.regex.value = "ffn_head"
    assert w.state.name_regex == "ffn_head" and len(c.tensors.options) == 4
    c.regex.value = "ffn_head("
    assert "invalid regex" in c.status.value and len(c.tensors.options) == 23

    c.regex.value = ""
    c.tensors.value = ("ffn_head.0.weight",)
    assert w.state.selected == ["ffn_head.0.weight"]
    png1 = png_of(c.plot)
    assert png1 != png0 and "<b>ffn_head.<wbr>0.<wbr>weight</b>" in c.table.value

    c.metric.value = "delta_norm"
    assert w.state.metric == "delta_norm" and w.state.selected == ["ffn_head.0.weight"]
    png2 = png_of(c.plot)
    assert png2 != png1 and ">delta_norm</th>" in c.table.value

    c.log.value = False
    assert w.state.log_scale is False and png_of(c.plot) != png2
    assert w.state.figure().axes[0].get_yscale() == "linear"
