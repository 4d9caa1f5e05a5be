"""The live view of a watch in a notebook (docs/workbook.md, "The live view"): an ipywidgets
panel that shows what the observed steps recorded so far, and becomes the explorer at the end.
Never measures: `run.live.view` builds each `LiveView` and hands it here.

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

from ..core import fixtext, severity
from ..core.format import dotted_breaks, truncate_left
from ..judge.findings import sort_findings
from .sections import severity_chip

MOST_FINDINGS = 8   # chips shown (one per verdict); the rest are counted
MOST_LINES = 6      # tensors drawn in the trajectory
MOST_EVENTS = 6     # wiring changes listed (the latest)
MOST_DOTS = 60      # steps drawn with a dot each
MOST_PLACES = 2     # modules a chip names before "and N more"

# A line of the plot: (label, steps, values), the steps increasing.
Line = tuple[str, np.ndarray, np.ndarray]


@dataclasses.dataclass
class LiveView:
    """What the panel shows at one moment. `lines`: the grad norm per observed step of the
    problem tensors, or (`whole`) of the whole model while there is no problem tensor;
    `events`: the wiring changes seen (None: not looked for, a watch of `steps` steps);
    `note`: one line under the count (which rank, what comes next)."""

    observed: int
    of: int | None
    findings: list
    lines: list[Line] = dataclasses.field(default_factory=list)
    whole: bool = False
    events: list[dict] | None = None
    note: str = ""


class LivePanel(widgets.VBox):
    """The panel: a status line, the findings, the plot, the wiring changes. `of`: the steps
    the watch observes (None: the whole run); `note`: what the status line adds."""

    def __init__(self, of: int | None = None, note: str = "", **kwargs):
        super().__init__(**kwargs)
        full = widgets.Layout(width="auto")
        self.status = widgets.HTML(value=status_html(0, of, note), layout=full)
        self.findings = widgets.HTML(value=findings_html([]), layout=full)
        self.plot = widgets.HTML(value=trajectory_svg([], observed=0), layout=full)
        self.changes = widgets.HTML(value="", layout=full)
        self.add_class("diagkit-live")
        for name in ("status", "findings", "plot", "changes"):
            getattr(self, name).add_class(f"diagkit-live-{name}")
        self.children = [self.status, self.findings, self.plot, self.changes]

    def show(self, view: LiveView) -> None:
        """Bring every part up to `view`; a part whose text is unchanged sends nothing."""
        _set(self.status, status_html(view.observed, view.of, view.note))
        _set(self.findings, findings_html(view.findings))
        _set(self.changes, events_html(view.events))
        _set(self.plot, trajectory_svg(view.lines, view.observed, view.whole))

    def say(self, line: str) -> None:
        """One line in place of the status (the live view stopped; the watch goes on)."""
        _set(self.status, f"<span class='diagkit-live-note'>{html.escape(line)}</span>")

    def become(self, widget) -> None:
        """The watch ended: the panel holds `widget` (the explorer) from now on."""
        self.children = [widget]


def _set(widget, value: str) -> None:
    if widget.value != value:
        widget.value = value


def status_html(observed: int, of: int | None, note: str) -> str:
    count = f"{observed} of {of}" if of is not None else f"{observed}"
    text = (f"<b>diagkit watch</b>: {count} step{'s' * ((of or observed) != 1)} observed"
            + (f" &middot; {_code_marks(html.escape(note))}" if note else ""))
    return f"<span style='font-size:13px'>{text}</span>"


def _code_marks(escaped: str) -> str:
    """`stop()` in a note as code."""
    parts = escaped.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


# ---------------------------------------------------------------------------- the findings
def findings_html(findings) -> str:
    """One chip per verdict, errors first (a verdict over four modules is one chip that says
    four): its severity, verdict and where, the step it began (a whole run), and the first
    line of its fix, as `present.text.finding_line` says it. Findings that no longer hold
    come after those that do."""
    if not findings:
        return "<p style='margin:2px 0;color:#555'>No findings so far.</p>"
    groups = verdict_groups(findings)
    rows = [_group_row(g) for g in groups[:MOST_FINDINGS]]
    if len(groups) > MOST_FINDINGS:
        more = groups[MOST_FINDINGS:]
        rows.append(f"<div>and {len(more)} more verdict{'s' * (len(more) != 1)} "
                    f"({sum(map(len, more))} finding{'s' * (sum(map(len, more)) != 1)})</div>")
    return "".join(rows)


def verdict_groups(findings) -> list[list]:
    """The findings by (verdict, severity, whether it still holds), in `sort_findings` order
    (worst first, then the biggest), the groups that no longer hold last."""
    groups: dict[tuple, list] = {}
    for f in sorted(sort_findings(findings), key=lambda f: f.ended is not None):
        groups.setdefault((f.code, f.severity, f.ended is not None), []).append(f)
    return list(groups.values())


def _where(f) -> str:
    """Where, as `finding_line` says it: the module (its end, if long) and its tensors."""
    where = truncate_left(f.module, 48) if f.module else ("the model" if f.count else "")
    count = f" ({f.count} tensor{'s' * (f.count != 1)})" if f.count else ""
    return (where + count) if where else ""


def _group_row(group: list) -> str:
    first = group[0]
    esc = html.escape
    n = len(group)
    places = [w for w in (_where(f) for f in group) if w]
    where = ", ".join(dotted_breaks(esc(p)) for p in places[:MOST_PLACES])
    if len(places) > MOST_PLACES:
        where += f" and {len(places) - MOST_PLACES} more"
    chip = severity_chip(first.severity, f"<b>{esc(first.code)}</b>"
                         + (f" &times;{n}" if n > 1 else ""))
    where = f" in {where}" if where else ""
    if first.ended is not None:  # a whole run's finding that no longer holds
        held = (f"held from step {first.since} to {first.until}; gone at step {first.ended}"
                if n == 1 else "no longer held")
        return (f"<div class='diagkit-live-finding ended' style='margin:2px 0;opacity:0.6'>"
                f"{chip}{where}: {held}</div>")
    since = [f.since for f in group if f.since is not None]
    when = f" from step {min(since)}" if since else ""
    fix = fixtext.first_line(first.fix)
    fix = fix if len(fix) <= 110 else fix[:109] + "…"
    # The fix wraps at its spaces only: never inside an identifier or a number.
    tail = (f"; fix: <code style='white-space:pre-wrap;overflow-wrap:normal;"
            f"word-break:keep-all'>{esc(fix)}</code>" if fix else "")
    return (f"<div class='diagkit-live-finding {esc(first.severity)}' style='margin:2px 0'>"
            f"{chip}{where}{when}{tail}</div>")


# ---------------------------------------------------------------------------- the changes
def events_html(events: list[dict] | None) -> str:
    """The wiring changes seen so far, the latest last (empty for a watch of `steps`). An
    event's text names what it touched already (`a, b, c and 9 more became trainable`)."""
    if events is None:
        return ""
    if not events:
        return "<p style='margin:2px 0;color:#555'>No wiring change so far.</p>"
    items = "".join(f"<li>step {int(e['step'])}: "
                    f"{dotted_breaks(html.escape(str(e['what'])))}</li>"
                    for e in events[-MOST_EVENTS:])
    more = len(events) - MOST_EVENTS
    head = "Wiring changes" + (f" (the latest {MOST_EVENTS} of {len(events)})" if more > 0
                               else "")
    return f"<div><b>{head}</b><ul style='margin:2px 0'>{items}</ul></div>"


def problem_names(findings) -> tuple[str, ...]:
    """The tensors the plot follows: those of the warnings and errors that still hold, worst
    first."""
    names: list[str] = []
    for f in sort_findings([f for f in findings if f.ended is None]):
        if severity.rank(f.severity) >= severity.rank("warning"):
            names += [n for n in f.params if n not in names]
    return tuple(names[:MOST_LINES])


# ---------------------------------------------------------------------------- the plot
def trajectory_svg(lines: list[Line], observed: int, whole: bool = False, width: int = 640,
                   height: int = 150) -> str:
    """Grad norm per observed step, a line per tensor (`whole`: one line, the whole model's,
    while no tensor is a problem), as inline SVG, log scale where every value is positive.
    SVG, not a rendered figure: an update costs about a millisecond instead of the hundred a
    PNG takes, and the page fetches nothing."""
    lines = [(n, s, v) for n, s, v in lines if len(s)]
    if not lines:
        why = "no step observed yet" if not observed else "no gradient observed so far"
        return f"<p style='margin:2px 0;color:#555'>Grad norm: {why}.</p>"
    values = np.concatenate([v for _, _, v in lines]).astype(float)
    finite = values[np.isfinite(values)]
    log = bool(len(finite)) and bool((finite > 0).all())
    scaled = [(n, s.astype(float), np.log10(v) if log else v.astype(float))
              for n, s, v in lines]
    every_y = np.concatenate([y for _, _, y in scaled])
    ok = np.isfinite(every_y)
    lo, hi = (float(every_y[ok].min()), float(every_y[ok].max())) if ok.any() else (0.0, 1.0)
    span = hi - lo or 1.0
    x_all = np.concatenate([s for _, s, _ in scaled])
    x0, x1 = float(x_all.min()), float(x_all.max())
    xs = (x1 - x0) or 1.0
    pad, w, h = 4, width - 8, height - 8
    drawn, legend = [], []
    for i, (name, x, y) in enumerate(scaled):
        keep = np.isfinite(y)
        points = [f"{pad + w * (a - x0) / xs:.1f},{pad + h * (1 - (b - lo) / span):.1f}"
                  for a, b in zip(x[keep], y[keep])]
        color = "#555" if whole else _PALETTE[i % len(_PALETTE)]
        drawn.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{" ".join(points)}"/>')
        if len(x) <= MOST_DOTS:  # a dot per step: one step alone is a point, not a line
            drawn += [f'<circle cx="{p.split(",")[0]}" cy="{p.split(",")[1]}" r="2.5" '
                      f'fill="{color}"/>' for p in points]
        legend.append(f"<span style='color:{color}'>&#9632;</span> "
                      f"{dotted_breaks(html.escape(name))}")
    scale = "log scale" if log else "linear scale"
    low, high = (10 ** lo, 10 ** hi) if log else (lo, hi)
    what = "of the whole model (no problem tensor so far)" if whole else \
        "of the problem tensors"
    return (f"<div class='diagkit-live-trajectory'><b>Grad norm</b> {what} "
            f"({scale}, {low:.3g} to {high:.3g}; steps {int(x0)} to {int(x1)})<br>"
            f'<svg width="{width}" height="{height}" style="max-width:100%;background:#fafafa;'
            f'border:1px solid #ddd">{"".join(drawn)}</svg>'
            f"<div style='font-size:12px'>{' &nbsp; '.join(legend)}</div></div>")


_PALETTE = ("#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")
