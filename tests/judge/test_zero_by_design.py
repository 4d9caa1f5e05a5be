"""Zero by design is not a finding (issue 35, item 5b), on hand-made tables: `zero_gradient`
counts only the steps that can tell (`rules_change.told`); a tensor none of whose steps could
tell keeps no verdict for it (the vocabulary is fixed) and is named by
`rules_change.zero_gradient_untold`, for the result's one line (`meta["not_judged"]`, worded
by `present.sections.not_measured_line`); findings of one verdict on sibling modules are one
finding (`findings.subtrees`)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from tables import T, tables, verdict_sets
from diagkit.judge.findings import build_findings, subtrees
from diagkit.judge.rules_change import told, untold_why, zero_gradient_untold
from diagkit.judge.verdicts import judge, not_judged_without_optimizer
from diagkit.present.sections import not_measured_line

NAN = math.nan


def zero(name: str, **kw) -> T:
    """Used on every step, every gradient exactly zero; adam leaves it where it is."""
    return T(name, **{"grad_norm": 0.0, "changed": False, **kw})


# ------------------------------------------------------------------ which steps tell
def test_one_step_never_tells_when_another_tensor_moves_on_it():
    params, steps = tables(zero("a", n_steps=1), T("b", n_steps=1))
    assert verdict_sets(params, steps)["a"] == {"stalled"}  # no zero_gradient: cannot tell
    assert zero_gradient_untold(params, steps) == ["a"]


def test_the_steps_after_the_partner_moved_tell():
    """A fresh LoRA's lora_A beside lora_B, which moves on step 0: if A's gradient stayed
    zero on steps 1 and 2, it is a real zero_gradient."""
    params, steps = tables(zero("lora_A"), T("lora_B"))
    assert verdict_sets(params, steps)["lora_A"] == {"zero_gradient", "stalled"}
    assert zero_gradient_untold(params, steps) == []  # judged: not named as untold
    # rows by step, lora_A then lora_B: step 0 cannot tell for A (B moves on it); it can for
    # B, whose only other tensor never moves
    assert list(told(steps)) == [False, True, True, True, True, True]


def test_a_gradient_that_turns_non_zero_once_its_partner_moved_is_nothing():
    params, steps = tables(T("lora_A", grad_norm=[0.0, 0.3, 0.2]), T("lora_B"))
    assert verdict_sets(params, steps)["lora_A"] == {"ok"}
    assert zero_gradient_untold(params, steps) == []


def test_a_chain_of_zeros_waits_for_the_last_partner_to_move():
    """x A B C with B and C at zero: C moves on step 0, B (zero gradient on step 0) on step 1,
    so only step 2 can tell anything about A."""
    chain = (zero("A", n_steps=2), T("B", grad_norm=[0.0, 1.0], changed=[False, True]),
             T("C", n_steps=2))
    assert verdict_sets(*tables(*chain))["A"] == {"stalled"}
    assert zero_gradient_untold(*tables(*chain)) == ["A"]
    chain = (zero("A"), T("B", grad_norm=[0.0, 1.0, 1.0], changed=[False, True, True]),
             T("C"))
    assert verdict_sets(*tables(*chain))["A"] == {"zero_gradient", "stalled"}


def test_a_partner_that_never_moves_blocks_nothing():
    """Two tensors multiplied by zero, plain SGD: neither ever changes, so neither can be the
    other's partner that has yet to move; both are zero_gradient."""
    params, steps = tables(zero("fc.weight"), zero("fc.bias"))
    sets = verdict_sets(params, steps)
    assert sets["fc.weight"] == sets["fc.bias"] == {"zero_gradient", "stalled"}


def test_weight_decay_moving_both_dead_tensors_still_tells_from_step_1():
    params, steps = tables(zero("w", changed=True), zero("b", changed=True))
    sets = verdict_sets(params, steps)
    assert sets["w"] == sets["b"] == {"zero_gradient"}


def test_a_tensor_the_step_did_not_use_does_not_block_it():
    """A branch first used on step 2 cannot be a partner on steps 0 and 1."""
    params, steps = tables(zero("gate"), T("fc"),
                           T("branch", used=[False, False, True], changed=[False, False, True]))
    assert verdict_sets(params, steps)["gate"] == {"zero_gradient", "stalled"}


def test_its_own_first_change_does_not_block_it():
    params, steps = tables(zero("w", changed=[False, True, True]))
    assert verdict_sets(params, steps)["w"] == {"zero_gradient"}


def test_a_tensor_alone_tells_on_its_first_step():
    assert verdict_sets(*tables(zero("w", n_steps=1)))["w"] == {"zero_gradient", "stalled"}


def test_only_the_steps_it_was_used_count():
    params, steps = tables(zero("w", used=[True, False, False], grad_norm=[0.0, NAN, NAN]),
                           T("b"))
    assert verdict_sets(params, steps)["w"] == {"intermittent", "stalled"}
    assert zero_gradient_untold(params, steps) == ["w"]


def test_a_step_that_cannot_tell_is_no_finding_and_one_line():
    """A fresh LoRA's first step: lora_A's zeros are no verdict, no finding; they are the
    result's one line."""
    params, steps = tables(zero("q.lora_A.weight", n_steps=1, changed=True),
                           T("q.lora_B.weight", n_steps=1))
    params["verdicts"], _ = judge(params, steps)
    assert list(params["verdicts"]) == [("ok",), ("ok",)]
    assert build_findings(params, steps) == []
    names = zero_gradient_untold(params, steps)
    assert names == ["q.lora_A.weight"]
    why = untold_why(len(names), "q.lora_A")
    line = not_measured_line(SimpleNamespace(meta={"not_judged": {"zero_gradient": why}}))
    assert line.startswith("zero_gradient not judged: 1 tensor (q.lora_A) got only "
                           "exactly-zero gradients, on steps that cannot tell")
    assert line.endswith("observe more steps.") and "No optimizer" not in line


def test_the_line_words_each_reason_apart():
    """No optimizer and an untold zero together: one line, each reason worded for itself."""
    unjudged = {**not_judged_without_optimizer(), "zero_gradient": untold_why(4, "x.*.lora_A")}
    line = not_measured_line(SimpleNamespace(meta={"not_judged": unjudged}))
    first, _, second = line.partition(". zero_gradient not judged: 4 tensors (x.*.lora_A)")
    assert first.startswith("No optimizer (hand-written updates): membership verdicts")
    assert "orphan" in first and "zero_gradient" not in first
    assert second.endswith("observe more steps.")
    # a saved diagnosis of a run without an optimizer reads as it did
    only = not_measured_line(SimpleNamespace(meta={"not_judged": not_judged_without_optimizer()}))
    assert only.startswith("No optimizer") and "not judged: orphan" in only


# ------------------------------------------------------------------ sibling modules
def lora_layers(flagged_verdict_args: dict, layers: int = 2):
    """layers.i.{q,v}.{lora_A,lora_B,base}.weight, the lora_A ones dead."""
    out = []
    for i in range(layers):
        for proj in ("q", "v"):
            out.append(T(f"layers.{i}.{proj}.lora_A.weight", **flagged_verdict_args))
            out.append(T(f"layers.{i}.{proj}.lora_B.weight"))
            out.append(T(f"layers.{i}.{proj}.base.weight", held=False, requires_grad=False,
                         used=False, changed=False))
    return out


def test_sibling_modules_with_one_verdict_are_one_finding():
    params, steps = tables(*lora_layers({"used": False, "changed": False}))
    params["verdicts"], _ = judge(params, steps)
    (f,) = build_findings(params, steps)
    assert (f.code, f.module, f.count) == ("unused", "layers.*.*.lora_A", 4)
    assert "a set of 4 tensors in `layers.*.*.lora_A`" in f.message
    # the fix is code to paste: the tensors themselves, never the pattern
    assert "*" not in f.fix and "model.layers[1].v.lora_A.weight" in f.fix


def test_siblings_differ_in_any_part_but_the_last():
    params, _ = tables(T("enc.layers.0.fc.w"), T("dec.layers.3.fc.w"), T("dec.layers.4.fc.w"),
                       T("enc.layers.0.keep.w"), T("dec.layers.3.keep.w"),
                       T("dec.layers.4.keep.w"))
    groups = subtrees(params, np.array([True] * 3 + [False] * 3))
    assert groups == [("*.layers.*.fc", [0, 1, 2], False)]


def test_groups_with_another_last_part_or_depth_stay_apart():
    params, _ = tables(T("a.x.w"), T("a.y.w"), T("b.x.w"), T("b.x.v"), T("c.q.x.w"),
                       T("a.z.w"), T("b.z.w"), T("c.q.z.w"))
    groups = subtrees(params, np.array([True] * 5 + [False] * 3))
    assert sorted((label, rows) for label, rows, _ in groups) == [
        ("*.x", [0, 2, 3]), ("a.y", [1]), ("c.q.x", [4])]  # c.q.x: a part more


def test_a_whole_subtree_is_still_labelled_by_itself():
    params, _ = tables(T("layers.0.q.lora_A.w"), T("layers.0.q.lora_B.w"))
    assert subtrees(params, np.array([True, False])) == [("layers.0.q.lora_A", [0], True)]
