"""Ranks folded one way everywhere: where two ranks measured different values for the same
(step, tensor), the figures, the explorer, the params table and the judge all show what
`fold_ranks` gives (the lowest rank's measurement; "any rank" for use), never a value of their
own. A presenter that folded by itself (or not at all) would show another number than these."""

from __future__ import annotations

import pandas as pd
from tables import T, tables, verdict_sets

from diagkit.measure.tables.aggregate import build_params, fold_ranks
from diagkit.present import plots
from diagkit.present.explorer_state import ExplorerState

# The static facts an inventory row holds (what build_params joins with the steps).
INVENTORY = ["name", "aliases", "module", "module_type", "shape", "numel", "bytes", "dtype",
             "device", "placement", "stage", "in_model", "requires_grad", "memberships", "n_optimizers",
             "optimizer", "group", "lr", "weight_decay"]


def two_ranks():
    """(params, steps) of a 2-rank run: `enc.weight` measured 1.0 / 2.0 (fresh / .grad) on
    rank 0 and 4.0 / 8.0 on rank 1; `aux.weight` used on rank 1 only; `dead.weight` on none.
    Rank 1's rows come first, so that table order cannot pass for the lowest rank."""
    params0, rank0 = tables(T("enc.weight", grad_norm=1.0, grad_total_norm=2.0),
                            T("aux.weight", used=False), T("dead.weight", used=False))
    _, rank1 = tables(T("enc.weight", grad_norm=4.0, grad_total_norm=8.0),
                      T("aux.weight", grad_norm=3.0), T("dead.weight", used=False))
    steps = pd.concat([rank1.assign(rank=1), rank0.assign(rank=0)], ignore_index=True)
    steps = steps.sort_values("step", kind="stable").reset_index(drop=True)
    return build_params(params0[INVENTORY].to_dict("records"), steps), steps


def test_fold_takes_the_lowest_rank_and_any_rank_for_use():
    _, steps = two_ranks()
    folded = fold_ranks(steps).set_index(["name", "step"])
    assert folded.loc["enc.weight", "grad_norm"].tolist() == [1.0, 1.0, 1.0]
    assert folded.loc["enc.weight", "grad_total_norm"].tolist() == [2.0, 2.0, 2.0]
    assert folded.loc["aux.weight", "used"].tolist() == [True, True, True]
    assert folded.loc["dead.weight", "used"].tolist() == [False, False, False]


def test_every_presenter_shows_the_folded_value():
    params, steps = two_ranks()
    lines = {ln.get_label(): list(ln.get_ydata())
             for ln in plots.grad_norm_figure(steps, params).axes[0].get_lines()}
    assert lines["enc.weight"] == [2.0, 2.0, 2.0]            # .grad: solid
    assert lines["_fresh enc.weight"] == [1.0, 1.0, 1.0]     # the step's own gradient: dashed

    state = ExplorerState(params, steps)
    state.selected = ["enc.weight"]
    assert state.metric == "grad_norm"
    assert state.series()["enc.weight"].tolist() == [1.0, 1.0, 1.0]

    assert params.set_index("name").loc["enc.weight", "grad_norm"] == 1.0


def test_used_on_one_rank_is_not_unused():
    params, steps = two_ranks()
    verdicts = verdict_sets(params, steps)
    assert "unused" not in verdicts["aux.weight"]
    assert "unused" in verdicts["dead.weight"]               # the rule does fire on this table
