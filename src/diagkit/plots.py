"""Figures from the result tables. Each takes a table and returns a matplotlib Figure; none
measures anything. Uses `matplotlib.figure.Figure` directly, so no GUI backend is touched."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure


def grad_norm_figure(steps: pd.DataFrame, params: pd.DataFrame, top: int = 8) -> Figure:
    """Fresh gradient vs the .grad the optimizer sees, per step, problem tensors first.

    An orphan's .grad grows step after step while its fresh gradient stays flat: plotting
    both on a log scale makes that unmistakable.
    """
    fig = Figure(figsize=(7.5, 3.6), layout="constrained")
    ax = fig.add_subplot()
    flagged = params[params["verdicts"].map(lambda v: v != ("ok",))]
    ranked = list(flagged["name"]) + [n for n in params.sort_values(
        "grad_total_norm", ascending=False, na_position="last")["name"] if n not in set(flagged["name"])]
    shown = [n for n in ranked if steps.loc[steps["name"] == n, "grad_total_norm"].notna().any()][:top]
    for name in shown:
        s = steps[steps["name"] == name].sort_values("step")
        problem = name in set(flagged["name"])
        line, = ax.plot(s["step"], s["grad_total_norm"], marker="o", lw=2.2 if problem else 1,
                        alpha=1 if problem else 0.55, label=f"{name} (.grad)")
        if problem:
            ax.plot(s["step"], s["grad_norm"], ls="--", color=line.get_color(),
                    label=f"{name} (this step's gradient)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("L2 norm")
    ax.set_title("gradient norms: fresh vs accumulated .grad")
    if shown:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(True, alpha=0.3)
    return fig
