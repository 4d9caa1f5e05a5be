"""Every fix in the form of `core.fixtext`, its code valid Python in the user's own names, on
real findings: each verdict is planted in a real model watched in a real loop. The code of the
fixes that change the live objects is run as it is, and the next watch of the same loop no
longer has the finding (issue 37, item 3). The model and the optimizer are held in a dict,
`ns`, so the watch's own names are `ns['model']` and `ns['opt']`: code that says `model` or
`optimizer` would fail."""

from __future__ import annotations

import ast

import pandas as pd
import pytest
import torch
from torch import nn

import diagkit
from tables import T, tables
from diagkit.core import fixtext
from diagkit.core.result import StepFailure
from diagkit.judge.findings import build_findings
from diagkit.judge.verdicts import VERDICTS, judge
from models import (MLP, EvenBranch, ListCells, NormNet, PlainMemory, SqrtAtZero, TakesPrompt,
                    TwoHeads, WithDeadHead, ZeroGate, fixed_batch, make_prompt_loss,
                    two_heads_groups)

# The names a fix's code may use besides the user's `ns`: its own loop variables, the lists it
# makes, torch's, a hook's `self`, the user's `loss` in a loop.
OWN = {"ns", "p", "g", "q", "k", "v", "no_decay", "loss", "self", "nn", "torch", "sum", "all",
       "list"}


def loop(ns, steps, *, zero=True, forward=None):
    """`steps` steps of the usual loop over ns['model'] and ns['opt'] (one or a list)."""
    opts = ns["opt"] if isinstance(ns["opt"], list) else [ns["opt"]] if ns["opt"] else []
    x = fixed_batch()
    for i in range(steps):
        if zero:
            for o in opts:
                o.zero_grad()
        loss = forward(i) if forward else ns["model"](x).pow(2).mean()
        loss.backward()
        for o in opts:
            o.step()


def watched(ns, steps=4, **how):
    """A watch of `steps` steps; the names it reads are `ns['model']` and `ns['opt']`."""
    w = diagkit.watch(ns["model"], ns["opt"], steps=steps, live=False)
    loop(ns, steps + 1, **how)
    return w.stop()


def two_heads():
    torch.manual_seed(0)
    m = TwoHeads()
    ns = {"model": m, "opt": torch.optim.AdamW(two_heads_groups(dict(m.named_parameters()),
                                                                planted=True), lr=0.01)}
    return ns, {"forward": lambda i: m(torch.randn(4, 8))}


def dead_head():
    torch.manual_seed(0)
    m = WithDeadHead()
    return {"model": m, "opt": torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)}, {}


def frozen_half():
    torch.manual_seed(0)
    m = MLP()
    m.fc1.requires_grad_(False)
    return {"model": m, "opt": torch.optim.Adam(m.parameters(), lr=0.01)}, {}


def decaying_norms(split: bool):
    torch.manual_seed(0)
    m = NormNet()
    groups = ([{"params": [m.fc.weight, m.out.weight, m.fc.bias]},
               {"params": list(m.ln.parameters()), "weight_decay": 0.0}] if split
              else m.parameters())
    return {"model": m, "opt": torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1)}, {}


def held_twice():
    torch.manual_seed(0)
    m = MLP()
    return {"model": m, "opt": [torch.optim.SGD(m.parameters(), lr=0.1),
                                torch.optim.SGD(m.fc2.parameters(), lr=0.1)]}, {}


def frozen_at_step_2():
    torch.manual_seed(0)
    m = MLP()
    ns = {"model": m, "opt": torch.optim.Adam(m.parameters(), lr=0.01)}
    x = fixed_batch()

    def forward(i):
        ns["opt"].zero_grad(set_to_none=False)
        if i == 2:
            m.fc1.weight.requires_grad_(False)
        return m(x).pow(2).mean()
    return ns, {"forward": forward, "zero": False}


# The scenarios whose first code block changes the live objects: run it, watch again, and the
# verdict is gone (with no new one).
LIVE = {"orphan": two_heads, "unused": dead_head, "frozen_in_optimizer": frozen_half,
        "decay_on_norm_or_bias": lambda: decaying_norms(split=False),
        "in_multiple_optimizers": held_twice, "frozen_but_changing": frozen_at_step_2}


@pytest.mark.parametrize("code", sorted(LIVE))
def test_the_fix_run_as_it_is_clears_the_finding(code):
    ns, how = LIVE[code]()
    found = [f for f in watched(ns, **how).findings if f.code == code]
    assert found
    for finding in found:  # one per module subtree, each pasted in turn
        pasted = fixtext.first_code(finding.fix)
        assert pasted and "ns['" in pasted, finding.fix
        exec(pasted, {"ns": ns, "torch": torch, "nn": nn})
    after = watched(ns, **how)
    assert [f.code for f in after.findings] == [], [f.message for f in after.findings]


def test_a_bias_moves_to_the_users_own_no_decay_group():
    ns, how = decaying_norms(split=True)
    (finding,) = [f for f in watched(ns, **how).findings if f.code == "decay_on_norm_or_bias"]
    assert fixtext.first_code(finding.fix).endswith(
        "ns['opt'].param_groups[1][\"params\"].extend(no_decay)")
    exec(fixtext.first_code(finding.fix), {"ns": ns})
    assert any(p is ns["model"].fc.bias for p in ns["opt"].param_groups[1]["params"])
    assert len(ns["opt"].param_groups) == 2 and not watched(ns, **how).findings


def other_runs():
    """Real runs of the verdicts whose fixes are words, or code for the user's loop or
    module (`loss`, `self`): parsed, not run."""
    runs = []
    torch.manual_seed(0)
    m = MLP()  # an lr of 0: stalled
    runs.append(watched({"model": m, "opt": torch.optim.SGD(
        [{"params": m.fc1.parameters()}, {"params": m.fc2.parameters(), "lr": 0.0}], lr=0.1)}))
    runs.append(watched({"model": MLP(), "opt": None}))  # no optimizer at all
    m = MLP()
    runs.append(watched({"model": m, "opt": torch.optim.SGD(m.parameters(), lr=0.1)},
                        zero=False))  # grad_not_cleared
    m = EvenBranch()
    runs.append(watched({"model": m, "opt": torch.optim.SGD(m.parameters(), lr=0.1)},
                        forward=lambda i: m(fixed_batch(), i % 2 == 0).sum()))  # intermittent
    for model in (ListCells(), PlainMemory()):  # unregistered
        runs.append(watched({"model": model, "opt": torch.optim.SGD(model.parameters(), lr=.1)}))
    loss_fn, prompt, _ = make_prompt_loss()
    m = TakesPrompt()  # not_in_model
    runs.append(watched({"model": m, "opt": torch.optim.SGD([*m.parameters(), prompt], lr=.1)},
                        forward=lambda i: loss_fn(m, fixed_batch())))
    for model in (ZeroGate(), SqrtAtZero()):  # zero_gradient, nonfinite_grad
        runs.append(watched({"model": model, "opt": torch.optim.SGD(model.parameters(), lr=.1)},
                            steps=3))
    m = MLP()
    m.requires_grad_(False)  # nothing_trains
    runs.append(watched({"model": m, "opt": torch.optim.SGD(m.parameters(), lr=0.1)},
                        forward=lambda i: m(fixed_batch()).sum() * torch.ones((),
                                                                               requires_grad=True)))
    return runs


def rank_findings():
    """The two verdicts of a distributed run, from two ranks' tables."""
    params, steps = tables(T("w"), T("v"), T("u", used=[True, False, True]))
    steps = pd.concat([steps.assign(rank=r) for r in (0, 1)], ignore_index=True)
    steps["checksum"] = 1.0
    steps.loc[(steps["rank"] == 1) & (steps["name"] == "w") & (steps["step"] >= 1),
              "checksum"] = 2.0
    steps.loc[(steps["rank"] == 1) & (steps["name"] == "v"), "used"] = False
    params["verdicts"], _ = judge(params, steps)
    return build_findings(params, steps, context={"names": {"model": "net"}})


def ddp_refusal():
    """DDP's own refusal of a tensor that got no gradient (a failed step, not a verdict)."""
    params, steps = tables(T("head.w", used=False), T("body.w"))
    params["verdicts"], _ = judge(params, steps)
    failure = StepFailure(step=0, error="RuntimeError: Expected to have finished reduction in "
                                        "the prior iteration", traceback="")
    (found,) = [f for f in build_findings(params, steps, failure=failure,
                                          context={"names": {"model": "net"}})
                if f.code == "ddp_unused_parameters"]
    assert fixtext.first_code(found.fix) == "for p in [net.head.w]: p.requires_grad_(False)"
    return [found]


@pytest.fixture(scope="module")
def every_finding():
    live = [watched(ns, **how) for ns, how in (LIVE[c]() for c in sorted(LIVE))]
    return ([f for d in [*other_runs(), *live] for f in d.findings] + rank_findings()
            + ddp_refusal())


def test_every_verdict_has_a_real_finding_here(every_finding):
    assert set(VERDICTS) <= {f.code for f in every_finding}


def test_every_fix_is_words_then_code_that_parses_in_the_users_names(every_finding):
    for f in every_finding:
        parts = fixtext.parts(f.fix)
        assert parts and parts[0][0] == "words", f.fix
        for i, (kind, text) in enumerate(parts):
            if kind == "words" and i + 1 < len(parts) and parts[i + 1][0] == "code":
                assert text.endswith(":"), f.fix  # words that lead to code end with ':'
            if kind != "code":
                continue
            tree = ast.parse(text)  # valid Python, as it is
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            assert names <= OWN | {"net"}, (f.code, text)  # never `model`, never `optimizer`


def test_a_saved_diagnosis_without_names_judges_with_the_generic_ones():
    params, steps = tables(T("head.w", held=False), T("body.w"))
    params["verdicts"], _ = judge(params, steps)
    (orphan,) = [f for f in build_findings(params, steps) if f.code == "orphan"]
    assert fixtext.first_code(orphan.fix) == ('optimizer.param_groups[0]["params"]'
                                              '.append(model.head.w)')
    (orphan,) = [f for f in build_findings(params, steps, context={"names": {
        "model": "m.eval()", "optimizers": ["__import__('os')"]}}) if f.code == "orphan"]
    assert "model.head.w" in orphan.fix and "optimizer.param_groups" in orphan.fix  # not code
