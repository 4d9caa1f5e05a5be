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
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from .tables import (SEVERITY_COLORS, problems_first, row_severity, subtree_labels,
                     truncate_left)

LABEL_WIDTH = 42  # characters of a tensor name in a legend or row label (cut from the left)
PALETTE = ("tab:red", "tab:orange", "tab:purple", "tab:blue", "tab:green", "tab:brown",
           "tab:pink", "tab:olive", "tab:cyan")  # flagged tensors: the worst one red
CALM = ("tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
        "tab:gray")  # nothing flagged: no alarming colours
BAND = "0.55"
# Verdicts whose .grad keeps growing: the figure points at them.
ACCUMULATING = ("orphan", "grad_not_cleared")


# ------------------------------------------------------------------ shared pieces
def _axes(width: float = 9.5, height: float = 4.4):
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _no_data(ax, why: str, title: str, ylabel: str, xlabel: str = "step") -> None:
    ax.text(0.5, 0.5, f"no data: {why}", ha="center", va="center", transform=ax.transAxes,
            fontsize=11, color="0.35")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _wide(steps: pd.DataFrame, columns: list[str]) -> dict[str, pd.DataFrame]:
    """step x name matrices of the given columns, one groupby for all (max over ranks)."""
    s = steps[["step", "name", *columns]]
    table = s.groupby(["step", "name"], sort=True)[columns].max().unstack("name")
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
    ax.fill_between(x, lo, hi, color=BAND, alpha=0.25, lw=0, label="_band")
    ax.plot(x, mid, color=BAND, lw=1.6, label=f"{what} of {n} other tensor{'s' if n != 1 else ''}"
            " (median, band 10-90 %)")


def _label(name: str, width: int = LABEL_WIDTH) -> str:
    """A tensor name for a plot: cut from the left, `$` escaped so it is never mathtext, and
    never starting with `_` (which would hide it from the legend)."""
    label = truncate_left(name, width).replace("$", r"\$")
    return " " + label if label.startswith("_") else label


def _color(i: int, flagged: bool) -> str:
    palette = PALETTE if flagged else CALM
    return palette[i % len(palette)]


def _verdict_text(verdicts) -> str:
    return ", ".join(v for v in verdicts if v != "ok") or "ok"


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


def _finish(ax, title: str, ylabel: str, notes: list[str], handles: list) -> None:
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="major", alpha=0.3)
    extra = handles + [Line2D([], [], ls="none", label=n) for n in notes]
    lines, labels = ax.get_legend_handles_labels()
    ax.legend(lines + extra, labels + [h.get_label() for h in extra], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)


def _verdicts_of(params: pd.DataFrame) -> dict:
    return dict(zip(params["name"], params["verdicts"]))


# ------------------------------------------------------------------ gradient norms
def grad_norm_figure(steps: pd.DataFrame, params: pd.DataFrame, top: int = 8) -> Figure:
    """Fresh gradient vs the .grad the optimizer sees, per step, flagged tensors first.

    Solid: `.grad` (`grad_total_norm`); dashed: this step's own gradient (`grad_norm`). An
    orphan's .grad grows step after step while its fresh gradient stays flat: on a log scale,
    and annotated, that is unmistakable. Every tensor not named is in the median/band.
    """
    fig, ax = _axes()
    title = "gradient norms: this step's gradient vs the .grad the optimizer sees"
    if steps.empty or params.empty:
        _no_data(ax, "no tensors" if params.empty else "no step completed", title,
                 "L2 norm (log)")
        return fig
    wide = _wide(steps, ["grad_total_norm", "grad_norm"])
    total, fresh = wide["grad_total_norm"], wide["grad_norm"]
    pos_total, pos_fresh = _positive(total), _positive(fresh.reindex(columns=total.columns))
    data = np.isfinite(pos_total).any(axis=0) | np.isfinite(pos_fresh).any(axis=0)
    if not data.any():
        _no_data(ax, "no gradient was recorded on any step", title, "L2 norm (log)")
        return fig
    names = total.columns
    col = {n: i for i, n in enumerate(names)}
    has_data = names[data]
    largest = pd.Series(np.where(np.isfinite(pos_total), pos_total, 0).max(axis=0), index=names)
    named, missing = _pick(params, has_data, largest, top, prefer=ACCUMULATING)
    verdicts = _verdicts_of(params)
    x = total.index.to_numpy()
    ax.set_yscale("log", nonpositive="mask")
    others = [col[n] for n in has_data if n not in set(named)]
    _band(ax, x, pos_total[:, others], ".grad")
    marker = "o" if len(x) <= 30 else None
    growing = [n for n, vs in verdicts.items() if any(v in ACCUMULATING for v in vs)]
    dashed = False
    for i, name in enumerate(named):
        vs = tuple(verdicts.get(name, ("ok",)))
        flagged = vs != ("ok",) and any(v != "ok" for v in vs)
        color = _color(i, flagged)
        label = _label(name) + (f"  [{_verdict_text(vs)}]" if flagged else "")
        y_total, y_fresh = pos_total[:, col[name]], pos_fresh[:, col[name]]
        lw = 2.4 if name in growing else 1.6 if flagged else 1.2
        ax.plot(x, y_total, color=color, lw=lw, marker=marker, ms=3.5, label=label)
        if not np.allclose(y_fresh, y_total, equal_nan=True):  # else it hides behind .grad
            ax.plot(x, y_fresh, color=color, lw=1.2, ls="--", alpha=0.9, label=f"_fresh {name}")
            dashed = True
        if i == 0 and name in growing:
            _annotate_growth(ax, x, y_total, name, vs, len(growing) - 1)
    notes = []
    if missing:
        kinds = pd.Series([_verdict_text(verdicts[n]) for n in missing]).value_counts()
        notes.append(f"not drawn: {len(missing)} flagged tensor{'s' if len(missing) != 1 else ''}"
                     f" without gradient ({', '.join(f'{k}: {v}' for k, v in kinds.items())})")
    style = [Line2D([], [], color="0.2", lw=2, label=".grad the optimizer sees")]
    if dashed:
        style.append(Line2D([], [], color="0.2", lw=1.2, ls="--",
                            label="gradient of the step itself"))
    else:
        notes.append("(each drawn .grad is exactly its step's own gradient)")
    _finish(ax, title, "L2 norm (log)", notes, style)
    return fig


def _annotate_growth(ax, x, y, name: str, verdicts, more: int) -> None:
    """Point at the last .grad of a tensor whose .grad nothing clears, with its growth."""
    ok = np.flatnonzero(np.isfinite(y))
    if len(ok) == 0:
        return
    first, last = y[ok[0]], y[ok[-1]]
    growth = (f": .grad ×{last / first:.3g} over {len(ok)} steps, never cleared"
              if len(ok) > 1 and last > first else "")
    others = f"\n(and {more} more tensor{'s' if more != 1 else ''} like it)" if more else ""
    ax.annotate(f"{_label(name, 32)}\n{_verdict_text(verdicts)}{growth}{others}",
                xy=(x[ok[-1]], last), xytext=(-24, -30), textcoords="offset points",
                ha="right", va="top", fontsize=8, color=SEVERITY_COLORS["error"][1],
                fontweight="bold", arrowprops={"arrowstyle": "->", "color": "0.2"},
                bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.6", "alpha": 0.9})


# ------------------------------------------------------------------ update ratios
def update_ratio_figure(steps: pd.DataFrame, params: pd.DataFrame, top: int = 8) -> Figure:
    """Update-to-weight ratio (‖Δw‖ / ‖w‖) per step, log scale, flagged tensors first.

    A step on which a drawn tensor did not change (ratio 0) is drawn on a dotted floor line
    below every real value; tensors not drawn that never changed, or whose ratio is undefined
    (a zero-norm value), are counted in the legend.
    """
    fig, ax = _axes()
    title = "update-to-weight ratio per step"
    ylabel = "‖Δw‖ / ‖w‖ (log)"
    if steps.empty or params.empty:
        _no_data(ax, "no tensors" if params.empty else "no step completed", title, ylabel)
        return fig
    ratio = _wide(steps, ["update_ratio"])["update_ratio"]
    values = ratio.to_numpy(dtype=float, na_value=np.nan)
    finite = np.isfinite(values)
    if not finite.any():
        unmeasured = steps["delta_norm"].isna().all()  # delta="off": change norms not measured
        _no_data(ax, "change norms not measured (delta=\"off\")" if unmeasured
                 else "no update ratio was recorded", title, ylabel)
        return fig
    positive = finite & (values > 0)
    smallest = values[positive].min() if positive.any() else 1e-5
    floor = 10.0 ** (np.floor(np.log10(smallest)) - 1)
    names = ratio.columns
    col = {n: i for i, n in enumerate(names)}
    has_data = names[finite.any(axis=0)]
    mean = pd.Series(np.where(positive, values, 0).mean(axis=0), index=names)
    named, _ = _pick(params, has_data, mean, top)
    verdicts = _verdicts_of(params)
    x = ratio.index.to_numpy()
    ax.set_yscale("log", nonpositive="mask")
    taken = set(named)
    rest = np.array([col[n] for n in has_data if n not in taken], dtype=int)
    changing = rest[positive[:, rest].any(axis=0)] if len(rest) else rest
    _band(ax, x, np.where(positive[:, changing], values[:, changing], np.nan), "ratio")
    marker = "o" if len(x) <= 30 else None
    drew_floor = False
    for i, name in enumerate(named):
        vs = tuple(verdicts.get(name, ("ok",)))
        flagged = any(v != "ok" for v in vs)
        y = values[:, col[name]]
        at_floor = np.isfinite(y) & (y <= 0)
        drew_floor |= bool(at_floor.any())
        y = np.where(at_floor, floor, y)
        label = _label(name) + (f"  [{_verdict_text(vs)}]" if flagged else "")
        ax.plot(x, y, color=_color(i, flagged), lw=2.2 if flagged else 1.2,
                marker=marker, ms=3.5, label=label)
    notes = []
    if drew_floor or not positive.any():
        ax.axhline(floor, color="0.4", ls=":", lw=1, label=f"0: no change (drawn at {floor:.0e})")
    never = len(rest) - len(changing)
    if never:
        notes.append(f"{never} other tensor{'s' if never != 1 else ''} never changed (ratio 0)")
    undefined = len(names) - len(has_data)
    if undefined:
        notes.append(f"{undefined} tensor{'s' if undefined != 1 else ''} without a ratio "
                     "(value norm 0)")
    _finish(ax, title, ylabel, notes, [])
    if positive.any():
        ax.set_ylim(bottom=floor / 2)
    return fig


# ------------------------------------------------------------------ wiring matrix
MATRIX_COLUMNS = ("requires_grad", "in optimizer", "used", "changed")
MAX_GROUPS = 12  # aggregated rows at most, the smallest module subtrees lumped together


def _wiring_values(params: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per tensor: the four values in [0, 1] (NaN: unknown) and their cell texts."""
    steps = pd.to_numeric(params["steps"], errors="coerce").fillna(0).to_numpy(dtype=float)
    used = pd.to_numeric(params["used_steps"], errors="coerce").fillna(0).to_numpy(dtype=float)
    changed = pd.to_numeric(params["changed_steps"], errors="coerce").fillna(0).to_numpy(
        dtype=float)
    if "n_optimizers" in params:
        n_opt = pd.to_numeric(params["n_optimizers"], errors="coerce").fillna(0).to_numpy()
    else:
        n_opt = params["optimizer"].notna().to_numpy(dtype=float)
    rg = params["requires_grad"].astype(bool).to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac_used = np.where(steps > 0, used / steps, np.nan)
        frac_changed = np.where(steps > 0, changed / steps, np.nan)
    values = np.column_stack([rg, (n_opt > 0).astype(float), frac_used, frac_changed])
    yes_no = np.array(["no", "yes"])
    texts = np.column_stack([
        yes_no[rg.astype(int)],
        np.where(n_opt > 1, [f"{int(n)} opts" for n in n_opt], yes_no[(n_opt > 0).astype(int)]),
        [f"{int(u)}/{int(s)}" if s > 0 else "n/a" for u, s in zip(used, steps)],
        [f"{int(c)}/{int(s)}" if s > 0 else "n/a" for c, s in zip(changed, steps)],
    ])
    return values, texts


def _matrix_rows(params: pd.DataFrame, max_rows: int):
    """Rows of the matrix: (label, verdict text, severity, values, texts, aggregated)."""
    values, texts = _wiring_values(params)
    severity = row_severity(params).to_numpy()
    order = problems_first(params)
    names = params["name"].astype(str).to_numpy()
    verdicts = params["verdicts"].to_numpy()
    if len(params) <= max_rows:
        single, rest = order, np.array([], dtype=int)
    else:
        flagged = order[severity[order] != "ok"]
        single, rest = flagged[:max_rows], np.setdiff1d(order, flagged[:max_rows])
    rows = [(_label(names[i]), _verdict_text(verdicts[i]), severity[i],
             values[i], texts[i], False) for i in single]
    if len(rest):
        labels = subtree_labels(params, 1).to_numpy()[rest]
        sizes = pd.Series(labels).value_counts(sort=True)
        if len(sizes) > MAX_GROUPS:
            small = set(sizes.index[MAX_GROUPS - 1:])
            labels = np.array(["(other modules)" if lb in small else lb for lb in labels],
                              dtype=object)
        frame = pd.DataFrame(values[rest], columns=list(MATRIX_COLUMNS))
        frame["group"] = labels
        means = frame.groupby("group", sort=False).mean()
        counts = frame.groupby("group", sort=False).size()
        exploded = pd.Series(list(verdicts[rest]), index=labels).explode()
        exploded = exploded[exploded != "ok"]
        by_group = exploded.groupby(level=0).value_counts() if len(exploded) else None
        worst = pd.Series(severity[rest], index=labels)
        ranked = counts.sort_values(ascending=False, kind="stable").index
        for group in sorted(ranked, key=lambda g: g == "(other modules)"):
            n = int(counts[group])
            kinds = (by_group[group] if by_group is not None and group in by_group.index
                     else pd.Series(dtype=int))
            summary = ", ".join(f"{v} ×{c}" for v, c in kinds.head(2).items()) or "ok"
            sev = max(worst[[group]], key=lambda s: ("ok", "info", "warning", "error").index(s))
            vals = means.loc[group].to_numpy(dtype=float)
            cells = np.array(["n/a" if np.isnan(v) else f"{100 * v:.0f}%" for v in vals])
            rows.append((f"{_label(group, LABEL_WIDTH - 14)} ({n:,} tensors)", summary,
                         sev, vals, cells, True))
    return rows


def wiring_matrix_figure(params: pd.DataFrame, max_rows: int = 40) -> Figure:
    """requires_grad × in optimizer × used × changed, one row per tensor (flagged first).

    Past `max_rows` tensors, the flagged ones keep their own rows and the rest are gathered per
    top-level module subtree, each cell then the fraction of its tensors (or of their steps).
    """
    title = "wiring: requires_grad × optimizer × used × changed"
    if params.empty:
        fig, ax = _axes(8, 2.6)
        _no_data(ax, "no tensors", title, "tensor", xlabel="property")
        return fig
    rows = _matrix_rows(params, max(int(max_rows), 1))
    n = len(rows)
    fig, ax = _axes(9.5, min(1.7 + 0.25 * n, 40))
    matrix = np.array([r[3] for r in rows], dtype=float)
    cmap = colormaps["Blues"].with_extremes(bad="#eeeeee")
    ax.imshow(np.ma.masked_invalid(matrix * 0.75), cmap=cmap, vmin=0, vmax=1, aspect="auto",
              interpolation="nearest")
    for i, row in enumerate(rows):
        for j, text in enumerate(row[4]):
            v = matrix[i, j]
            ax.text(j, i, text, ha="center", va="center", fontsize=7.5,
                    color="white" if np.isfinite(v) and v > 0.75 else "0.15")
    ax.set_xticks(range(len(MATRIX_COLUMNS)), MATRIX_COLUMNS, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(n), [r[0] for r in rows], fontsize=7.5, family="monospace")
    side = ax.secondary_yaxis("right")
    side.set_yticks(range(n), [r[1] for r in rows], fontsize=7.5)
    for axis in (ax, side):
        for tick, row in zip(axis.get_yticklabels(), rows):
            tick.set_color(SEVERITY_COLORS.get(row[2], SEVERITY_COLORS["ok"])[1])
            tick.set_fontweight("bold" if row[2] != "ok" else "normal")
    aggregated = [i for i, r in enumerate(rows) if r[5]]
    if aggregated and aggregated[0] > 0:
        ax.axhline(aggregated[0] - 0.5, color="0.2", lw=1.2)
    ax.tick_params(length=0)
    any_steps = pd.to_numeric(params["steps"], errors="coerce").fillna(0).max() > 0
    ax.set_title(title + ("" if any_steps else "\n(no step completed: used/changed unknown)"))
    ax.set_xlabel("used, changed: steps out of those observed; grouped rows: share of tensors",
                  fontsize=8)
    ax.set_ylabel("tensor (flagged first)" if not aggregated
                  else "tensor (flagged first), then module subtrees")
    return fig
