"""The wiring matrix: requires_grad × in optimizer × used × changed, one row per tensor
(flagged first), the rest gathered per module subtree on large models."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core import extras, severity

try:  # the figures are the workbook extra's (README, "Install"): one line without it
    from matplotlib import colormaps
    from matplotlib.figure import Figure
except ImportError as exc:
    raise extras.missing_error(exc, "diagkit's plotting") from None

from .figure import LABEL_WIDTH, axes, label, no_data, verdict_text
from .ranking import problems_first, row_severity, subtree_labels


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
    level = row_severity(params).to_numpy()
    order = problems_first(params)
    names = params["name"].astype(str).to_numpy()
    verdicts = params["verdicts"].to_numpy()
    if len(params) <= max_rows:
        single, rest = order, np.array([], dtype=int)
    else:
        flagged = order[level[order] != "ok"]
        single, rest = flagged[:max_rows], np.setdiff1d(order, flagged[:max_rows])
    rows = [(label(names[i]), verdict_text(verdicts[i]), level[i],
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
        worst = pd.Series(level[rest], index=labels)
        ranked = counts.sort_values(ascending=False, kind="stable").index
        for group in sorted(ranked, key=lambda g: g == "(other modules)"):
            n = int(counts[group])
            kinds = (by_group[group] if by_group is not None and group in by_group.index
                     else pd.Series(dtype=int))
            summary = ", ".join(f"{v} ×{c}" for v, c in kinds.head(2).items()) or "ok"
            sev = max(worst[[group]], key=severity.rank)
            vals = means.loc[group].to_numpy(dtype=float)
            cells = np.array(["n/a" if np.isnan(v) else f"{100 * v:.0f}%" for v in vals])
            rows.append((f"{label(group, LABEL_WIDTH - 14)} ({n:,} tensors)", summary,
                         sev, vals, cells, True))
    return rows


def wiring_matrix_figure(params: pd.DataFrame, max_rows: int = 40) -> Figure:
    """requires_grad × in optimizer × used × changed, one row per tensor (flagged first).

    Past `max_rows` tensors, the flagged ones keep their own rows and the rest are gathered per
    top-level module subtree, each cell then the fraction of its tensors (or of their steps).
    """
    title = "wiring: requires_grad × optimizer × used × changed"
    if params.empty:
        fig, ax = axes(8, 2.6)
        no_data(ax, "no tensors", title, "tensor", xlabel="property")
        return fig
    rows = _matrix_rows(params, max(int(max_rows), 1))
    n = len(rows)
    fig, ax = axes(9.5, min(1.7 + 0.25 * n, 40))
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
            tick.set_color(severity.COLORS.get(row[2], severity.COLORS["ok"])[1])
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
