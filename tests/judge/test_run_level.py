"""`nothing_trains`, the run-level verdict (issue 35, item 5), on hand-made tables: its rule,
how `judge` keeps it off the tensors' verdicts, and its one finding for the whole run."""

from __future__ import annotations

from tables import T, tables
from diagkit.judge.findings import build_findings
from diagkit.judge.verdict import RUN_VERDICTS
from diagkit.judge.verdicts import VERDICTS, judge


def frozen(name: str, **kw) -> T:
    return T(name, held=False, requires_grad=False, used=False, changed=False, **kw)


def run_verdicts(*tensors: T, **judge_kw) -> tuple:
    params, steps = tables(*tensors)
    verdicts, errors = judge(params, steps, **judge_kw)
    assert errors == []
    return params.attrs[RUN_VERDICTS], verdicts


def judged_findings(*tensors: T):
    params, steps = tables(*tensors)
    params["verdicts"], errors = judge(params, steps)
    assert errors == []
    return build_findings(params, steps)


def test_it_is_a_run_level_error_decided_on_meta():
    v = VERDICTS["nothing_trains"]
    assert (v.severity, v.run_level, v.on_meta, v.membership) == ("error", True, True, False)
    assert v.meaning.startswith("(run level)")


def test_a_model_frozen_whole_trains_nothing():
    found, verdicts = run_verdicts(frozen("a.weight"), frozen("a.bias"))
    assert found == ("nothing_trains",)
    assert list(verdicts) == [("ok",), ("ok",)]  # it is the run's, no tensor's


def test_frozen_tensors_in_the_optimizer_train_nothing():
    held = T("a.weight", requires_grad=False, used=False, changed=False)
    assert run_verdicts(held, frozen("b.weight"))[0] == ("nothing_trains",)


def test_one_tensor_that_trains_is_enough():
    assert run_verdicts(frozen("a.weight"), T("lora.weight"))[0] == ()


def test_a_held_trainable_tensor_the_loss_never_reaches_trains_nothing():
    """The stray tensor beside a frozen model: it requires grad and is held, never used."""
    stray = T("<optimizer 0 group 0 #0>", in_model=False, module="", used=False, changed=False)
    assert run_verdicts(frozen("a.weight"), stray)[0] == ("nothing_trains",)


def test_a_held_tensor_outside_the_model_that_trains_is_enough():
    """A soft prompt passed to forward: not_in_model, but it trains."""
    prompt = T("<optimizer 0 group 0 #0>", in_model=False, module="")
    assert run_verdicts(frozen("a.weight"), prompt)[0] == ()


def test_tensors_that_want_to_train_but_no_optimizer_holds_train_nothing():
    found, verdicts = run_verdicts(T("a.weight", held=False), T("a.bias", held=False))
    assert found == ("nothing_trains",)
    assert set(verdicts) == {("orphan",)}


def test_without_any_optimizer_only_requires_grad_and_gradients_count():
    """Hand-written updates: membership means nothing."""
    assert run_verdicts(T("a.weight", held=False), optimizers=False)[0] == ()
    assert run_verdicts(frozen("a.weight"), optimizers=False)[0] == ("nothing_trains",)


def test_before_any_observed_step_the_wiring_decides():
    assert run_verdicts(T("a", n_steps=0))[0] == ()
    assert run_verdicts(T("a", n_steps=0, requires_grad=False))[0] == ("nothing_trains",)


def test_a_dry_run_on_meta_decides_it():
    assert run_verdicts(frozen("a.weight"), meta=True)[0] == ("nothing_trains",)


def test_requires_grad_and_a_gradient_must_be_on_one_same_step():
    """Required grad on step 0 only, got a gradient on step 1 only: never both at once."""
    odd = T("a", requires_grad=[True, False], used=[False, True], changed=False)
    assert run_verdicts(odd)[0] == ("nothing_trains",)


def test_one_finding_for_the_whole_run():
    found = judged_findings(frozen("enc.weight", bytes=100), frozen("enc.bias", bytes=10),
                            T("head.weight", requires_grad=False, used=False, changed=False,
                              bytes=1000))
    (f,) = [f for f in found if f.code == "nothing_trains"]
    assert (f.severity, f.module, f.count, f.bytes) == ("error", "", 3, 1110)
    assert f.params == ("enc.weight", "enc.bias", "head.weight")
    assert found[0] is f  # the worst, and the biggest
    assert "none of its 3 tensors" in f.message and "requires grad" in f.message
    assert "is_trainable=True" in f.fix and "requires_grad_(True)" in f.fix


def test_the_message_names_what_is_missing():
    unused = judged_findings(frozen("m.w"), T("x", in_model=False, module="", used=False,
                                              changed=False))
    (f,) = [f for f in unused if f.code == "nothing_trains"]
    assert "the loss reaches none of them" in f.message
    assert "none of the model's 1 tensors requires grad" in f.message
    orphans = judged_findings(T("m.w", held=False))
    (f,) = [f for f in orphans if f.code == "nothing_trains"]
    assert "no optimizer holds any of them" in f.message


def test_a_lora_model_leads_with_the_adapter_cause():
    found = judged_findings(frozen("q.lora_A.default.weight"), frozen("q.base_layer.weight"))
    (f,) = [f for f in found if f.code == "nothing_trains"]
    assert f.message.index("is_trainable=False") < f.message.index("freeze loop")
    plain = judged_findings(frozen("q.weight"))
    (g,) = [g for g in plain if g.code == "nothing_trains"]
    assert g.message.index("freeze loop") < g.message.index("is_trainable=False")


def test_a_run_that_trains_has_no_run_level_finding():
    assert judged_findings(frozen("a.weight"), T("b.weight")) == []
