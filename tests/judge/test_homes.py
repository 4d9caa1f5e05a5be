"""The group an orphan should join (`diagkit.judge.homes`), on real runs: a bias goes where
the user keeps biases (a no-decay group, not its sibling weight's decay group), a tensor of a
part with its own lr goes to that part's group; `--try-fix` puts each tensor in that group
and the fixed run is clean, with the user's weight decay kept."""

from __future__ import annotations

import pytest

import home_targets
from diagkit import diagnose
from diagkit.judge.homes import home_groups
from diagkit.run.diagnose.try_fix import try_fixes


def homes_of(target: str) -> dict:
    diag = diagnose(**getattr(home_targets, target)())
    orphans = [n for f in diag.findings if f.code == "orphan" for n in f.params]
    return home_groups(diag.params, orphans)


@pytest.mark.parametrize("target, expected", [
    # decay group 0 (weights), no-decay group 1 (biases): each joins its kind's group
    ("by_decay", {"head2.weight": (0, 0), "head2.bias": (0, 1)}),
    # the sibling weight is in the decay group; the bias still goes to the no-decay one
    ("bias_left_out", {"head2.bias": (0, 1)}),
    # groups by part, all decaying: the bias joins its own module's group (lr 0.05)
    ("by_module", {"head2.bias": (0, 1)}),
])
def test_each_tensor_joins_the_group_that_fits_it(target, expected):
    assert homes_of(target) == expected


def test_try_fix_puts_them_there_and_keeps_weight_decay_off_the_bias():
    p = try_fixes("home_targets:by_decay")
    row = next(r for r in p.rows if r["code"] == "orphan")
    assert row["homes"] == {"head2.weight": [0, 0], "head2.bias": [0, 1]}
    after = p.after.params.set_index("name")
    assert after.loc["head2.bias", "weight_decay"] == 0.0  # not AdamW's default 0.01
    assert after.loc["head2.weight", "weight_decay"] == 0.01
    assert after.loc[["head2.weight", "head2.bias"], "changed_steps"].min() > 0
    assert p.all_ok and not p.after.findings
