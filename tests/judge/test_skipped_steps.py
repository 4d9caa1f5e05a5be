"""Steps an optimizer skipped (a loss scaler's overflow) and tensors kept in 16-bit floats, on
hand-built tables: `nonfinite_grad` and `stalled` count only the steps that were taken, every
step skipped is still a finding, and a bf16 tensor whose updates round away is told why."""

from __future__ import annotations

import pandas as pd

from tables import T, tables, verdict_sets
from diagkit.judge.findings import build_findings
from diagkit.judge.verdicts import judge
from diagkit.measure.tables.aggregate import fold_ranks


def findings_of(params, steps):
    params["verdicts"], errors = judge(params, steps)
    assert errors == []
    return {f.code: f for f in build_findings(params, steps)}


# A scaler's skipped step: the scaled gradient overflowed, the optimizer never stepped, the
# value did not change. Then steps that were taken.
SKIP_THEN_TAKEN = dict(nonfinite=[True, True, False, False], skipped=[True, True, False, False],
                       changed=[False, False, True, True],
                       grad_norm=[float("inf"), float("inf"), 1.0, 1.0])


def test_a_nonfinite_gradient_on_a_skipped_step_is_the_scaler_doing_its_job():
    params, steps = tables(T("fc.weight", **SKIP_THEN_TAKEN))
    assert verdict_sets(params, steps) == {"fc.weight": {"ok"}}


def test_a_nonfinite_gradient_on_a_taken_step_is_still_nonfinite_grad():
    params, steps = tables(T("fc.weight", nonfinite=[True, False, True],
                             skipped=[True, False, False]))
    assert verdict_sets(params, steps) == {"fc.weight": {"nonfinite_grad"}}
    f = findings_of(params, steps)["nonfinite_grad"]
    assert "step(s) 2, which its optimizer took" in f.message
    assert "the 1 step(s) its optimizer skipped for one are not counted" in f.message


def test_every_step_skipped_for_overflow_is_nonfinite_grad_with_its_own_message():
    params, steps = tables(T("fc.weight", nonfinite=True, skipped=True, changed=False))
    assert verdict_sets(params, steps) == {"fc.weight": {"nonfinite_grad"}}  # not also stalled
    f = findings_of(params, steps)["nonfinite_grad"]
    assert "skipped every one of the 3 observed step(s)" in f.message
    assert "init_scale" in f.fix and "torch.isfinite(loss)" in f.fix


def test_skipped_steps_are_not_changes_that_failed_to_happen():
    # Unchanged on the skipped steps only: not stalled. Unchanged on a taken step too: stalled.
    params, steps = tables(T("a", **SKIP_THEN_TAKEN),
                           T("b", nonfinite=[True, False], skipped=[True, False], changed=False))
    assert verdict_sets(params, steps) == {"a": {"ok"}, "b": {"stalled"}}


def test_an_optimizer_that_skips_every_step_with_finite_gradients_is_stalled():
    # Its own gradients were finite: the loop never stepped it (or a scaler skipped for others).
    params, steps = tables(T("fc.weight", skipped=True, changed=False))
    assert verdict_sets(params, steps) == {"fc.weight": {"stalled"}}
    f = findings_of(params, steps)["stalled"]
    assert "skipped every step on which it got gradients" in f.message


def test_skipped_folds_across_ranks_only_when_every_rank_skipped():
    # A rank that took the step took it: its non-finite gradient is a taken step's.
    params, steps = tables(T("w", n_steps=2, nonfinite=[True, False], skipped=[True, False]))
    ranked = steps.assign(rank=0)
    other = ranked.assign(rank=1)
    other.loc[other["step"] == 0, "skipped"] = False
    both = fold_ranks(pd.concat([ranked, other], ignore_index=True))
    assert not both.loc[both["step"] == 0, "skipped"].iloc[0]
    assert verdict_sets(params, both) == {"w": {"nonfinite_grad"}}
    every = fold_ranks(pd.concat([ranked, ranked.assign(rank=1)], ignore_index=True))
    assert verdict_sets(params, every) == {"w": {"ok"}}


def test_a_table_without_the_skipped_column_is_judged_as_before():
    params, steps = tables(T("fc.weight", nonfinite=[True, False, False]))
    assert verdict_sets(params, steps.drop(columns="skipped")) == {"fc.weight": {"nonfinite_grad"}}


def test_a_bf16_tensor_whose_updates_round_away_is_stalled_and_told_why():
    stuck = dict(changed=False, delta_norm=0.0, update_ratio=0.0, lr=1e-6, grad_norm=0.5)
    params, steps = tables(T("head.weight", dtype="torch.bfloat16", numel=4, **stuck),
                           T("body.weight", **stuck))  # float32: stalled for another reason
    assert verdict_sets(params, steps) == {"head.weight": {"stalled"}, "body.weight": {"stalled"}}
    f = findings_of(params, steps)["stalled"]
    assert "`head.weight` is kept in bfloat16 with no float32 master copy" in f.message
    assert "half an ulp" in f.message and "lr = 1e-06" in f.message
    assert "float32" in f.fix and "autocast" in f.fix


def test_a_16_bit_tensor_with_lr_0_is_stalled_for_its_lr_not_its_dtype():
    params, steps = tables(T("w", dtype="torch.float16", lr=0.0, changed=False))
    f = findings_of(params, steps)["stalled"]
    assert "learning rate is 0" in f.message and "float16" not in f.message
