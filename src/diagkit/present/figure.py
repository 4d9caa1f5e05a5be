"""Pieces every figure shares: an axes without pyplot, the "no data" panel, tensor labels
that are never mathtext, and the legend."""

from __future__ import annotations

from ..core import extras

try:  # the figures are the workbook extra's (README, "Install"): one line without it
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator
except ImportError as exc:
    raise extras.missing_error(exc, "diagkit's plotting") from None

from ..core.format import truncate_left

LABEL_WIDTH = 42  # characters of a tensor name in a legend or row label (cut from the left)


def axes(width: float = 9.5, height: float = 4.4):
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def no_data(ax, why: str, title: str, ylabel: str, xlabel: str = "step") -> None:
    ax.text(0.5, 0.5, f"no data: {why}", ha="center", va="center", transform=ax.transAxes,
            fontsize=11, color="0.35")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def label(name: str, width: int = LABEL_WIDTH) -> str:
    """A tensor name for a plot: cut from the left, `$` escaped so it is never mathtext, and
    never starting with `_` (which would hide it from the legend)."""
    label = truncate_left(name, width).replace("$", r"\$")
    return " " + label if label.startswith("_") else label


def verdict_text(verdicts) -> str:
    return ", ".join(v for v in verdicts if v != "ok") or "ok"


def finish(ax, title: str, ylabel: str, notes: list[str], handles: list) -> None:
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="major", alpha=0.3)
    extra = handles + [Line2D([], [], ls="none", label=n) for n in notes]
    lines, labels = ax.get_legend_handles_labels()
    ax.legend(lines + extra, labels + [h.get_label() for h in extra], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
