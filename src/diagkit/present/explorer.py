"""The interactive explorer for a `Diagnosis` in JupyterLab (ipywidgets). Never measures.

    from diagkit.present.explorer import explore
    explore(diag)            # filters, a per-step plot of the chosen tensors, the matching rows

All decisions live in `ExplorerState` (`diagkit.present.explorer_state`); `Explorer` is the thin
widget layer: each control sets one field of the state and redraws. The figure is a
`matplotlib.figure.Figure` rendered to PNG into an `ipywidgets.Image`, so no pyplot backend is
involved.
"""

from __future__ import annotations

import html
import io
from types import SimpleNamespace

import ipywidgets as widgets
from matplotlib.figure import Figure

from .explorer_state import MAX_OPTIONS, METRICS, ExplorerState


class Explorer(widgets.VBox):
    """The ipywidgets front of an `ExplorerState`: `state`, `controls`, `refresh()`."""

    def __init__(self, state: ExplorerState, **kwargs):
        super().__init__(**kwargs)
        self.state = state
        self._syncing = False
        self._plot_key = None
        wide = widgets.Layout(width="auto")
        c = self.controls = SimpleNamespace(
            verdicts=widgets.SelectMultiple(
                options=state.verdict_choices(), value=(), rows=8, description="verdicts",
                tooltip="none selected = all verdicts"),
            module=widgets.Combobox(
                options=state.module_choices()[:MAX_OPTIONS], value=state.module_prefix,
                ensure_option=False, description="module", placeholder="module prefix"),
            regex=widgets.Text(value=state.name_regex, description="name",
                               placeholder="regex on tensor names", continuous_update=False),
            metric=widgets.Dropdown(options=list(METRICS), value=state.metric,
                                    description="metric"),
            log=widgets.Checkbox(value=state.log_scale, description="log scale", indent=False),
            tensors=widgets.SelectMultiple(options=[], rows=10, description="tensors",
                                           layout=widgets.Layout(width="48%")),
            status=widgets.HTML(),
            plot=widgets.Image(format="png", layout=wide),
            table=widgets.HTML(layout=wide),
        )
        self.children = [
            widgets.HBox([c.verdicts, widgets.VBox([c.module, c.regex, c.metric, c.log]),
                          c.tensors]),
            c.status, c.plot, c.table]
        fields = {"verdicts": "verdicts", "module": "module_prefix", "regex": "name_regex",
                  "metric": "metric", "log": "log_scale", "tensors": "selected"}
        for control, field in fields.items():
            getattr(c, control).observe(self._setter(field), names="value")
        self.refresh()

    def _setter(self, field: str):
        def on_change(change):
            if not self._syncing:
                setattr(self.state, field, change["new"])
                self.refresh()
        return on_change

    def refresh(self) -> None:
        """Push the state into the widgets: picker choices, status, table, plot."""
        state, c = self.state, self.controls
        self._syncing = True
        try:
            choices = state.options().choices
            if list(c.tensors.options) != choices:
                c.tensors.options = choices
            c.tensors.value = tuple(state.selected)
            c.status.value = f"<span style='font-size:12px'>{html.escape(state.message)}</span>"
            c.table.value = state.table_html()
            key = (state.metric, tuple(state.selected), state.log_scale,
                   len(state.filtered_params()) == 0)
            if key != self._plot_key:
                c.plot.value = _figure_png(state.figure())
                self._plot_key = key
        finally:
            self._syncing = False


def explore(diag, top: int = 6) -> Explorer:
    """An interactive explorer of a `Diagnosis` (or anything with .params and .steps, or an
    `ExplorerState`). The returned widget exposes `.state` and `.controls`."""
    state = diag if isinstance(diag, ExplorerState) else ExplorerState.from_diagnosis(diag, top)
    return Explorer(state)


def _figure_png(fig: Figure, dpi: int = 96) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
