"""Folding the tables: ranks into one row per (step, tensor), steps into one row per tensor."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tables import T, tables
from diagkit.measure.tables.aggregate import aggregate_steps, fold_ranks


def two_ranks(steps: pd.DataFrame, edit) -> pd.DataFrame:
    """The steps table as seen by ranks 0 and 1; `edit(rank_1_rows)` makes rank 1 differ."""
    r0, r1 = steps.assign(rank=0), steps.assign(rank=1)
    edit(r1)
    return pd.concat([r1, r0], ignore_index=True)  # rank order in the table must not matter


def test_measurements_come_from_the_lowest_rank_facts_from_any():
    _, steps = tables(T("a", used=[False, False], grad_norm=[1.0, 2.0]))

    def edit(r1):
        r1["grad_norm"] = [10.0, 20.0]
        r1["used"] = [True, False]
        r1["changed"] = False
    folded = fold_ranks(two_ranks(steps, edit))
    assert "rank" not in folded
    assert folded["grad_norm"].tolist() == [1.0, 2.0]
    assert folded["used"].tolist() == [True, False]
    assert folded["changed"].tolist() == [True, True]
    assert len(folded) == len(steps)


def test_a_single_process_table_is_left_alone():
    _, steps = tables(T("a"), T("b"))
    assert fold_ranks(steps) is steps


def test_columns_a_table_lacks_are_not_invented():
    _, steps = tables(T("a"))
    partial = steps[["step", "name", "used", "grad_norm"]].assign(rank=0)
    assert list(fold_ranks(partial).columns) == ["step", "name", "used", "grad_norm"]


def test_aggregates_count_steps_and_keep_the_last_values():
    _, steps = tables(T("w", used=[True, False, True], grad_norm=[1.0, 9.0, 3.0],
                        requires_grad=[True, True, False], delta_norm=[0.1, 0.2, 0.3]))
    agg = aggregate_steps(steps).loc["w"]
    assert (agg["steps"], agg["rg_steps"], agg["used_steps"]) == (3, 2, 2)
    assert agg["grad_norm"] == 3.0  # the last step it was used
    assert not agg["requires_grad"]  # as on the last step
    assert np.isclose(agg["delta_norm"], 0.2)


def test_aggregates_of_no_step_at_all():
    _, steps = tables(T("w", n_steps=0))
    agg = aggregate_steps(steps)
    assert agg.empty and agg.index.name == "name"


# ------------------------------------------------------------------ ranks' inventories
def _row(name, in_model=True, memberships=((0, 0),), lr=0.1):
    return {"name": name, "in_model": in_model, "memberships": memberships, "lr": lr,
            "stage": ""}


def test_ranks_that_hold_the_same_tensors_are_rank_0s_rows():
    from diagkit.measure.tables.aggregate import join_rank_rows
    rank0 = [_row("a"), _row("b")]
    rank1 = [_row("b", lr=9.0), _row("a", lr=9.0), _row("<unregistered #0>", in_model=False,
                                                         memberships=())]
    assert join_rank_rows({1: rank1, 0: rank0}) is rank0  # an unregistered find is no stage


def test_pipeline_stages_are_joined_by_name_with_the_ranks_that_hold_them():
    """Each tensor takes the row of the lowest rank holding it (its own optimizer's facts)."""
    from diagkit.measure.tables.aggregate import join_rank_rows
    joined = join_rank_rows({
        0: [_row("first.weight"), _row("shared.weight", lr=0.1)],
        1: [_row("shared.weight", lr=9.0), _row("head.weight", memberships=(), lr=float("nan"))],
        2: [_row("head.weight", memberships=(), lr=float("nan"))]})
    by = {r["name"]: r for r in joined}
    assert list(by) == ["first.weight", "shared.weight", "head.weight"]
    assert {n: r["stage"] for n, r in by.items()} == {
        "first.weight": "0", "shared.weight": "0,1", "head.weight": "1,2"}
    assert by["shared.weight"]["lr"] == 0.1 and by["head.weight"]["memberships"] == ()
