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
from ..core.format import dotted_breaks, fmt_shape, truncate_left
from .plots import log_floor   # where a 0 sits on a log axis: the static plots' rule, shared

_MAX_LEGEND = 15      # above this many lines the legend is left out

# The table's columns, the ones that tell what is wrong first: the metric's own column comes
# third (after name and verdicts), so it stays in view in a narrow output area. No module
# column: the name holds the module path, and the module filter selects by it. The rest of
# what is known of a tensor (its optimizer and group, lr, shape, type, frozen) is a second
# line under its name, each fact kept whole: nine columns of facts that never wrapped were
# 762 px wide in a 521 px output area at 968 px, the lr cut to '0.00'.
TABLE_HEAD = ("name", "verdicts", "used / steps")
# Names wrap at their dots only (`core.format.dotted_breaks`), verdicts between verdicts, a
# header between its words; a number, a shape or a type is never broken in two.
_CELL_STYLE = {0: "min-width:7em"}
_NOWRAP = "white-space:nowrap"
_FACTS = "font-size:11px;color:var(--jp-content-font-color2,#555)"


# ---------------------------------------------------------------------- the plot
def figure(state, *, max_lines: int, ylabel: str) -> Figure:
    """A line per selected tensor: the state's metric over the steps, at most `max_lines`
    lines, the y axis labelled `ylabel` (the caller owns both: they are the state's settings).
    Says 'no data', and why, when there is nothing finite to draw. On a log scale a 0 (an
    orphan's change, every step) is drawn on a dotted floor line, as the static plots draw it
    (`plots.log_floor`), and the title says so: a log axis alone would drop it without a word."""
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
    title = f"{state.metric} per step"
    zeros = finite & (np.nan_to_num(values, nan=1.0) <= 0)
    floor = log_floor(values[finite & ~zeros]) if state.log_scale and zeros.any() else None
    if floor is not None:
        values = np.where(zeros, floor, values)
        title += f" (log; a 0 is drawn at {floor:.0e}, dotted)"
    handles, labels = _draw_lines(ax, state, data.index.to_numpy(), names, values, finite)
    if floor is not None:   # after the tensors' lines: ax.lines stay in the legend's order
        handles.append(ax.axhline(floor, color="0.4", ls=":", lw=1))
        labels.append(f"0 (drawn at {floor:.0e})")
    if floor is not None:   # the floor in view, below every line (zeros only: a decade up too)
        top = float(np.nanmax(values))
        ax.set_ylim(floor / 2, top * 2 if top > floor else floor * 10)
    if state.log_scale:
        ax.set_yscale("log", nonpositive="mask")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    if len(names) <= _MAX_LEGEND:
        # explicit labels: the legend would otherwise drop names starting with '_'
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def alt_text(state, *, max_lines: int, most: int = 8) -> str:
    """The plot in words, for its alt text: the metric, the scale, the steps, and each drawn
    tensor's first and last value (at most `most` of them named); or why there is nothing."""
    data = state.series()
    names = list(data.columns)[:max_lines]
    values = data[names].to_numpy(dtype=float) if names else np.empty((0, 0))
    if not np.isfinite(values).any():
        return f"Plot of {state.metric} per step: no data: {why_empty(state, names)}."
    steps = data.index.to_numpy()
    scale = "log" if state.log_scale else "linear"
    said = []
    for j, name in enumerate(names[:most]):
        column = values[:, j][np.isfinite(values[:, j])]
        verdicts = [v for v in state.verdicts_of(name) if v != "ok"]
        label = name + (f" ({', '.join(verdicts)})" if verdicts else "")
        said.append(f"{label}: no value" if not len(column) else
                    f"{label}: {column[0]:.3g} to {column[-1]:.3g}")
    more = f"; and {len(names) - most} more" if len(names) > most else ""
    return (f"Plot of {state.metric} per step ({scale} scale), steps {steps.min()} to "
            f"{steps.max()}, {len(names)} tensor{'s' * (len(names) != 1)}, first to last "
            f"value: " + "; ".join(said) + more + ".")


def _draw_lines(ax, state, steps, names, values, finite) -> tuple[list, list[str]]:
    """Plot one line per name (problems bold, with their verdicts in the label); returns the
    (handles, labels) for the legend, so that the caller decides whether to show one."""
    rank = dict(zip(state.tensor_names, state.severity_ranks))
    verdicts = dict(zip(state.tensor_names, state.tensor_verdicts))
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
    if not len(state.filtered()[0]):
        return "no tensor matches the filters"
    if not names:
        return "no tensor is selected"
    other = [m for m in metrics_with_data(state, names) if m != state.metric]
    return (f"{state.metric} is NaN on every step for the {len(names)} selected tensor"
            f"{'s' if len(names) != 1 else ''}; "
            + (f"switch the metric to {other[0]} to see them" if other
               else "pick other tensors"))


def metrics_with_data(state, names: list[str]) -> list[str]:
    """The metrics (in the state's order) with a value for any of `names`: what the user can
    switch to when the chosen metric has nothing to draw."""
    return state.data.metrics_with_data(names)


# ---------------------------------------------------------------------- the status line
def status_text(state, *, max_lines: int) -> str:
    """The explorer's one status line (plain text): what matches, then anything the user
    should know; the only place that counts the matches, so it is never said twice."""
    parts = []
    if state.failure is not None:
        parts.append(f"the diagnosis stopped at step {state.failure.step}: "
                     f"{state.failure.error}")
    if state.regex_error:
        parts.append(state.regex_error)
    matching = len(state.filtered()[0])
    parts.append(f"{matching:,} of {len(state.params):,} tensors match")
    if state.module_prefix and not state.module_mask().any():
        parts.append(f"no module is named {state.module_prefix!r} or lies under it")
    if not len(state.steps):
        parts.append("the steps table is empty: no step was observed")
    selected = state.selected
    if state.picked_finding is not None and matching:
        parts.append(_picked_finding(state, selected))
    if state.unpicked and matching:  # nothing matching: nothing to go back to
        parts.append("no tensor is picked now: the plot is back to the default selection ("
                     + _composition(state, selected) + ")")
    if len(selected) > max_lines:
        parts.append(f"plotting the first {max_lines} of {len(selected)} selected tensors")
    parts += _hidden_problems(state, selected)
    note = state.options().note
    if note and matching:
        parts.append(note)
    return "; ".join(parts)


def _composition(state, names: list[str]) -> str:
    """'2 problem tensors and 4 ok ones': what a selection holds, counted by what they are
    (the default selection holds ok tensors too when the filter has few problems)."""
    problems = sum(1 for n in names if any(v != "ok" for v in state.verdicts_of(n)))
    ok = len(names) - problems
    said = [f"{problems} problem tensor{'s' * (problems != 1)}"] if problems else []
    if ok:
        said.append(f"{ok} ok tensor{'s' * (ok != 1)}" if not said else
                    f"{ok} ok one{'s' * (ok != 1)}")
    return " and ".join(said) or "no tensor"


def _picked_finding(state, selected: list[str]) -> str:
    """What picking a finding did: its tensors plotted, and the filters it set."""
    f = state.picked_finding
    where = f" in {f.module}" if f.module else ""
    shown = f"{len(selected)} tensor{'s' * (len(selected) != 1)}"
    filters = [f"verdict {f.code}"] if state.verdicts else []
    filters += [f"module {state.module_prefix}"] if state.module_prefix else []
    return (f"finding picked: {f.code}{where}: its {shown} plotted"
            + (f", the filters set to its {' and '.join(filters)}" if filters else ""))


def _hidden_problems(state, selected: list[str]) -> list[str]:
    """Says which problem tensors the default plot leaves out for want of data, and how to
    see them: they lead the table, so the user would otherwise wonder why no line is theirs."""
    hidden = state.problems_without_data()
    if not hidden or not selected or set(hidden) & set(selected):
        return []
    verdicts = dict(zip(state.tensor_names, state.tensor_verdicts))
    kinds = sorted({v for n in hidden for v in verdicts[n]})
    other = [m for m in metrics_with_data(state, hidden) if m != state.metric]
    how = f"switch the metric to {other[0]} or pick them" if other else "pick them"
    return [f"not plotted: {len(hidden)} problem tensor{'s' if len(hidden) != 1 else ''} "
            f"({', '.join(kinds)}) without {state.metric} on any step; {how}"]


# ---------------------------------------------------------------------- the table
def table_html(state, limit: int = 50) -> str:
    """The filtered rows as an HTML table (problems first, at most `limit`); every name is
    escaped, since tensor and module names come from user code."""
    rows, table = state.filtered()
    rows_idx = rows[:limit]
    selected = set(state.selected)
    esc = html.escape
    head = [*TABLE_HEAD[:2], state.metric, *TABLE_HEAD[2:]]
    # The status line above counts the matches; the table says only what it leaves out. It
    # takes the output area's width and wraps its cells rather than growing past it.
    out = ["<div class='diagkit-explorer-rows' style='max-width:100%;overflow-x:auto;"
           "line-height:1.35'>"
           + (f"<p>showing the first {len(rows_idx):,} of {len(table):,} matching tensors "
              f"(problems first)</p>" if len(table) > len(rows_idx) else ""),
           "<table style='border-collapse:collapse;font-size:12px;width:100%;"
           "table-layout:auto'><thead><tr>"
           + "".join(f"<th style='text-align:left;padding:2px 6px;vertical-align:bottom'>"
                     f"{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for i in rows_idx:
        row = state.params.iloc[i]
        cells = _cells(row, state.tensor_verdicts[i], state.metric, row["name"] in selected)
        level = severity.named(state.severity_ranks[i])
        color = "transparent" if level == "ok" else severity.COLORS[level][1]
        out.append(f"<tr style='border-left:4px solid {color}'>" + "".join(
            f"<td style='padding:2px 6px;vertical-align:top;{_CELL_STYLE.get(j, '')}'>"
            f"{c}</td>" for j, c in enumerate(cells)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _cells(row, verdicts: tuple[str, ...], metric: str, selected: bool) -> list[str]:
    """One table row's cells, escaped, in the header's order (name, verdicts, the metric, then
    the rest of `TABLE_HEAD`); a selected tensor's name is bold so the table shows what the
    plot draws; under the name, its other facts (`_facts`)."""
    esc = html.escape
    name = dotted_breaks(esc(str(row["name"])))
    if selected:
        name = f"<b>{name}</b>"
    return [
        f"{name}<div style='{_FACTS}'>{_facts(row)}</div>",
        ", ".join(_whole(v) for v in verdicts),
        _whole(_fmt(row.get(metric))),
        _whole(f"{_fmt(row.get('used_steps'))} / {_fmt(row.get('steps'))}"),
    ]


def _facts(row) -> str:
    """'optimizer 0, group 1 · lr 0.0003 · 32×32 · Linear · frozen': each fact kept whole
    (its words may wrap between them, a number never), the line wrapping between facts."""
    facts = [["no optimizer"]]
    if not _missing(row.get("optimizer")):
        facts = [[f"optimizer {_fmt(row.get('optimizer'))},", f"group {_fmt(row.get('group'))}"]]
        if _fmt(row.get("lr")):
            facts.append([f"lr {_fmt(row.get('lr'))}"])
    facts += [[_fmt(row.get("shape"))], [_fmt(row.get("module_type"))]]
    grad = row.get("requires_grad")
    if not _missing(grad) and not bool(grad):
        facts.append(["frozen"])
    return " · ".join(" ".join(_whole(p) for p in fact) for fact in facts if any(fact))


def _whole(text: str) -> str:
    """A fact, escaped, that never wraps inside ('0.0003', '(4096, 4096)', '5 / 5')."""
    return f"<span style='{_NOWRAP}'>{html.escape(text)}</span>" if text else ""


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
