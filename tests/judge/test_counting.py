"""The judging layer's counting helpers against brute force: `per_tensor` (shared row lookup
inside `judge`) and the static-graph test of the advice (a step x tensor matrix), on random
tables, including names the other table lacks, steps with nothing marked and rank-step keys."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from diagkit.judge.advice import _static_graph
from diagkit.judge.verdict import per_tensor, shared_rows

NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def tables(draw):
    """A params table of some names and a steps table of (step, name) rows with two flags."""
    params_names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=5))
    rows = draw(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(NAMES), st.booleans(),
                                   st.booleans()), max_size=20, unique_by=lambda r: r[:2]))
    params = pd.DataFrame({"name": params_names})
    steps = pd.DataFrame(rows, columns=["step", "name", "requires_grad", "used"])
    steps.index = steps.index * 3 + 7  # a table's index need not be 0..n-1
    return params, steps


def _brute_counts(params, steps, mask):
    return [int(sum(bool(m) for n, m in zip(steps["name"], mask) if n == name))
            for name in params["name"]]


@settings(max_examples=200, deadline=None)
@given(tables())
def test_per_tensor_counts_as_brute_force(t):
    params, steps = t
    mask = steps["requires_grad"] & steps["used"]
    expected = _brute_counts(params, steps, mask)
    assert per_tensor(params, steps, mask).tolist() == expected
    with shared_rows():  # the shared lookup gives the same counts, asked twice
        assert per_tensor(params, steps, mask).tolist() == expected
        assert per_tensor(params, steps, steps["used"]).tolist() == _brute_counts(
            params, steps, steps["used"])


def _brute_static(s):
    """Whether the sets requiring grad (over steps with any) and receiving gradients (over
    every step, an empty set where none) stay the same: the advice's definition."""
    steps = list(dict.fromkeys(s["step"]))
    rg = {k: frozenset(s.loc[(s["step"] == k) & s["requires_grad"], "name"]) for k in steps}
    rg = {k: v for k, v in rg.items() if v}
    used = {k: frozenset(s.loc[(s["step"] == k) & s["requires_grad"] & s["used"], "name"])
            for k in steps}
    if len(set(rg.values())) > 1:
        return False
    return len(set(used.values())) <= 1


@settings(max_examples=300, deadline=None)
@given(tables(), st.booleans())
def test_static_graph_as_brute_force(t, rank_keys):
    _, s = t
    if rank_keys:  # the advice's rank-steps: "rank:step" strings
        s = s.assign(step=(s["step"] % 2).astype(str) + ":" + s["step"].astype(str))
    n_steps = int(s["step"].nunique())
    if n_steps == 0:
        return
    static, _ = _static_graph(s, n_steps)
    assert static == _brute_static(s)


def test_a_step_without_gradients_breaks_the_static_graph():
    s = pd.DataFrame({"step": [0, 0, 1, 1], "name": ["a", "b", "a", "b"],
                      "requires_grad": [True] * 4, "used": [True, True, False, False]})
    static, why = _static_graph(s, 2)
    assert not static and "receiving gradients" in why
    assert np.array_equal(per_tensor(pd.DataFrame({"name": ["b", "a"]}), s, s["used"]), [1, 1])
