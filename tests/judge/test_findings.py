"""Findings (one per verdict per module subtree, with count, bytes and a concrete fix) and the
run-level DDP advice, built from hand-made tables."""

from __future__ import annotations

import pytest

from tables import T, tables
from diagkit.core.result import Finding, StepFailure, worst_severity
from diagkit.judge.advice import build_advice
from diagkit.judge.findings import build_findings
from diagkit.judge.verdicts import judge
from diagkit.judge.wording import accessor


def judged(*tensors: T):
    params, steps = tables(*tensors)
    params["verdicts"], errors = judge(params, steps)
    assert errors == []
    return params, steps


def findings_of(*tensors: T, **kwargs) -> list[Finding]:
    params, steps = judged(*tensors)
    return build_findings(params, steps, **kwargs)


def dead(name: str, nbytes: int = 16, **kw) -> T:
    return T(name, used=False, changed=False, bytes=nbytes, **kw)


# ------------------------------------------------------------------ grouping
def test_a_whole_flagged_subtree_is_one_finding_with_count_and_bytes():
    found = findings_of(
        dead("decoder.0.weight", 4096), dead("decoder.0.bias", 64),
        dead("decoder.2.weight", 4096), dead("decoder.2.bias", 64),
        T("encoder.weight", bytes=1000), T("encoder.bias", bytes=10))
    assert len(found) == 1
    f = found[0]
    assert (f.code, f.severity, f.module, f.count, f.bytes) == (
        "unused", "warning", "decoder", 4, 4096 * 2 + 128)
    assert f.params == ("decoder.0.weight", "decoder.0.bias", "decoder.2.weight",
                        "decoder.2.bias")
    assert "`decoder`" in f.message and "4 tensors" in f.message
    assert "model.decoder" in f.fix  # code the user can paste


def test_a_partially_flagged_module_is_reported_per_tensor():
    found = findings_of(dead("block.w1"), dead("block.w2"), T("block.b"), T("other.w"))
    assert sorted((f.module, f.count, f.params) for f in found) == [
        ("block.w1", 1, ("block.w1",)), ("block.w2", 1, ("block.w2",))]
    for f in found:
        assert f.code == "unused"
        assert f"`{f.module}`" in f.message


def test_a_whole_child_of_a_partial_parent_is_labelled_by_the_child():
    found = findings_of(dead("enc.atom.weight", 100), dead("enc.atom.bias", 10),
                        T("enc.mol.weight"), T("enc.mol.bias"))
    assert [(f.module, f.count, f.bytes) for f in found] == [("enc.atom", 2, 110)]


def test_each_subtree_gets_its_own_finding():
    found = findings_of(dead("vocab_head.weight", 300), dead("vocab_head.bias", 30),
                        dead("cmim.0.weight", 200), dead("cmim.0.bias", 20),
                        T("encoder.weight"))
    assert sorted((f.module, f.count, f.bytes) for f in found) == [
        ("cmim", 2, 220), ("vocab_head", 2, 330)]


def test_the_whole_model_flagged_is_one_finding_labelled_as_such():
    found = [f for f in findings_of(dead("a.weight"), dead("a.bias"), dead("b.weight"))
             if f.code != "nothing_trains"]  # nothing trains, either: a finding of its own
    assert len(found) == 1
    assert found[0].module == "" and found[0].count == 3
    assert "whole model" in found[0].message


def test_each_verdict_gets_its_own_findings():
    found = findings_of(T("mem", held=False, changed=False, carried_grad=[False, True, True],
                          grad_total_norm=[1.0, 2.0, 3.0]), T("live"))
    assert sorted(f.code for f in found) == ["grad_not_cleared", "orphan"]
    assert all(f.params == ("mem",) and f.count == 1 for f in found)


def test_tensors_outside_the_model_are_reported_by_their_optimizer_group():
    """All the tensors an optimizer group holds outside the model are one finding (an
    optimizer built before fully_shard holds every replaced tensor), named in its params."""
    found = findings_of(
        T("<optimizer 0 group 0 #2>", in_model=False, module="", module_type=None),
        T("<optimizer 0 group 0 #3>", in_model=False, module="", module_type=None),
        T("<optimizer 0 group 1 #0>", in_model=False, module="", module_type=None,
          memberships=((0, 1),), group=1),
        T("fc.weight"))
    outside = sorted((f.module, f.params) for f in found if f.code == "not_in_model")
    assert outside == [("<optimizer 0 group 0>", ("<optimizer 0 group 0 #2>",
                                                  "<optimizer 0 group 0 #3>")),
                       ("<optimizer 0 group 1>", ("<optimizer 0 group 1 #0>",))]


def test_no_findings_when_everything_is_ok():
    assert findings_of(T("a.weight"), T("a.bias")) == []
    assert worst_severity([]) is None


# ------------------------------------------------------------------ order
def test_findings_are_ordered_by_severity():
    found = findings_of(
        T("norm.bias", module_type="LayerNorm", weight_decay=0.1, bytes=10_000),   # info
        dead("head.weight", 5_000),                                               # warning
        T("mem", held=False, bytes=8),                                            # error
        T("body.weight", bytes=100))
    assert [f.severity for f in found] == ["error", "warning", "info"]
    assert [f.code for f in found] == ["orphan", "unused", "decay_on_norm_or_bias"]
    assert worst_severity(found) == "error"


def test_larger_findings_first_within_a_severity():
    found = findings_of(dead("small.weight", 10), T("x.w"), dead("big.weight", 10_000))
    assert [f.module for f in found] == ["big", "small"]


# ------------------------------------------------------------------ wording
@pytest.mark.parametrize("name, expected", [
    ("layers.0.weight", "model.layers[0].weight"),
    ("weight", "model.weight"),
    ("", "model"),
    ("module.metamodel.model.mem_tokens", "model.module.metamodel.model.mem_tokens"),
    ("encoder.layers.1.0.bias", "model.encoder.layers[1][0].bias"),
])
def test_accessor(name, expected):
    assert accessor(name) == expected


def test_accessor_root_name():
    assert accessor("layers.0.weight", root="net") == "net.layers[0].weight"


def test_orphan_fix_names_the_ddp_prefix_when_the_name_has_it():
    (orphan,) = [f for f in findings_of(T("module.metamodel.model.mem_tokens", held=False))
                 if f.code == "orphan"]
    text = orphan.message + " " + orphan.fix
    assert "`module.`" in text
    assert 'startswith("module.metamodel")' in text
    assert "add_param_group" in orphan.fix
    assert "model.module.metamodel.model.mem_tokens" in orphan.fix
    assert "requires_grad_(False)" in orphan.fix


def test_orphan_fix_without_the_prefix_does_not_mention_it():
    (orphan,) = [f for f in findings_of(T("model.mem_tokens", held=False)) if f.code == "orphan"]
    assert "module." not in orphan.message + orphan.fix
    assert "add_param_group" in orphan.fix
    assert "model.model.mem_tokens" in orphan.fix


def test_orphan_message_shows_the_growing_grad_norm():
    (orphan,) = [f for f in findings_of(
        T("mem", held=False, carried_grad=[False, True, True], grad_total_norm=[1.0, 2.0, 3.0]))
        if f.code == "orphan"]
    assert "1 → 3" in orphan.message and "3 steps" in orphan.message


def test_unused_fix_freezes_the_subtree():
    (f,) = findings_of(dead("decoder.0.weight"), dead("decoder.0.bias"), T("enc.w"))
    assert "model.decoder.parameters()" in f.fix
    assert "requires_grad_(False)" in f.fix
    assert "find_unused_parameters=False" in f.fix


def test_every_finding_has_a_message_and_a_fix():
    found = findings_of(
        T("a", held=False), dead("b"), T("c", used=[True, False, True]),
        T("d", carried_grad=[False, True, False]),
        T("e", requires_grad=False, used=False, changed=False),
        T("f", requires_grad=[True, False], used=[True, False], changed=[True, True]),
        T("g", changed=False), T("h", grad_norm=0.0),
        T("i", nonfinite=[False, True, False]),
        T("j.bias", weight_decay=0.1), T("k", n_optimizers=2, memberships=((0, 0), (1, 0))),
        T("<optimizer 1 group 0 #0>", in_model=False, module=""))
    codes = {f.code for f in found}
    assert codes == {"orphan", "unused", "intermittent", "grad_not_cleared",
                     "frozen_in_optimizer", "frozen_but_changing", "stalled", "zero_gradient",
                     "nonfinite_grad", "decay_on_norm_or_bias", "in_multiple_optimizers",
                     "not_in_model"}
    for f in found:
        assert f.message and f.fix and f.severity in ("error", "warning", "info")


# ------------------------------------------------------------------ failures
def test_a_step_failure_is_an_error_finding():
    params, steps = judged(T("w", n_steps=2))
    failure = StepFailure(step=2, error="ValueError: bad batch", traceback="Traceback ...")
    found = build_findings(params, steps, failure=failure)
    assert found[0].code == "step_failed"
    assert found[0].severity == "error"
    assert "step 2" in found[0].message and "ValueError: bad batch" in found[0].message
    assert worst_severity(found) == "error"


def test_a_crashed_check_is_an_error_finding():
    params, steps = judged(T("w"))
    found = build_findings(params, steps, check_errors=[("stalled", "KeyError: 'x'")])
    assert [(f.code, f.severity) for f in found] == [("check_failed", "error")]
    assert "stalled" in found[0].message and "KeyError" in found[0].message


def test_finding_dict_round_trip():
    (f,) = findings_of(dead("decoder.0.weight"), dead("decoder.0.bias"), T("enc.w"))
    d = f.to_dict()
    assert d["params"] == ["decoder.0.weight", "decoder.0.bias"]
    assert Finding.from_dict(d) == f


# ------------------------------------------------------------------ advice
def test_advice_unused_tensors_need_find_unused_parameters():
    params, steps = judged(dead("vocab_head.weight", 6144), dead("vocab_head.bias", 192),
                           T("encoder.weight", bytes=4096))
    advice = build_advice(params, steps)
    fup = advice["find_unused_parameters"]
    assert fup["value"] is True
    assert fup["unused"] == ["vocab_head.weight", "vocab_head.bias"]
    assert fup["intermittent"] == []
    assert fup["unused_bytes"] == 6144 + 192
    assert "2 tensor(s)" in fup["evidence"] and "never" in fup["evidence"]
    assert advice["steps"] == 3


def test_advice_intermittent_tensors_need_find_unused_parameters():
    params, steps = judged(T("branch.w", used=[True, False, True]), T("trunk.w"))
    advice = build_advice(params, steps)
    fup = advice["find_unused_parameters"]
    assert fup["value"] is True
    assert fup["unused"] == [] and fup["unused_bytes"] == 0
    assert fup["intermittent"] == ["branch.w"]
    assert "some steps" in fup["evidence"]
    assert advice["static_graph"]["value"] is False
    assert "changed between steps" in advice["static_graph"]["evidence"]


def test_advice_all_used_means_no_find_unused_parameters_and_a_static_graph():
    params, steps = judged(T("a.w"), T("a.b"),
                           T("frozen.w", held=False, requires_grad=False, used=False,
                             changed=False))
    advice = build_advice(params, steps)
    assert advice["find_unused_parameters"]["value"] is False
    assert advice["find_unused_parameters"]["unused_bytes"] == 0
    assert "3 observed steps" in advice["find_unused_parameters"]["evidence"]
    assert advice["static_graph"]["value"] is True
    assert advice["static_graph"]["evidence"]


def test_static_graph_true_when_the_used_set_is_constant_even_with_an_unused_tensor():
    params, steps = judged(T("a.w"), dead("b.w"))
    advice = build_advice(params, steps)
    assert advice["find_unused_parameters"]["value"] is True
    assert advice["static_graph"]["value"] is True


def test_static_graph_false_when_the_used_set_changes_between_steps():
    # both tensors used on 2 of 3 steps each, never the same set twice in a row
    params, steps = judged(T("a.w", used=[True, False, True]), T("b.w", used=[False, True, True]))
    advice = build_advice(params, steps)
    assert advice["static_graph"]["value"] is False
    assert advice["find_unused_parameters"]["intermittent"] == ["a.w", "b.w"]


def test_static_graph_false_when_the_trainable_set_changes_between_steps():
    params, steps = judged(T("a.w"), T("b.w", requires_grad=[True, True, False],
                                       used=[True, True, False], changed=[True, True, False]))
    advice = build_advice(params, steps)
    assert advice["find_unused_parameters"]["value"] is False
    assert advice["static_graph"]["value"] is False


def test_advice_ignores_tensors_outside_the_model():
    params, steps = judged(T("a.w"), T("<optimizer 0 group 0 #1>", in_model=False, module="",
                                       used=False, changed=False))
    assert build_advice(params, steps)["find_unused_parameters"]["value"] is False


def test_advice_with_no_observed_step():
    params, steps = judged(T("a.w", n_steps=0))
    advice = build_advice(params, steps)
    assert advice["steps"] == 0
    assert advice["find_unused_parameters"]["value"] is False
    assert advice["static_graph"]["value"] is False
