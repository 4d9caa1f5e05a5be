"""The rank demos (diagkit.demos.ranks) in one process: each gives its single-process
verdict, none faults, they are deterministic, and a run of one process has no rank view. Under
two real processes: test_demos_ranks.py."""

from __future__ import annotations

import pytest
import torch

import diagkit
from diagkit.demos import DEMOS, common
from diagkit.present.ranks import rank_view

FREE = "<optimizer 0 group 1 #0>"
BODY = ["module.body.weight", "module.body.bias", "module.head.weight", "module.head.bias"]


def diagnose(name: str, **kwargs):
    return diagkit.diagnose(diagkit.load_target(f"diagkit.demos:{name}", **kwargs))


def test_rank_demos_are_exported_but_not_in_diagkit_demo():
    import diagkit.demos as demos
    for name in ("forward_arg", "rank_branch", "ddp_strict", "hang", "crash"):
        assert name in demos.__all__ and callable(getattr(demos, name))
        assert name not in DEMOS
    assert DEMOS == ("meta_memory", "finetune_heads", "clean")


def test_wrap_like_ddp_without_a_process_group():
    assert not torch.distributed.is_initialized()
    assert not common.distributed() and common.current_rank() == 0
    wrapped = common.wrap_like_ddp(torch.nn.Linear(2, 2), find_unused_parameters=True)
    assert type(wrapped) is common.WrapperLikeDDP
    assert [n for n, _ in wrapped.named_parameters()] == ["module.weight", "module.bias"]
    assert type(diagkit.load_target("diagkit.demos:meta_memory").model) is common.WrapperLikeDDP


def test_forward_arg_single_process_not_in_model():
    diag = diagnose("forward_arg")
    assert diag.meta["steps_observed"] == 3
    assert diag.verdicts() == {**{n: {"ok"} for n in BODY}, FREE: {"not_in_model"}}
    row = diag.params.set_index("name").loc[FREE]
    assert not row["in_model"] and row["used_steps"] == 3 and row["changed_steps"] == 3


def test_rank_branch_single_process_branch_unused():
    diag = diagnose("rank_branch")
    aux = {"module.aux.weight", "module.aux.bias"}
    assert diag.verdicts() == {**{n: {"ok"} for n in BODY}, **{n: {"unused"} for n in aux}}


def test_ddp_strict_single_process_head_unused():
    diag = diagnose("ddp_strict")
    head = {"module.old_head.weight", "module.old_head.bias"}
    assert diag.verdicts() == {**{n: {"ok"} for n in BODY}, **{n: {"unused"} for n in head}}
    assert diag.advice["find_unused_parameters"]["value"] is True


@pytest.mark.parametrize("name", ["hang", "crash"])
def test_hang_and_crash_never_fault_in_one_process(name):
    diag = diagnose(name)
    assert diag.failure is None and diag.meta["steps_observed"] == 3
    assert diag.verdicts() == {n: {"ok"} for n in BODY}


def test_crash_at_step_zero_still_single_process_safe():
    diag = diagnose("crash", crash_at=0, steps=2)
    assert diag.failure is None and diag.meta["steps_observed"] == 2


def test_rank_demos_are_deterministic():
    a, b = (diagkit.load_target("diagkit.demos:forward_arg") for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    for _ in range(2):
        (xa, ya), (xb, yb) = a.batch_fn(), b.batch_fn()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    c = diagkit.load_target("diagkit.demos:forward_arg", seed=1)
    assert not torch.equal(c.batch_fn()[0], diagkit.load_target(
        "diagkit.demos:forward_arg").batch_fn()[0])


def test_single_process_rank_view_is_empty():
    assert rank_view(diagnose("clean", steps=1)) == ""  # the report folds the section away
