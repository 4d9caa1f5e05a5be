"""Figures from the result tables. Each takes tables and returns a matplotlib Figure; none
measures anything. Uses `matplotlib.figure.Figure` directly, so no GUI backend is touched.

Readable at any size: at most `top` tensors are drawn as named lines (flagged ones first, ranked
as the tables rank them); every other tensor goes into one median line with a 10-90 % band.
A figure with nothing to draw (no step completed) says "no data" instead of raising.
"""


from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..core import extras, severity

try:  # the figures are the workbook extra's (README, "Install"): one line without it
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
except ImportError as exc:
    raise extras.missing_error(exc, "diagkit's plotting") from None

from ..measure.tables.aggregate import fold_ranks
from .figure import axes, finish, label, no_data, verdict_text
from .ranking import problems_first, row_severity

_PALETTE = ("tab:red", "tab:orange", "tab:purple", "tab:blue", "tab:green", "tab:brown",
           "tab:pink", "tab:olive", "tab:cyan")  # flagged tensors: the worst one red


_CALM = ("tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
        "tab:gray")  # nothing flagged: no alarming colours


_BAND = "0.55"


# Verdicts whose .grad keeps growing: the figure points at them.
_ACCUMULATING = ("orphan", "grad_not_cleared")


def _wide(steps: pd.DataFrame, columns: list[str]) -> dict[str, pd.DataFrame]:
    """step x name matrices of the given columns (ranks folded as every presenter folds them)."""
    s = fold_ranks(steps)[["step", "name", *columns]]
    table = s.groupby(["step", "name"], sort=True)[columns].first().unstack("name")
    return {c: table[c] for c in columns}


def _positive(frame: pd.DataFrame) -> np.ndarray:
    """Values usable on a log axis; zero, negative and non-finite become NaN."""
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    return np.where(np.isfinite(values) & (values > 0), values, np.nan)


def _band(ax, x, values: np.ndarray, what: str) -> None:
    """Median line and 10-90 % band over the columns of `values` (steps x tensors)."""
    n = values.shape[1]
    if n == 0 or not np.isfinite(values).any():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # steps where none has a value
        lo, mid, hi = np.nanquantile(values, [0.1, 0.5, 0.9], axis=1)
    ax.fill_between(x, lo, hi, color=_BAND, alpha=0.25, lw=0, label="_band")
    ax.plot(x, mid, color=_BAND, lw=1.6, label=f"{what} of {n} other tensor{'s' if n != 1 else ''}"
            " (median, band 10-90 %)")


def _color(i: int, flagged: bool) -> str:
    palette = _PALETTE if flagged else _CALM
    return palette[i % len(palette)]


def _pick(params: pd.DataFrame, has_data: pd.Index, size: pd.Series, top: int, prefer=()):
    """(named tensors, flagged tensors without data): the flagged ones that have data, in table
    order, those with a verdict in `prefer` first; when there are none, the `top` largest by
    `size`."""
    order = params.iloc[problems_first(params)]
    order = order[row_severity(order) != "ok"]
    preferred = order["verdicts"].map(lambda vs: any(v in prefer for v in vs))
    flagged = pd.concat([order.loc[preferred, "name"], order.loc[~preferred, "name"]])
    named = [n for n in flagged if n in has_data][:top]
    missing = [n for n in flagged if n not in has_data]
    if not named:  # nothing flagged has data to draw: show the largest instead
        named = list(size.reindex(has_data).sort_values(ascending=False, kind="stable")
                     .index[:top])
    return named, missing


def _verdicts_of(params: pd.DataFrame) -> dict:
    return dict(zip(params["name"], params["verdicts"]))


def grad_norm_figure(steps: pd.DataFrame, params: pd.DataFrame, top: int = 8) -> Figure:
    """Fresh gradient vs the .grad the optimizer sees, per step, flagged tensors first.

    Solid: `.grad` (`grad_total_norm`); dashed: this step's own gradient (`grad_norm`). An
    orphan's .grad grows step after step while its fresh gradient stays flat: on a log scale,
    and annotated, that is unmistakable. Every tensor not named is in the median/band.
    """
    fig, ax = axes()
    title = "gradient norms: this step's gradient vs the .grad the optimizer sees"
    if steps.empty or params.empty:
        no_data(ax, "no tensors" if params.empty else "no step completed", title,
                 "L2 norm (log)")
        return fig
    wide = _wide(steps, ["grad_total_norm", "grad_norm"])
    total, fresh = wide["grad_total_norm"], wide["grad_norm"]
    pos_total, pos_fresh = _positive(total), _positive(fresh.reindex(columns=total.columns))
    data = np.isfinite(pos_total).any(axis=0) | np.isfinite(pos_fresh).any(axis=0)
    if not data.any():
        no_data(ax, "no gradient was recorded on any step", title, "L2 norm (log)")
        return fig
    names = total.columns
    col = {n: i for i, n in enumerate(names)}
    has_data = names[data]
    largest = pd.Series(np.where(np.isfinite(pos_total), pos_total, 0).max(axis=0), index=names)
    named, missing = _pick(params, has_data, largest, top, prefer=_ACCUMULATING)
    verdicts = _verdicts_of(params)
    x = total.index.to_numpy()
    ax.set_yscale("log", nonpositive="mask")
    others = [col[n] for n in has_data if n not in set(named)]
    _band(ax, x, pos_total[:, others], ".grad")
    lines = [(n, (pos_total[:, col[n]], pos_fresh[:, col[n]])) for n in named]
    dashed = _grad_lines(ax, x, lines, verdicts)
    notes, style = _grad_legend(missing, verdicts, dashed)
    finish(ax, title, "L2 norm (log)", notes, style)
    return fig


def _grad_lines(ax, x, lines: list, verdicts: dict) -> bool:
    """Draw each named tensor's .grad (solid) and, where it differs, its own gradient of the
    step (dashed); the first one, if its .grad accumulates, is annotated. `lines`: (name,
    (.grad norms, fresh norms)) in drawing order. Returns whether any dashed line was drawn, so
    that the legend explains the dashes only when there are some."""
    marker = "o" if len(x) <= 30 else None
    growing = [n for n, vs in verdicts.items() if any(v in _ACCUMULATING for v in vs)]
    dashed = False
    for i, (name, (y_total, y_fresh)) in enumerate(lines):
        vs = tuple(verdicts.get(name, ("ok",)))
        flagged = vs != ("ok",) and any(v != "ok" for v in vs)
        color = _color(i, flagged)
        legend = label(name) + (f"  [{verdict_text(vs)}]" if flagged else "")
        lw = 2.4 if name in growing else 1.6 if flagged else 1.2
        ax.plot(x, y_total, color=color, lw=lw, marker=marker, ms=3.5, label=legend)
        if not np.allclose(y_fresh, y_total, equal_nan=True):  # else it hides behind .grad
            ax.plot(x, y_fresh, color=color, lw=1.2, ls="--", alpha=0.9, label=f"_fresh {name}")
            dashed = True
        if i == 0 and name in growing:
            _annotate_growth(ax, x, y_total, name, vs, len(growing) - 1)
    return dashed


def _grad_legend(missing: list[str], verdicts: dict, dashed: bool) -> tuple[list[str], list]:
    """(notes, style entries) of the gradient figure's legend: the flagged tensors that could
    not be drawn, counted by verdict so none goes unmentioned, and what solid and dashed mean."""
    notes = []
    if missing:
        kinds = pd.Series([verdict_text(verdicts[n]) for n in missing]).value_counts()
        notes.append(f"not drawn: {len(missing)} flagged tensor{'s' if len(missing) != 1 else ''}"
                     f" without gradient ({', '.join(f'{k}: {v}' for k, v in kinds.items())})")
    style = [Line2D([], [], color="0.2", lw=2, label=".grad the optimizer sees")]
    if dashed:
        style.append(Line2D([], [], color="0.2", lw=1.2, ls="--",
                            label="gradient of the step itself"))
    else:
        notes.append("(each drawn .grad is exactly its step's own gradient)")
    return notes, style


def _annotate_growth(ax, x, y, name: str, verdicts, more: int) -> None:
    """Point at the last .grad of a tensor whose .grad nothing clears, with its growth."""
    ok = np.flatnonzero(np.isfinite(y))
    if len(ok) == 0:
        return
    first, last = y[ok[0]], y[ok[-1]]
    growth = (f": .grad ×{last / first:.3g} over {len(ok)} steps, never cleared"
              if len(ok) > 1 and last > first else "")
    others = f"\n(and {more} more tensor{'s' if more != 1 else ''} like it)" if more else ""
    ax.annotate(f"{label(name, 32)}\n{verdict_text(verdicts)}{growth}{others}",
                xy=(x[ok[-1]], last), xytext=(-24, -30), textcoords="offset points",
                ha="right", va="top", fontsize=8, color=severity.COLORS["error"][1],
                fontweight="bold", arrowprops={"arrowstyle": "->", "color": "0.2"},
                bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.6", "alpha": 0.9})


def update_ratio_figure(steps: pd.DataFrame, params: pd.DataFrame, top: int = 8) -> Figure:
    """Update-to-weight ratio (‖Δw‖ / ‖w‖) per step, log scale, flagged tensors first.

    A step on which a drawn tensor did not change (ratio 0) is drawn on a dotted floor line
    below every real value; tensors not drawn that never changed, or whose ratio is undefined
    (a zero-norm value), are counted in the legend.
    """
    fig, ax = axes()
    title = "update-to-weight ratio per step"
    ylabel = "‖Δw‖ / ‖w‖ (log)"
    if steps.empty or params.empty:
        no_data(ax, "no tensors" if params.empty else "no step completed", title, ylabel)
        return fig
    wide = _wide(steps, ["update_ratio", "delta_norm"])
    ratio = wide["update_ratio"]
    values = ratio.to_numpy(dtype=float, na_value=np.nan)
    finite = np.isfinite(values)
    if not finite.any():
        unmeasured = steps["delta_norm"].isna().all()  # delta="off": change norms not measured
        no_data(ax, "change norms not measured (delta=\"off\")" if unmeasured
                 else "no update ratio was recorded", title, ylabel)
        return fig
    positive = finite & (values > 0)
    floor = log_floor(values[positive])
    names = ratio.columns
    col = {n: i for i, n in enumerate(names)}
    has_data = names[finite.any(axis=0)]
    mean = pd.Series(np.where(positive, values, 0).mean(axis=0), index=names)
    named, _ = _pick(params, has_data, mean, top)
    x = ratio.index.to_numpy()
    ax.set_yscale("log", nonpositive="mask")
    taken = set(named)
    rest = np.array([col[n] for n in has_data if n not in taken], dtype=int)
    changing = rest[positive[:, rest].any(axis=0)] if len(rest) else rest
    _band(ax, x, np.where(positive[:, changing], values[:, changing], np.nan), "ratio")
    lines = [(n, values[:, col[n]]) for n in named]
    drew_floor = _ratio_lines(ax, x, lines, _verdicts_of(params), floor)
    if drew_floor or not positive.any():
        ax.axhline(floor, color="0.4", ls=":", lw=1, label=f"0: no change (drawn at {floor:.0e})")
    # no change norm on any step: checked without a copy (the frozen base, docs/cost.md)
    unmeasured = int(wide["delta_norm"].isna().all(axis=0).sum())
    notes = _ratio_notes(never=len(rest) - len(changing),
                         undefined=len(names) - len(has_data) - unmeasured, unmeasured=unmeasured)
    finish(ax, title, ylabel, notes, [])
    if positive.any():
        ax.set_ylim(bottom=floor / 2)
    return fig


def log_floor(positive_values: np.ndarray) -> float:
    """Where a ratio of 0 is drawn on the log axis: a decade below the next power of ten under
    the smallest real ratio, so 'no change' sits visibly below every real value."""
    smallest = positive_values.min() if positive_values.size else 1e-5
    return 10.0 ** (np.floor(np.log10(smallest)) - 1)


def _ratio_lines(ax, x, lines: list, verdicts: dict, floor: float) -> bool:
    """Draw each named tensor's ratio ((name, ratios per step), in drawing order), its zeros
    moved up to `floor`, which a log axis could not show. Returns whether any point was put on
    the floor, so that the floor line is drawn only when something sits on it."""
    marker = "o" if len(x) <= 30 else None
    drew_floor = False
    for i, (name, y) in enumerate(lines):
        vs = tuple(verdicts.get(name, ("ok",)))
        flagged = any(v != "ok" for v in vs)
        at_floor = np.isfinite(y) & (y <= 0)
        drew_floor |= bool(at_floor.any())
        y = np.where(at_floor, floor, y)
        legend = label(name) + (f"  [{verdict_text(vs)}]" if flagged else "")
        ax.plot(x, y, color=_color(i, flagged), lw=2.2 if flagged else 1.2,
                marker=marker, ms=3.5, label=legend)
    return drew_floor


def _ratio_notes(never: int, undefined: int, unmeasured: int = 0) -> list[str]:
    """Legend notes for the tensors the ratio figure cannot draw: none is silently left out."""
    notes = []
    if unmeasured:
        notes.append(f"{unmeasured} tensor{'s' if unmeasured != 1 else ''} checked without a "
                     "copy (changed or not, no ratio)")
    if never:
        notes.append(f"{never} other tensor{'s' if never != 1 else ''} never changed (ratio 0)")
    if undefined:
        notes.append(f"{undefined} tensor{'s' if undefined != 1 else ''} without a ratio "
                     "(value norm 0)")
    return notes
