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

    def __init__(self, state: ExplorerState, timeline: Figure | None = None, **kwargs):
        super().__init__(**kwargs)
        self.state = state
        self._syncing = False
        self._plot_key = None
        c = self.controls = _controls(state)
        self.children = _arrange(c)
        if timeline is not None:  # a whole-run watch: its findings over the run, on top
            c.timeline = widgets.Image(value=_figure_png(timeline), format="png",
                                       layout=widgets.Layout(width="auto", max_width="100%"))
            self.children = [c.timeline, *self.children]
        self.add_class("diagkit-explorer")
        for name, control in vars(c).items():
            control.add_class(f"diagkit-explorer-{name}")
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
            _set_choices(c.tensors, state.options().choices, tuple(state.selected))
            c.status.value = f"<span style='font-size:12px'>{html.escape(state.message)}</span>"
            c.table.value = state.table_html()
            key = (state.metric, tuple(state.selected), state.log_scale,
                   len(state.filtered_params()) == 0)
            if key != self._plot_key:
                c.plot.value = _figure_png(state.figure())
                self._plot_key = key
        finally:
            self._syncing = False


# Every label gets the same fixed width, so that no label is squeezed (read 'dule' for
# 'module') when its box shrinks, and the boxes line up.
_LABEL = {"description_width": "64px"}
_MIDDLE = "340px"     # the module / name / metric column: fixed, never sized by its contents


def _controls(state: ExplorerState) -> SimpleNamespace:
    """The explorer's widgets, each sized by its layout, never by the state it shows: widths
    that followed the contents made the controls overlap as the state changed."""
    full = widgets.Layout(width="auto")   # a box's child: stretched to it, margins inside
    return SimpleNamespace(
        verdicts=widgets.SelectMultiple(
            options=state.verdict_choices(), value=(), rows=7, description="verdicts",
            tooltip="none selected = all verdicts", style=_LABEL,
            layout=widgets.Layout(width="300px", flex="0 0 auto")),
        module=widgets.Combobox(
            options=state.module_choices()[:MAX_OPTIONS], value=state.module_prefix,
            ensure_option=False, description="module", placeholder="module prefix",
            style=_LABEL, layout=full),
        regex=widgets.Text(value=state.name_regex, description="name", style=_LABEL,
                           placeholder="regex on tensor names", continuous_update=False,
                           layout=full),
        metric=widgets.Dropdown(options=list(METRICS), value=state.metric,
                                description="metric", style=_LABEL, layout=full),
        log=widgets.Checkbox(value=state.log_scale, description="log scale", indent=False,
                             layout=widgets.Layout(width="auto", margin="2px 0 0 68px")),
        # Its own full-width row: labels (name and verdicts) are long, and a picker beside
        # the other controls cut them.
        tensors=widgets.SelectMultiple(options=[], rows=8, description="tensors",
                                       style=_LABEL, layout=full),
        status=widgets.HTML(layout=full),
        plot=widgets.Image(format="png", layout=widgets.Layout(width="auto", max_width="100%")),
        table=widgets.HTML(layout=full),
    )


def _arrange(c: SimpleNamespace) -> list:
    """Rows: the filters (verdicts, then a fixed-width column; they wrap under each other
    when the output area is narrow), the tensor picker, the status line, the plot, the table."""
    middle = widgets.VBox([c.module, c.regex, c.metric, c.log],
                          layout=widgets.Layout(width=_MIDDLE, flex="0 0 auto"))
    filters = widgets.HBox([c.verdicts, middle],
                           layout=widgets.Layout(flex_flow="row wrap", width="auto"))
    return [filters, c.tensors, c.status, c.plot, c.table]


class Reloadable(widgets.VBox):
    """An explorer of a saved folder that a running job still writes: a line saying which save
    it shows, a reload button, the explorer. `reload()` -> (a new explorer, its line)."""

    def __init__(self, reload, explorer, line: str, **kwargs):
        super().__init__(**kwargs)
        self._reload = reload
        self.line = widgets.HTML(value=html.escape(line))
        self.button = widgets.Button(description="reload", icon="refresh",
                                     tooltip="read the folder's newest save")
        self.button.on_click(lambda _button: self.reload())
        self.explorer = explorer
        self.add_class("diagkit-reloadable")
        self.children = [widgets.HBox([self.button, self.line]), explorer]

    def reload(self) -> None:
        """Read the folder again; a failure is the line, the explorer shown stays."""
        try:
            self.explorer, line = self._reload()
        except Exception as exc:
            self.line.value = html.escape(f"could not reload: {exc}")
            return
        self.line.value = html.escape(line)
        self.children = [self.children[0], self.explorer]


def _set_choices(picker: widgets.SelectMultiple, choices: list, value: tuple) -> None:
    """Give the picker new options and a new selection in one message to the front end, its
    selection emptied first: the front end applies each message as it comes, and a selection
    index past the new options raised 'Cannot set properties of undefined (setting
    'selected')' in the browser on every filter change."""
    if list(picker.options) == choices and picker.value == value:
        return
    with picker.hold_sync():
        picker.value = ()
        if list(picker.options) != choices:
            picker.options = choices
        picker.value = value


def explore(diag, top: int = 6) -> Explorer:
    """An interactive explorer of a `Diagnosis` (or anything with .params and .steps, or an
    `ExplorerState`). The returned widget exposes `.state` and `.controls`."""
    state = diag if isinstance(diag, ExplorerState) else ExplorerState.from_diagnosis(diag, top)
    return Explorer(state, timeline=_timeline(diag))


def _timeline(diag) -> Figure | None:
    """The timeline figure of a whole-run watch (`present.timeline`); None for any other run."""
    meta = getattr(diag, "meta", None) or {}
    if "events" not in meta:  # not a whole-run watch: no change was looked for
        return None
    from .timeline import timeline_figure, timeline_table
    return timeline_figure(timeline_table(diag), meta["events"],
                           meta.get("optimizer_steps"))


def _figure_png(fig: Figure, dpi: int = 96) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
