"""The live view of a watch in a notebook (docs/workbook.md, "The live view"): an ipywidgets
panel that shows what the observed steps recorded so far, and becomes the explorer at the end.
Never measures: `run.live` builds each `LiveView` and hands it here.

    panel = LivePanel()
    panel.show(view)          # steps observed, findings as chips, a grad-norm plot, the changes
    panel.become(explorer)    # the watch ended

Each part is set only when its value changed, so an update sends only what is new, and every
set is one comm message the kernel sends without waiting on the front end.
"""

from __future__ import annotations

import dataclasses
import html

import ipywidgets as widgets
import numpy as np
import pandas as pd

from ..core import severity
from ..core.format import dotted_breaks
from ..judge.findings import sort_findings
from .sections import severity_chip

MOST_FINDINGS = 8   # chips shown; the rest are counted
MOST_LINES = 6      # tensors drawn in the trajectory
MOST_EVENTS = 6     # wiring changes listed (the latest)
MOST_DOTS = 60      # steps drawn with a dot each


@dataclasses.dataclass
class LiveView:
    """What the panel shows at one moment. `steps`: the observed steps' rows (step, name,
    grad_norm) kept for the plot; `events`: the wiring changes seen (None: not looked for, a
    watch of `steps` steps); `note`: one line under the count (which rank, a stopped view)."""

    observed: int
    of: int | None
    findings: list
    steps: pd.DataFrame
    events: list[dict] | None = None
    note: str = ""


class LivePanel(widgets.VBox):
    """The panel: a status line, the findings, the plot, the wiring changes. `of`: the steps
    the watch observes (None: the whole run); `note`: what the status line adds."""

    def __init__(self, of: int | None = None, note: str = "", **kwargs):
        super().__init__(**kwargs)
        full = widgets.Layout(width="auto")
        self.status = widgets.HTML(value=_status_html(0, of, note), layout=full)
        self.findings = widgets.HTML(value=findings_html([]), layout=full)
        self.plot = widgets.HTML(value=trajectory_svg(_NO_STEPS, ()), layout=full)
        self.changes = widgets.HTML(value="", layout=full)
        self.add_class("diagkit-live")
        for name in ("status", "findings", "plot", "changes"):
            getattr(self, name).add_class(f"diagkit-live-{name}")
        self.children = [self.status, self.findings, self.plot, self.changes]

    def show(self, view: LiveView) -> None:
        """Bring every part up to `view`; a part whose text is unchanged sends nothing."""
        _set(self.status, _status_html(view.observed, view.of, view.note))
        _set(self.findings, findings_html(view.findings))
        _set(self.changes, events_html(view.events))
        _set(self.plot, trajectory_svg(view.steps, problem_names(view.findings)))

    def say(self, line: str) -> None:
        """One line in place of the status (the live view stopped; the watch goes on)."""
        _set(self.status, f"<span class='diagkit-live-note'>{html.escape(line)}</span>")

    def become(self, widget) -> None:
        """The watch ended: the panel holds `widget` (the explorer) from now on."""
        self.children = [widget]


def _set(widget, value: str) -> None:
    if widget.value != value:
        widget.value = value


def _status_html(observed: int, of: int | None, note: str) -> str:
    count = f"{observed} of {of}" if of is not None else f"{observed}"
    text = (f"<b>diagkit watch</b>: {count} step{'s' * ((of or observed) != 1)} observed"
            + (f" &middot; {html.escape(note)}" if note else ""))
    return f"<span style='font-size:13px'>{text}</span>"


def findings_html(findings) -> str:
    """A chip per warning or error (and info), worst first: its verdict and module, then the
    first line of its fix."""
    if not findings:
        return "<p style='margin:2px 0;color:#555'>No findings so far.</p>"
    ordered = _ordered(findings)
    rows = [_finding_row(f) for f in ordered[:MOST_FINDINGS]]
    if len(ordered) > MOST_FINDINGS:
        rows.append(f"<div>and {len(ordered) - MOST_FINDINGS} more</div>")
    return "".join(rows)


def _ordered(findings) -> list:
    """Worst first (`sort_findings`), the findings that no longer hold after the others."""
    return sorted(sort_findings(findings), key=lambda f: f.ended is not None)


def _finding_row(f) -> str:
    where = f.module or ("the whole model" if f.count else "")
    chip = severity_chip(f.severity, f"<b>{html.escape(f.code)}</b>"
                         + (f" {dotted_breaks(html.escape(where))}" if where else ""))
    fix = (f.fix or "").strip().splitlines()
    # The fix wraps at its spaces only: never inside an identifier or a number.
    tail = (f"<code style='white-space:pre-wrap;overflow-wrap:normal;word-break:keep-all'>"
            f"{html.escape(fix[0])}</code>" if fix else html.escape(f.message))
    if f.ended is not None:  # a whole run's finding that no longer holds
        return (f"<div class='diagkit-live-finding ended' style='margin:2px 0;opacity:0.6'>"
                f"{chip} held from step {f.since} to {f.until}; gone at step {f.ended}</div>")
    return (f"<div class='diagkit-live-finding {html.escape(f.severity)}' "
            f"style='margin:2px 0'>{chip} {tail}</div>")


def events_html(events: list[dict] | None) -> str:
    """The wiring changes seen so far, the latest last (empty for a watch of `steps`)."""
    if events is None:
        return ""
    if not events:
        return "<p style='margin:2px 0;color:#555'>No wiring change so far.</p>"
    items = "".join(f"<li>step {int(e['step'])}: {html.escape(str(e['what']))}"
                    f"{_event_names(e.get('names') or [])}</li>" for e in events[-MOST_EVENTS:])
    more = len(events) - MOST_EVENTS
    head = "Wiring changes" + (f" (the latest {MOST_EVENTS} of {len(events)})" if more > 0
                               else "")
    return f"<div><b>{head}</b><ul style='margin:2px 0'>{items}</ul></div>"


def _event_names(names: list[str], most: int = 3) -> str:
    if not names:
        return ""
    shown = ", ".join(dotted_breaks(html.escape(n)) for n in names[:most])
    return f": {shown}" + (", ..." if len(names) > most else "")


def problem_names(findings) -> tuple[str, ...]:
    """The tensors the plot follows: those of the warnings and errors, worst first."""
    names: list[str] = []
    for f in _ordered(findings):
        if severity.rank(f.severity) >= severity.rank("warning"):
            names += [n for n in f.params if n not in names]
    return tuple(names[:MOST_LINES])


def trajectory_svg(steps: pd.DataFrame, names: tuple[str, ...], width: int = 640,
                   height: int = 150) -> str:
    """Grad norm per observed step of `names`, as inline SVG: a line per tensor, log scale
    where every value is positive. SVG, not a rendered figure: an update costs about a
    millisecond instead of the hundred a PNG takes, and the page fetches nothing."""
    rows = steps[steps["name"].isin(names)] if len(steps) and names else steps.iloc[:0]
    if not len(rows):
        why = "no problem found so far" if len(steps) else "no step observed yet"
        return f"<p style='margin:2px 0;color:#555'>Grad norm: {why}.</p>"
    wide = rows.pivot_table(index="step", columns="name", values="grad_norm", aggfunc="last")
    values = wide.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    log = bool(len(finite)) and bool((finite > 0).all())
    y = np.log10(values) if log else values
    lo, hi = (float(np.nanmin(y)), float(np.nanmax(y))) if np.isfinite(y).any() else (0.0, 1.0)
    span = hi - lo or 1.0
    x = wide.index.to_numpy(dtype=float)
    x0, xs = x.min(), (x.max() - x.min()) or 1.0
    pad, w, h = 4, width - 8, height - 8
    lines, legend = [], []
    for i, name in enumerate(n for n in names if n in wide.columns):
        col = y[:, list(wide.columns).index(name)]
        points = " ".join(f"{pad + w * (a - x0) / xs:.1f},{pad + h * (1 - (b - lo) / span):.1f}"
                          for a, b in zip(x, col) if np.isfinite(b))
        color = _PALETTE[i % len(_PALETTE)]
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{points}"/>')
        if len(x) <= MOST_DOTS:  # a dot per step: one step alone is a point, not a line
            lines += [f'<circle cx="{p.split(",")[0]}" cy="{p.split(",")[1]}" r="2.5" '
                      f'fill="{color}"/>' for p in points.split()]
        legend.append(f"<span style='color:{color}'>&#9632;</span> "
                      f"{dotted_breaks(html.escape(name))}")
    scale = "log scale" if log else "linear scale"
    low, high = (10 ** lo, 10 ** hi) if log else (lo, hi)
    return (f"<div class='diagkit-live-trajectory'><b>Grad norm</b> of the problem tensors "
            f"({scale}, {low:.3g} to {high:.3g}; steps {int(x0)} to {int(x.max())})<br>"
            f'<svg width="{width}" height="{height}" style="max-width:100%;background:#fafafa;'
            f'border:1px solid #ddd">{"".join(lines)}</svg>'
            f"<div style='font-size:12px'>{' &nbsp; '.join(legend)}</div></div>")


_NO_STEPS = pd.DataFrame(columns=["step", "name", "grad_norm"])
_PALETTE = ("#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")
