"""The explorer's fixes of issue 13, checked on the widgets in Python: the tensor picker's
messages to the front end, the layout that no state can squeeze, zeros on a log scale, a default
plot that shows something, and a table that fits its output area. What only a browser can see
(sizes, overlap, console errors) is tests/e2e/test_jupyterlab.py."""

from __future__ import annotations

import numpy as np
import pytest

from diagkit.present.explorer import explore
from diagkit.present.explorer_state import ExplorerState
from diagkit.present.plots import log_floor

MEM = "module.metamodel.model.mem_tokens"


class FrontEnd:
    """What the browser knows of one SelectMultiple: its state at display, then every update
    message applied in order. The front end sets `options[i].selected` for each index after
    each message, so an index past the labels it has then is the console error of item 2."""

    def __init__(self, widget):
        self.state = dict(widget.get_state())
        self.bad: list[dict] = []
        widget._send = self.receive

    def receive(self, msg, buffers=None):
        self.state.update(msg["state"])
        labels, index = self.state["_options_labels"], self.state["index"]
        if any(i >= len(labels) for i in index):
            self.bad.append({"labels": len(labels), "index": tuple(index)})


@pytest.mark.parametrize("change", ["verdicts", "module", "regex", "back and forth"])
def test_picker_never_points_past_its_options_in_the_browser(finetune, change):
    w = explore(finetune)
    c = w.controls
    front = FrontEnd(c.tensors)
    if change == "verdicts":
        c.verdicts.value = ("unused",)
        c.verdicts.value = ()
    elif change == "module":
        c.tensors.value = (c.tensors.options[-1][1],)   # the last option: the highest index
        c.module.value = "cmim_decoder"                 # 23 options -> 4
    elif change == "regex":
        c.tensors.value = tuple(v for _, v in c.tensors.options[-3:])
        c.regex.value = r"head\.0"
    else:
        for value in ("ffn_head", "", "cmim_decoder", "vocab_head", ""):
            c.module.value = value
    assert front.bad == []
    # and the browser ends where Python is
    labels = [label for label, _ in c.tensors.options]
    assert list(front.state["_options_labels"]) == labels
    assert tuple(front.state["index"]) == c.tensors.index
    assert c.tensors.value == tuple(w.state.selected)


def test_layout_does_not_follow_the_state(meta):
    """Fixed label widths, a fixed middle column, the picker on its own full-width row: the
    sizes that made controls overlap, clip and lose label letters were content-driven."""
    w = explore(meta)
    c = w.controls
    for control in (c.verdicts, c.module, c.regex, c.metric, c.tensors):
        assert control.style.description_width == "64px"
    at = list(w.children).index(c.tensors)        # under the findings, the filters row
    filters, picker = w.children[at - 1:at + 1]
    assert list(filters.children) == [c.verdicts, filters.children[1]]
    middle = filters.children[1]
    assert list(middle.children) == [c.module, c.regex, c.metric, c.log]
    assert middle.layout.width == "340px" and middle.layout.flex == "0 0 auto"
    assert c.verdicts.layout.flex == "0 0 auto" and filters.layout.flex_flow == "row wrap"
    assert picker is c.tensors and c.tensors.layout.width == "auto"
    for control in (c.module, c.regex, c.metric):
        assert control.layout.width == "auto"
    assert "tensors match" in c.status.value and "tensors match" not in c.table.value


def test_zeros_are_drawn_at_the_static_plots_floor_on_log_scale(meta):
    state = ExplorerState.from_diagnosis(meta)
    state.selected = [MEM, "module.lm_head.weight"]
    for metric in ("delta_norm", "update_ratio"):
        state.metric = metric
        values = state.series().to_numpy(dtype=float)
        floor = log_floor(values[np.isfinite(values) & (values > 0)])
        fig = state.figure()
        ax = fig.axes[0]
        mem = ax.get_lines()[0]
        assert len(mem.get_ydata()) == 5 and np.all(mem.get_ydata() == floor)   # 0 each step
        assert f"a 0 is drawn at {floor:.0e}" in ax.get_title()
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend[-1] == f"0 (drawn at {floor:.0e})"      # the static plots' legend note
        dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
        assert len(dotted) == 1 and set(dotted[0].get_ydata()) == {floor}
    state.log_scale = False                            # linear: a 0 is a 0
    assert np.all(state.figure().axes[0].get_lines()[0].get_ydata() == 0)


def test_default_plot_of_the_finetune_demo_shows_lines(finetune):
    state = ExplorerState.from_diagnosis(finetune)
    fig = state.figure()
    assert not fig.axes[0].texts                        # no 'no data'
    assert all(np.isfinite(ln.get_ydata()).any() for ln in fig.axes[0].get_lines())
    assert "switch the metric to delta_norm or pick them" in state.message
    state.verdicts = {"unused"}                         # nothing here has a grad_norm
    text = " ".join(t.get_text() for t in state.figure().axes[0].texts)
    assert "NaN on every step" in text and "switch the metric to delta_norm" in text


def test_table_wraps_and_keeps_the_metric_in_view(finetune):
    state = ExplorerState.from_diagnosis(finetune)
    state.metric = "update_ratio"
    page = state.table_html()
    assert "width:100%" in page.split("<table", 1)[1].split(">", 1)[0]
    # names wrap after their dots only, never anywhere (a number or identifier kept whole)
    assert "overflow-wrap:anywhere" not in page and "overflow-x:auto" in page
    assert "encoder.<wbr>embed.<wbr>weight" in page
    heads = [h.rsplit(">", 1)[1] for h in page.split("</th>")[:-1]]
    assert heads[:3] == ["name", "verdicts", "update_ratio"]
    assert "tensors match" not in page                  # counted once, in the status line
    state.name_regex = "."
    assert "showing the first 5 of 23" in state.table_html(limit=5)
