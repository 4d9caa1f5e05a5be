"""The interactive explorer for a `Diagnosis` in JupyterLab (ipywidgets). Never measures.

    from diagkit.present.explorer import explore
    explore(diag)            # the findings and their fixes, filters, a per-step plot of the
                             # chosen tensors, the matching rows

All decisions live in `ExplorerState` (`diagkit.present.explorer_state`); `Explorer` is the thin
widget layer: each control sets one field of the state and redraws. The figure is a
`matplotlib.figure.Figure` rendered to PNG, shown as an <img> with its alt text in an
`ipywidgets.HTML` (ipywidgets' Image has no alt text), so no pyplot backend is involved.
"""

from __future__ import annotations

import base64
import html
import io
from types import SimpleNamespace

from ..core import extras

try:  # the explorer is the workbook extra's (README, "Install"): one line without it
    import ipywidgets as widgets
    from matplotlib.figure import Figure
except ImportError as exc:
    raise extras.missing_error(exc, "the explorer") from None

from . import explorer_findings
from .explorer_keys import keys_widget
from .explorer_state import MAX_LINES, MAX_OPTIONS, METRICS, ExplorerState
from .explorer_view import alt_text


class Explorer(widgets.VBox):
    """The ipywidgets front of an `ExplorerState`: `state`, `controls`, `refresh()`, and
    `pick(finding)` (what a finding's button does). `timeline`: (figure, its alt text)."""

    def __init__(self, state: ExplorerState, timeline: tuple[Figure, str] | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.state = state
        self._syncing = False
        self._plot_key = None
        c = self.controls = _controls(state)
        # The findings lead: the fixes first, the tools to look closer below them.
        c.findings = explorer_findings.FindingsBox(state.findings, self.pick)
        head = [c.findings]
        if timeline is not None:  # a whole-run watch: its findings over the run
            c.timeline = widgets.HTML(value=_img_html(*timeline), layout=widgets.Layout(
                width="auto"))
            head.append(c.timeline)
        c.keys = keys_widget()   # keys typed in the explorer stay in it (JupyterLab)
        self.children = [*head, *_arrange(c), c.keys]
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

    def pick(self, finding) -> None:
        """A finding's button: its tensors plotted, the filters set to show them
        (`explorer_findings.pick`), the filter controls showing what was set."""
        if not explorer_findings.pick(self.state, finding):
            return
        state, c = self.state, self.controls
        self._syncing = True
        try:
            c.verdicts.value = tuple(v for _, v in c.verdicts.options if v in state.verdicts)
            c.module.value = state.module_prefix
            c.regex.value = state.name_regex
        finally:
            self._syncing = False
        self.refresh()

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
                c.plot.value = _img_html(state.figure(), alt_text(state, max_lines=MAX_LINES))
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
        plot=widgets.HTML(layout=full),
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
    it shows, a reload button, the explorer. `reload()` -> (a new explorer, or None when the
    folder holds no newer save: the one shown stays; and the line to show)."""

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
        """Read the folder again; a failure is the line, the explorer shown stays. The line
        always changes (it says when it looked), so that a click is never without an answer."""
        try:
            explorer, line = self._reload()
        except Exception as exc:
            self.line.value = html.escape(f"could not reload: {exc}")
            return
        self.line.value = html.escape(line)
        if explorer is not None:
            self.explorer = explorer
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


def _timeline(diag) -> tuple[Figure, str] | None:
    """The timeline figure of a whole-run watch (`present.timeline`) and its alt text; None
    for any other run."""
    meta = getattr(diag, "meta", None) or {}
    if "events" not in meta:  # not a whole-run watch: no change was looked for
        return None
    from .timeline import timeline_alt, timeline_figure, timeline_table
    spans = timeline_table(diag)
    return (timeline_figure(spans, meta["events"], meta.get("optimizer_steps")),
            timeline_alt(spans, meta["events"]))


def _img_html(fig: Figure, alt: str, dpi: int = 96) -> str:
    """The figure as a PNG <img> with its alt text, never wider than the output area."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (f"<img src='data:image/png;base64,{data}' alt='{html.escape(alt, quote=True)}' "
            "style='display:block;max-width:100%;height:auto'>")
