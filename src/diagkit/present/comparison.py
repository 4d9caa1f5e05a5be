"""A comparison of two checkpoints shown: the banner, the findings, the table of every tensor
and the figure of relative changes. Names are escaped; nothing here reads a file."""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

from ..core import extras, severity
from ..core.format import fmt_number, fmt_shape, human_bytes, truncate_left
from ..measure.checkpoints.diff import STATUSES
from .sections import findings_table, severity_chip
from .tables import style_rows
from .text import comparison_totals


def comparison_html(cmp) -> str:
    """The notebook summary of a `Comparison`: its banner and findings."""
    return f"<div class='diagkit'>{banner_html(cmp)}{findings_html(cmp)}</div>"


def _ordered(table: pd.DataFrame) -> np.ndarray:
    """Row positions: problems first (shape mismatch, unchanged, only in one file), then the
    changed tensors, the largest relative change first."""
    rank = table["status"].map({s: i for i, s in enumerate(STATUSES)}).to_numpy()
    change = pd.to_numeric(table["relative_change"], errors="coerce").fillna(-1).to_numpy()
    key = np.where(table["status"].to_numpy() == "changed", -change, 0)
    return np.lexsort((np.arange(len(table)), key, rank))


def _status_severity(cmp) -> dict[str, str]:
    codes = {f.code: f.severity for f in cmp.findings}
    return {status: codes.get(status, "ok") for status in STATUSES}


def banner_html(cmp) -> str:
    """Tensors and bytes per status, problems first and coloured by the severity of their
    finding; the two files and the totals. Every name is escaped."""
    s, level = cmp.summary, _status_severity(cmp)
    chips = "".join(
        severity_chip(level[status], f"<b>{status}</b> {s[status]} tensor"
                                        f"{'s' if s[status] != 1 else ''}, "
                                        f"{human_bytes(s[f'{status}_bytes'])}")
        for status in STATUSES if s[status])
    esc = html.escape
    return (f'<div class="diagkit-banner banner"><div>{chips}</div>'
            f'<p style="margin:4px 0">A: <code>{esc(s["path_a"])}</code> → B: '
            f'<code>{esc(s["path_b"])}</code></p>'
            f'<p style="margin:4px 0">{esc(comparison_totals(s))}</p></div>')


def findings_html(cmp) -> str:
    """The findings with their fixes (the diagnosis's findings table)."""
    if not cmp.findings:
        return ('<p class="diagkit-findings">No findings: every tensor present in both '
                'checkpoints changed, and both hold the same names and shapes.</p>')
    return findings_table(cmp.findings)


_TABLE_COLUMNS = ("name", "status", "shape", "dtype", "bytes", "relative_change", "delta_norm",
                 "norm_a", "max_abs_diff")


def table_styler(cmp, limit: int = 200):
    """One row per tensor, problems first, as a pandas Styler: names escaped, numbers with 3
    significant digits, at most `limit` rows (the caption says how many were left out)."""
    t = cmp.table
    order = _ordered(t)
    shown = t.iloc[order[:max(int(limit), 0)]]
    shape = [(fmt_shape(a) if a == b or b is None else
              fmt_shape(b) if a is None else f"{fmt_shape(a)} → {fmt_shape(b)}")
             for a, b in zip(shown["shape_a"], shown["shape_b"])]
    dtype = [(a if a == b or b is None else b if a is None else f"{a} → {b}")
             for a, b in zip(shown["dtype_a"], shown["dtype_b"])]
    view = pd.DataFrame({
        "name": shown["name"].astype(str), "status": shown["status"], "shape": shape,
        "dtype": [str(d).removeprefix("torch.") for d in dtype],
        "bytes": shown["bytes"].map(human_bytes),
        **{c: shown[c].map(fmt_number) for c in ("relative_change", "delta_norm", "norm_a",
                                                  "max_abs_diff")},
    }, columns=list(_TABLE_COLUMNS)).reset_index(drop=True).astype(object)
    view.loc[shown["relative_change"].to_numpy() == math.inf, "relative_change"] = "from 0"
    level = _status_severity(cmp)
    colours = [severity.COLORS[level[s]] for s in view["status"]]
    caption = f"{len(t)} tensors"
    if len(shown) < len(t):
        caption = (f"{len(shown)} of {len(t)} tensors shown, problems first, then the largest "
                   f"relative changes; comparison.csv has them all.")
    return style_rows(view, colours, "status", caption)


def change_figure(cmp, max_labels: int = 40):
    """Relative change ‖B − A‖ / ‖A‖ per tensor present in both with the same shape, in file
    order, on a log axis. Unchanged tensors are red crosses on the left edge, tensors that
    start from all zeros triangles on the right edge; names label the rows up to
    `max_labels` tensors. matplotlib is imported here: a comparison shows (its banner and
    findings, `comparison_html`) without the workbook extra (README, "Install")."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise extras.missing_error(exc, "diagkit's plotting") from None
    t = cmp.table[cmp.table["status"].isin(["changed", "unchanged"])]
    n = len(t)
    labelled = 0 < n <= max_labels
    fig = Figure(figsize=(9.5, min(1.8 + (0.22 * n if labelled else 3.0), 24)),
                 layout="constrained")
    ax = fig.add_subplot()
    title = "relative change ‖B − A‖ / ‖A‖ per tensor"
    ax.set_title(title)
    if not n:
        ax.text(0.5, 0.5, "no data: no tensor is in both checkpoints with the same shape",
                ha="center", va="center", transform=ax.transAxes, color="0.35")
        ax.set_xticks([])
        ax.set_yticks([])
        return fig
    rel = t["relative_change"].to_numpy(dtype=float)
    y = np.arange(n)
    moved = (t["status"] == "changed").to_numpy() & np.isfinite(rel) & (rel > 0)
    lo = rel[moved].min() if moved.any() else 1e-6
    hi = rel[moved].max() if moved.any() else 1e-6
    floor, ceiling = lo / 10, hi * 10
    ax.set_xscale("log")
    ax.set_xlim(floor / 2, ceiling * 2)
    ax.scatter(rel[moved], y[moved], s=18, color="tab:blue", label="changed", zorder=3)
    if labelled:
        ax.hlines(y[moved], floor / 2, rel[moved], color="tab:blue", lw=0.8, alpha=0.4)
    same = (t["status"] == "unchanged").to_numpy()
    warn = severity.COLORS["warning" if _status_severity(cmp)["unchanged"] != "ok" else "ok"][1]
    if same.any():
        ax.scatter(np.full(same.sum(), floor), y[same], marker="x", s=40, color=warn, zorder=4,
                   label="unchanged (bitwise identical)")
    fresh = (t["status"] == "changed").to_numpy() & ~moved
    if fresh.any():
        ax.scatter(np.full(fresh.sum(), ceiling), y[fresh], marker=">", s=36, color="tab:purple",
                   zorder=4, label="changed from all zeros")
    ax.set_ylim(n - 0.5, -0.5)  # file order, top down
    ax.set_xlabel("relative change (log)")
    _label_rows(ax, t["name"] if labelled else None, y, same, warn)
    ax.grid(axis="x", which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    return fig


def _label_rows(ax, names, y: np.ndarray, same: np.ndarray, warn: str) -> None:
    """Name every row (unchanged ones in the warning colour, so they stand out without the
    legend), or, when `names` is None because there are too many to read, only count them."""
    if names is None:
        ax.set_ylabel(f"{len(y)} tensors, in file order")
        return
    ax.set_yticks(y, [truncate_left(name, 48) for name in names], fontsize=7.5,
                  family="monospace", parse_math=False)
    for tick, is_same in zip(ax.get_yticklabels(), same):
        tick.set_color(warn if is_same else "0.15")
