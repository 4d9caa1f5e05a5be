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
    flagged = set(params.loc[params["verdicts"].map(lambda v: v != ("ok",)), "name"])
    by_norm = params.sort_values("grad_total_norm", ascending=False, na_position="last")["name"]
    ranked = [n for n in params["name"] if n in flagged] + [n for n in by_norm if n not in flagged]
    has_grad = steps.groupby("name")["grad_total_norm"].count()
    shown = [n for n in ranked if has_grad.get(n, 0) > 0][:top]
    per_name = {name: s.sort_values("step") for name, s in steps[steps["name"].isin(shown)]
                .groupby("name")}
    for name in shown:
        s = per_name[name]
        problem = name in flagged
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
