"""The explorer's rendering: the plot and the HTML table of an `ExplorerState`.

Kept apart from the state so that the state's module holds only decisions (filters, order,
selection) and stays small. The functions take the state duck-typed and never import
`diagkit.present.explorer_state` (which imports this module), so there is no import cycle. They
read the state's problems-first tables (`_names`, `_rank`, `_verdicts`, `_filtered()`) as its
own methods did: this module is the state's private partner, not a public API over any object.
Presents only; never measures.
"""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..core import severity
from ..core.format import fmt_shape, truncate_left

_MAX_LEGEND = 15      # above this many lines the legend is left out

TABLE_HEAD = ("name", "verdicts", "module", "type", "shape", "requires grad",
              "optimizer / group", "lr", "used / steps")   # then the metric's own column


# ---------------------------------------------------------------------- the plot
def figure(state, *, max_lines: int, ylabel: str) -> Figure:
    """A line per selected tensor: the state's metric over the steps, at most `max_lines`
    lines, the y axis labelled `ylabel` (the caller owns both: they are the state's settings).
    Says 'no data', and why, when there is nothing finite to draw."""
    fig = Figure(figsize=(8, 3.8), layout="constrained")
    ax = fig.add_subplot()
    data = state.series()
    names = list(data.columns)[:max_lines]
    values = data[names].to_numpy(dtype=float) if names else np.empty((0, 0))
    finite = np.isfinite(values)
    if not finite.any():
        ax.text(0.5, 0.5, "no data: " + why_empty(state, names), ha="center", va="center",
                wrap=True, transform=ax.transAxes, fontsize=10, color="#555")
        ax.set_axis_off()
        return fig
    handles, labels = _draw_lines(ax, state, data.index.to_numpy(), names, values, finite)
    title = f"{state.metric} per step"
    positive = finite & (np.nan_to_num(values, nan=0.0) > 0)
    if state.log_scale and positive.any():
        ax.set_yscale("log", nonpositive="mask")
    elif state.log_scale:
        title += " (linear: no positive values to put on a log scale)"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    if len(handles) <= _MAX_LEGEND:
        # explicit labels: the legend would otherwise drop names starting with '_'
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def _draw_lines(ax, state, steps, names, values, finite) -> tuple[list, list[str]]:
    """Plot one line per name (problems bold, with their verdicts in the label); returns the
    (handles, labels) for the legend, so that the caller decides whether to show one."""
    rank = dict(zip(state._names, state._rank))
    verdicts = dict(zip(state._names, state._verdicts))
    handles, labels = [], []
    for j, name in enumerate(names):
        problem = rank.get(name, 0) > 0
        line, = ax.plot(steps, values[:, j], marker="o", ms=3.5, lw=2.2 if problem else 1.2,
                        alpha=1 if problem else 0.7)
        label = truncate_left(name, 60)
        if problem:
            label += f" [{', '.join(verdicts[name])}]"
        if not finite[:, j].any():
            label += " (no data)"
        handles.append(line)
        labels.append(label.replace("$", r"\$"))   # names are text, never mathtext
    return handles, labels


def why_empty(state, names: list[str]) -> str:
    """Why the plot has nothing to draw, from the most basic cause on: an empty plot alone
    would leave the user guessing between no tensors, no steps, filters and NaN."""
    if not len(state.params):
        return "the diagnosis holds no tensors"
    if not len(state.steps):
        return "no step was observed" + (
            f" (the diagnosis stopped at step {state.failure.step})" if state.failure else "")
    if not len(state._filtered()[0]):
        return "no tensor matches the filters"
    if not names:
        return "no tensor is selected"
    return (f"{state.metric} is NaN on every step for the {len(names)} selected tensor"
            f"{'s' if len(names) != 1 else ''}")


# ---------------------------------------------------------------------- the table
def table_html(state, limit: int = 50) -> str:
    """The filtered rows as an HTML table (problems first, at most `limit`); every name is
    escaped, since tensor and module names come from user code."""
    rows, table = state._filtered()
    rows_idx = rows[:limit]
    selected = set(state.selected)
    esc = html.escape
    head = [*TABLE_HEAD, state.metric]
    out = [f"<div class='diagkit-explorer-table'><p>{len(table):,} of {len(state.params):,} "
           f"tensors match"
           + (f"; showing the first {len(rows_idx):,}" if len(table) > len(rows_idx) else "")
           + "</p>",
           "<table style='border-collapse:collapse;font-size:12px'><thead><tr>"
           + "".join(f"<th style='text-align:left;padding:2px 6px'>{esc(h)}</th>"
                     for h in head) + "</tr></thead><tbody>"]
    for i in rows_idx:
        row = state.params.iloc[i]
        cells = _cells(row, state._verdicts[i], state.metric, row["name"] in selected)
        level = severity.named(state._rank[i])
        color = "transparent" if level == "ok" else severity.COLORS[level][1]
        out.append(f"<tr style='border-left:4px solid {color}'>" + "".join(
            f"<td style='padding:2px 6px'>{c}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _cells(row, verdicts: tuple[str, ...], metric: str, selected: bool) -> list[str]:
    """One table row's cells, escaped, in `TABLE_HEAD` order then the metric; a selected
    tensor's name is bold so the table shows what the plot draws."""
    esc = html.escape
    name = esc(str(row["name"]))
    if selected:
        name = f"<b>{name}</b>"
    return [
        name,
        esc(", ".join(verdicts)),
        esc(_fmt(row.get("module"))),
        esc(_fmt(row.get("module_type"))),
        esc(_fmt(row.get("shape"))),
        esc(_fmt(row.get("requires_grad"))),
        esc(f"{_fmt(row.get('optimizer'))} / {_fmt(row.get('group'))}"
            if not _missing(row.get("optimizer")) else "none"),
        esc(_fmt(row.get("lr"))),
        esc(f"{_fmt(row.get('used_steps'))} / {_fmt(row.get('steps'))}"),
        esc(_fmt(row.get(metric))),
    ]


def _missing(value) -> bool:
    """None, pandas' NA and float NaN all mean 'not known': the table shows them blank."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _fmt(value) -> str:
    """A cell's text: shapes as shapes, flags as yes/no, floats to 3 significant digits."""
    if isinstance(value, (tuple, list)):
        return fmt_shape(value)
    if _missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return f"{value:.3g}"
    return str(value)
