"""Every verdict rule of SPEC section 3 on small hand-built tables: a positive case and the nearest
negative case(s), exactly per the table's wording. No model, no torch: the rules are pure."""

from __future__ import annotations

import pandas as pd
import pytest

from tables import T, tables, verdict_sets
from diagkit.judge import verdicts as V
from diagkit.judge.verdict import Verdict
from diagkit.judge.verdicts import VERDICTS, judge

SPEC_TABLE = {
    "nothing_trains": "error",
    "orphan": "error",
    "unused": "warning",
    "intermittent": "info",
    "grad_not_cleared": "warning",
    "frozen_in_optimizer": "warning",
    "frozen_but_changing": "error",
    "stalled": "error",
    "zero_gradient": "warning",
    "nonfinite_grad": "error",
    "decay_on_norm_or_bias": "info",
    "in_multiple_optimizers": "error",
    "not_in_model": "warning",
    "unregistered": "error",
    "rank_divergent": "error",
    "rank_dependent_use": "warning",
}


def hits(verdict: str, *tensors: T) -> dict[str, bool]:
    """Apply one rule alone: {tensor name: flagged}."""
    params, steps = tables(*tensors)
    result = pd.Series(VERDICTS[verdict].rule(params, steps), index=params.index)
    return dict(zip(params["name"], result.fillna(False).astype(bool)))


# ------------------------------------------------------------------ vocabulary
def test_verdict_names_are_exactly_the_spec_table():
    assert set(VERDICTS) == set(SPEC_TABLE)


def test_verdict_severities_match_the_spec_table():
    assert {name: v.severity for name, v in VERDICTS.items()} == SPEC_TABLE
    assert all(v.name == name and v.meaning for name, v in VERDICTS.items())


def test_a_clean_tensor_is_exactly_ok():
    params, steps = tables(T("fc.weight"), T("fc.bias"))
    verdicts, errors = judge(params, steps)
    assert errors == []
    assert list(verdicts) == [("ok",), ("ok",)]


# ------------------------------------------------------------------ orphan
def test_orphan_requires_grad_receives_gradients_no_optimizer():
    assert hits("orphan", T("mem", held=False), T("w")) == {"mem": True, "w": False}


def test_orphan_not_for_a_frozen_tensor_outside_every_optimizer():
    params, steps = tables(T("backbone.w", held=False, requires_grad=False, used=False,
                             changed=False))
    assert verdict_sets(params, steps) == {"backbone.w": {"ok"}}


def test_orphan_not_when_it_never_receives_a_gradient():
    params, steps = tables(T("mem", held=False, used=False, changed=False))
    assert verdict_sets(params, steps)["mem"] == {"unused"}


def test_orphan_with_a_growing_grad_is_also_grad_not_cleared():
    params, steps = tables(T("mem", held=False, changed=False, carried_grad=[False, True, True],
                             grad_total_norm=[1.0, 2.0, 3.0]))
    assert verdict_sets(params, steps)["mem"] == {"orphan", "grad_not_cleared"}


# ------------------------------------------------------------------ unused / intermittent
def test_unused_requires_grad_and_never_used():
    params, steps = tables(T("dead", used=False, changed=False), T("live"))
    assert verdict_sets(params, steps) == {"dead": {"unused"}, "live": {"ok"}}


def test_unused_not_for_a_tensor_that_never_requires_grad():
    assert hits("unused", T("frozen", held=False, requires_grad=False, used=False,
                            changed=False)) == {"frozen": False}


def test_unused_counts_only_steps_on_which_it_requires_grad():
    # unfrozen at step 2 and used from then on: used on every step on which it required grad
    late = T("late", requires_grad=[False, False, True], used=[False, False, True],
             changed=[False, False, True])
    assert hits("unused", late) == {"late": False}
    assert hits("intermittent", late) == {"late": False}
    # a gradient on a step on which it did not require grad does not count as use
    odd = T("odd", requires_grad=[True, False], used=[False, True], changed=[False, False])
    assert hits("unused", odd) == {"odd": True}


def test_unused_when_frozen_later_and_never_used_while_trainable():
    t = T("w", requires_grad=[True, True, False], used=False, changed=False)
    assert hits("unused", t) == {"w": True}


def test_intermittent_some_but_not_all_steps():
    params, steps = tables(T("branch", used=[True, False, True]))
    assert verdict_sets(params, steps)["branch"] == {"intermittent"}


def test_intermittent_not_when_the_skipped_step_did_not_require_grad():
    t = T("w", requires_grad=[True, True, False], used=[True, True, False],
          changed=[True, True, False])
    assert hits("intermittent", t) == {"w": False}
    assert hits("unused", t) == {"w": False}


def test_intermittent_and_unused_are_exclusive():
    never = T("never", used=False, changed=False)
    always = T("always")
    assert hits("intermittent", never, always) == {"never": False, "always": False}
    assert hits("unused", never, always) == {"never": True, "always": False}


# ------------------------------------------------------------------ grad_not_cleared
def test_grad_not_cleared_on_any_carried_step():
    assert hits("grad_not_cleared", T("a", carried_grad=[False, False, True]),
                T("b", carried_grad=False)) == {"a": True, "b": False}


# ------------------------------------------------------------------ frozen_in_optimizer
def test_frozen_in_optimizer_uses_requires_grad_at_the_last_step():
    frozen_at_end = T("a", requires_grad=[True, True, False], changed=[True, True, False],
                      used=[True, True, False])
    unfrozen_at_end = T("b", requires_grad=[False, False, True], used=[False, False, True],
                        changed=[False, False, True])
    assert hits("frozen_in_optimizer", frozen_at_end, unfrozen_at_end) == {"a": True, "b": False}


def test_frozen_in_optimizer_needs_an_optimizer():
    params, steps = tables(
        T("held", requires_grad=False, used=False, changed=False),
        T("free", held=False, requires_grad=False, used=False, changed=False))
    assert verdict_sets(params, steps) == {"held": {"frozen_in_optimizer"}, "free": {"ok"}}


# ------------------------------------------------------------------ frozen_but_changing
def test_frozen_but_changing_changed_on_a_step_without_requires_grad():
    params, steps = tables(T("w", requires_grad=[True, False], used=[True, False],
                             changed=[True, True]))
    assert "frozen_but_changing" in verdict_sets(params, steps)["w"]


def test_frozen_but_changing_not_when_it_changed_only_while_trainable():
    assert hits("frozen_but_changing",
                T("a", requires_grad=[True, False], used=[True, False], changed=[True, False]),
                T("b")) == {"a": False, "b": False}


# ------------------------------------------------------------------ stalled
def test_stalled_held_used_requires_grad_never_changed():
    params, steps = tables(T("w", changed=False, lr=0.0, delta_norm=0.0))
    assert verdict_sets(params, steps)["w"] == {"stalled"}


def test_stalled_not_when_it_changed_once():
    assert hits("stalled", T("w", changed=[False, True, False])) == {"w": False}


def test_stalled_not_for_an_orphan_an_unused_or_a_frozen_tensor():
    assert hits("stalled",
                T("orphan", held=False, changed=False),
                T("unused", used=False, changed=False),
                T("frozen", requires_grad=False, used=False, changed=False),
                ) == {"orphan": False, "unused": False, "frozen": False}


# ------------------------------------------------------------------ zero_gradient
def test_zero_gradient_every_gradient_exactly_zero():
    params, steps = tables(T("w", grad_norm=0.0, changed=False))
    # held, used, never changes (adam with a zero gradient): zero_gradient, and stalled too
    assert verdict_sets(params, steps)["w"] == {"zero_gradient", "stalled"}


def test_empty_tensor_is_neither_stalled_nor_zero_gradient():
    """numel 0: never changes and its gradient is all (no) zeros, trivially; not a finding."""
    params, steps = tables(T("empty", numel=0, grad_norm=0.0, changed=False, delta_norm=0.0))
    assert verdict_sets(params, steps)["empty"] == {"ok"}


def test_zero_gradient_not_when_one_gradient_is_nonzero():
    assert hits("zero_gradient", T("w", grad_norm=[0.0, 0.0, 1e-30])) == {"w": False}


def test_zero_gradient_not_when_it_never_receives_a_gradient():
    assert hits("zero_gradient", T("w", used=False, changed=False)) == {"w": False}


def test_zero_gradient_counts_only_the_steps_it_was_used():
    t = T("w", used=[True, False, True], grad_norm=[0.0, float("nan"), 0.0])
    assert hits("zero_gradient", t) == {"w": True}


# ------------------------------------------------------------------ nonfinite_grad
def test_nonfinite_grad_on_any_step():
    assert hits("nonfinite_grad",
                T("bad", nonfinite=[False, True, False], grad_norm=[1.0, float("nan"), 1.0]),
                T("good")) == {"bad": True, "good": False}


# ------------------------------------------------------------------ decay_on_norm_or_bias
@pytest.mark.parametrize("name, module_type, wd, expected", [
    ("fc.bias", "Linear", 0.01, True),                      # a bias
    ("attn.in_proj_bias", "MultiheadAttention", 0.1, True),  # name ends in 'bias'
    ("ln.weight", "LayerNorm", 0.01, True),                 # weight of a normalization module
    ("bn.weight", "BatchNorm1d", 0.01, True),
    ("rms.weight", "RMSNorm", 0.01, True),
    ("fc.bias", "Linear", 0.0, False),                      # no decay in its group
    ("ln.weight", "LayerNorm", 0.0, False),
    ("fc.weight", "Linear", 0.01, False),                   # a decayed matrix: as intended
    ("bias_proj.weight", "Linear", 0.01, False),            # contains 'bias' but does not end in it
    ("normalizer.weight", "Linear", 0.01, False),           # 'norm' in the name, not in the class
])
def test_decay_on_norm_or_bias(name, module_type, wd, expected):
    assert hits("decay_on_norm_or_bias",
                T(name, module_type=module_type, weight_decay=wd)) == {name: expected}


def test_decay_on_norm_or_bias_not_for_a_tensor_in_no_group():
    assert hits("decay_on_norm_or_bias",
                T("fc.bias", held=False, requires_grad=False, used=False, changed=False)
                ) == {"fc.bias": False}


# ------------------------------------------------------------------ optimizers vs model
def test_in_multiple_optimizers():
    params, steps = tables(T("shared", n_optimizers=2, memberships=((0, 0), (1, 0))),
                           T("single"))
    assert verdict_sets(params, steps) == {"shared": {"in_multiple_optimizers"},
                                           "single": {"ok"}}


def test_not_in_model():
    stale = T("<optimizer 0 group 0 #3>", in_model=False, module="", module_type=None,
              used=False, changed=False, requires_grad=True)
    assert hits("not_in_model", stale, T("fc.weight")) == {"<optimizer 0 group 0 #3>": True,
                                                          "fc.weight": False}


def test_unregistered_is_outside_model_and_optimizers_and_got_gradients():
    """`unregistered`: requires grad, used, not in the model, in no optimizer. Not an orphan
    (that is a model parameter no optimizer holds), and never when it got no gradient."""
    loose = T("cells[0].weight", in_model=False, held=False, changed=False)
    idle = T("<unregistered #1 (3,) torch.float32>", in_model=False, held=False, used=False,
             changed=False)
    verdicts = verdict_sets(*tables(loose, idle, T("fc.weight"), T("orphan.w", held=False,
                                                                   changed=False)))
    assert "unregistered" in verdicts["cells[0].weight"]
    assert "orphan" not in verdicts["cells[0].weight"]
    assert "unregistered" not in verdicts["<unregistered #1 (3,) torch.float32>"]
    assert verdicts["fc.weight"] == {"ok"}
    assert "orphan" in verdicts["orphan.w"] and "unregistered" not in verdicts["orphan.w"]


# ------------------------------------------------------------------ distributed
def _per_rank(steps: pd.DataFrame, ranks: int = 2) -> pd.DataFrame:
    return pd.concat([steps.assign(rank=r) for r in range(ranks)], ignore_index=True)


def test_rank_divergent_when_a_checksum_differs_between_ranks():
    params, steps = tables(T("a"), T("b"))
    steps = _per_rank(steps).assign(checksum=1.0)
    drift = (steps["rank"] == 1) & (steps["name"] == "a") & (steps["step"] == 2)
    steps.loc[drift, "checksum"] = 2.0
    result = pd.Series(VERDICTS["rank_divergent"].rule(params, steps), index=params.index)
    assert list(result) == [True, False]


def test_rank_divergent_not_when_checksums_agree_across_ranks():
    params, steps = tables(T("a"), T("b"))
    steps = _per_rank(steps)
    steps["checksum"] = steps["step"] * 10.0 + (steps["name"] == "a")  # differ by step only
    result = pd.Series(VERDICTS["rank_divergent"].rule(params, steps), index=params.index)
    assert not result.any()


@pytest.mark.parametrize("columns", [(), ("rank",), ("checksum",)])
def test_rank_divergent_false_without_rank_and_checksum(columns):
    params, steps = tables(T("a"), T("b"))
    if "rank" in columns:
        steps = _per_rank(steps)
    if "checksum" in columns:
        steps = steps.assign(checksum=range(len(steps)))  # all different: would flag if used
    result = pd.Series(VERDICTS["rank_divergent"].rule(params, steps), index=params.index)
    assert not result.any()


def test_rank_dependent_use_when_used_on_some_ranks_only():
    params, steps = tables(T("a"), T("b"))
    steps = _per_rank(steps)
    steps.loc[(steps["rank"] == 0) & (steps["name"] == "a") & (steps["step"] == 1), "used"] = False
    result = pd.Series(VERDICTS["rank_dependent_use"].rule(params, steps), index=params.index)
    assert list(result) == [True, False]


def test_rank_dependent_use_not_when_ranks_agree_on_each_step():
    # used on step 0 and 2 only, but the same on both ranks: intermittent, not rank-dependent
    params, steps = tables(T("a", used=[True, False, True]), T("b"))
    steps = _per_rank(steps)
    result = pd.Series(VERDICTS["rank_dependent_use"].rule(params, steps), index=params.index)
    assert not result.any()


def test_rank_dependent_use_false_without_a_rank_column():
    params, steps = tables(T("a", used=[True, False, True]), T("b"))
    assert hits("rank_dependent_use", T("a", used=[True, False, True]), T("b")) == {
        "a": False, "b": False}
    assert "rank_dependent_use" not in verdict_sets(params, steps)["a"]


# ------------------------------------------------------------------ judge
def test_judge_gives_every_verdict_that_applies():
    params, steps = tables(
        T("w", held=False, used=[True, False, True], carried_grad=[False, False, True],
          nonfinite=[False, False, True], changed=False))
    assert verdict_sets(params, steps)["w"] == {"orphan", "intermittent", "grad_not_cleared",
                                                "nonfinite_grad"}


def test_judge_reports_a_crashing_rule_and_still_applies_the_others(monkeypatch):
    def broken(params, steps):
        raise RuntimeError("rule exploded")

    monkeypatch.setitem(VERDICTS, "broken_rule", Verdict("broken_rule", "error", "crashes",
                                                         broken))
    params, steps = tables(T("dead", used=False, changed=False), T("live"))
    verdicts, errors = judge(params, steps)
    assert len(errors) == 1
    code, message = errors[0]
    assert code == "broken_rule"
    assert "RuntimeError" in message and "rule exploded" in message
    assert list(verdicts) == [("unused",), ("ok",)]


def test_judge_survives_a_crash_in_a_real_rule(monkeypatch):
    def broken(params, steps):
        raise KeyError("no_such_column")

    monkeypatch.setitem(VERDICTS, "orphan", Verdict("orphan", "error", "x", broken))
    params, steps = tables(T("mem", held=False, carried_grad=[False, True, True], changed=False))
    verdicts, errors = judge(params, steps)
    assert [code for code, _ in errors] == ["orphan"]
    assert "KeyError" in errors[0][1]
    assert verdicts.iloc[0] == ("grad_not_cleared",)


def test_judge_returns_tuples_aligned_with_params():
    params, steps = tables(T("a"), T("b", used=False, changed=False), T("c"))
    params.index = [10, 20, 30]
    verdicts, errors = judge(params, steps)
    assert errors == []
    assert list(verdicts.index) == [10, 20, 30]
    assert all(isinstance(v, tuple) for v in verdicts)
    assert list(verdicts) == [("ok",), ("unused",), ("ok",)]


def test_judge_with_no_observed_step():
    params, steps = tables(T("a", n_steps=0), T("b", n_steps=0, requires_grad=False))
    verdicts, errors = judge(params, steps)
    assert errors == []
    assert list(verdicts) == [("ok",), ("frozen_in_optimizer",)]


def test_severity_map_covers_every_verdict():
    assert {name: v.severity for name, v in V.VERDICTS.items()} == SPEC_TABLE


def test_readme_verdict_table_is_the_registry():
    """The README's table is the vocabulary as the code declares it: names in order, each
    severity, and each meaning word for word."""
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Verdicts"):]
    section = section[:section.index("\n## ", 4)]
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \| (.*) \|$", section, re.M)
    assert [(v.name, v.severity, v.meaning) for v in VERDICTS.values()] == rows
