"""What `rank_divergent` says for a tensor that required grad throughout is what was seen
(issue 21, section 5): the steps on which DDP averaged its gradient (equal .grad norms on every
rank), how the model was wrapped (`meta["wrappers"]`) and DDP's tensors against the model's
(`measure.engines.ddp_facts`). "Unfrozen after wrapping" only where requires_grad changed."""

from __future__ import annotations

import pandas as pd

from tables import T, tables
from diagkit.judge.findings import build_findings
from diagkit.judge.rules_ranks import gradient_averaged
from diagkit.judge.verdicts import judge

DDP = ["DistributedDataParallel"]
BUILT = {"num_parameter_tensors": 2, "trainable_now": 2, "replaced": [], "replaced_count": 0}


def two_ranks(*tensors, unsynced=(), drifting=("w",)):
    """Two ranks; `drifting`'s values differ from step 1 on; the .grad norms differ between
    the ranks on the steps `unsynced` (DDP did not average them), for every tensor."""
    params, steps = tables(*tensors)
    steps = pd.concat([steps.assign(rank=r) for r in (0, 1)], ignore_index=True)
    steps["checksum"] = 1.0
    steps.loc[(steps["rank"] == 1) & steps["name"].isin(drifting) & (steps["step"] >= 1),
              "checksum"] = 2.0
    steps.loc[(steps["rank"] == 1) & steps["step"].isin(unsynced), "grad_total_norm"] = 3.0
    return params, steps


def divergent(params, steps, **context):
    params["verdicts"], errors = judge(params, steps)
    assert errors == []
    (f,) = [f for f in build_findings(params, steps, context=context)
            if f.code == "rank_divergent"]
    return f


def test_averaged_on_some_steps_names_them_and_the_bypassed_wrapper():
    f = divergent(*two_ranks(T("w"), T("v"), unsynced=(1,)), wrappers=DDP, ddp=BUILT)
    assert "averaged across ranks on steps 0, 2 but not on step 1" in f.message
    assert "instead of the DDP wrapper" in f.message and "unfrozen" not in f.message
    assert "ddp(x), not ddp.module(x)" in f.fix


def test_never_averaged_and_never_wrapped_says_not_wrapped():
    f = divergent(*two_ranks(T("w"), T("v"), unsynced=(0, 1, 2)), wrappers=[], ddp={})
    assert "not wrapped in DistributedDataParallel (it was given as the bare module)" \
        in f.message
    assert "unfrozen" not in f.message and "DistributedDataParallel(model)" in f.fix
    f = divergent(*two_ranks(T("w"), T("v"), unsynced=(0, 1, 2)),
                  wrappers=["OptimizedModule"], ddp={})
    assert "it was given as OptimizedModule" in f.message


def test_never_averaged_and_replaced_after_wrapping_names_the_tensor():
    facts = {**BUILT, "replaced": ["w"], "replaced_count": 1}
    f = divergent(*two_ranks(T("w"), T("v"), unsynced=(0, 1, 2)), wrappers=DDP, ddp=facts)
    assert "`w` is not the tensor DDP was built with" in f.message
    assert "unfrozen" not in f.message and "Replace parameters before" in f.fix
    # DDP's names carry `module.` where the observed ones do not (and the other way round)
    facts = {**BUILT, "replaced": ["module.w"], "replaced_count": 1}
    f = divergent(*two_ranks(T("w"), T("v"), unsynced=(0, 1, 2)), wrappers=DDP, ddp=facts)
    assert "`w` is not the tensor DDP was built with" in f.message


def test_never_averaged_with_more_trainable_tensors_than_ddp_averages_is_unfrozen():
    f = divergent(*two_ranks(T("w"), T("v"), unsynced=(0, 1, 2)), wrappers=DDP,
                  ddp={**BUILT, "num_parameter_tensors": 1})
    assert "DDP was built when 1 of its tensors required grad and 2 do now" in f.message
    assert "unfrozen after DDP was built" in f.message
    assert "requires_grad before DistributedDataParallel(model)" in f.fix


def test_never_averaged_with_the_same_tensors_and_flags_is_replaced_storage():
    f = divergent(*two_ranks(T("w"), T("v"), unsynced=(0, 1, 2)), wrappers=DDP, ddp=BUILT)
    assert "storage was replaced after DDP was built" in f.message
    assert ".double().float()" in f.message and "unfrozen" not in f.message
    assert "Convert the model (dtype, device) before" in f.fix


def test_nothing_known_guesses_no_single_cause():
    f = divergent(*two_ranks(T("w"), T("v"), unsynced=(0, 1, 2)))
    assert "the steps do not show why" in f.message
    assert "most likely" not in f.message and "it was unfrozen" not in f.message


def test_gradient_averaged_skips_steps_without_a_gradient_on_every_rank():
    params, steps = two_ranks(T("w", used=[True, False, True],
                                grad_total_norm=[1.0, float("nan"), 1.0]), unsynced=(2,))
    assert gradient_averaged(steps, ["w"]) == {0: True, 2: False}
    assert gradient_averaged(steps[steps["rank"] == 0], ["w"]) == {}
