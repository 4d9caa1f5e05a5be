"""A fix names the model and the optimizers as the user's `watch(...)` call does
(`measure.origin.watch_call`, `meta["names"]`): `watch(model2, opt2)` in a namespace that also holds
`model` says `model2`; a list of optimizers names the one whose group fits; a wrapper the watch
saw through is spelled out; an expression that is not a plain name (a call) keeps the generic
word. Real watches of real loops, each called here, in this file."""

from __future__ import annotations

import torch

import diagkit
from diagkit.core import fixtext
from diagkit.measure.origin.watch_call import simple_expression
from models import MLP, TwoHeads, fixed_batch, two_heads_groups


def train(model, opts, steps=4):
    opts = opts if isinstance(opts, list) else [opts]
    for _ in range(steps):
        for o in opts:
            o.zero_grad()
        model(fixed_batch() if isinstance(model, MLP) or hasattr(model, "_orig_mod")
              else torch.randn(4, 8)).pow(2).mean().backward()
        for o in opts:
            o.step()


def orphan_fix(diag) -> str:
    (orphan,) = [f for f in diag.findings if f.code == "orphan"]
    return orphan.fix


def test_the_watched_model_is_named_not_another_model_in_the_namespace():
    torch.manual_seed(0)
    model = TwoHeads()  # noqa: F841 (another model: the fix must not target it)
    model2 = TwoHeads()
    opt2 = torch.optim.SGD(two_heads_groups(dict(model2.named_parameters()), planted=True),
                           lr=0.05)
    w = diagkit.watch(model2, opt2, steps=3, live=False)
    train(model2, opt2)
    diag = w.stop()
    assert diag.meta["names"] == {"model": "model2", "optimizers": ["opt2"]}
    assert fixtext.first_code(orphan_fix(diag)) == (
        'opt2.param_groups[0]["params"].append(model2.head2.weight)\n'
        'opt2.param_groups[1]["params"].append(model2.head2.bias)')
    assert "for p in model2.head2.parameters(): p.requires_grad_(False)" in orphan_fix(diag)


def test_a_list_of_optimizers_names_the_one_whose_group_fits():
    torch.manual_seed(0)
    m = MLP()
    o1 = torch.optim.SGD(m.fc1.parameters(), lr=0.1)
    o2 = torch.optim.SGD([m.fc2.weight], lr=0.01)
    with diagkit.watch(m, [o1, o2], steps=3, live=False) as w:
        train(m, [o1, o2])
    fix = orphan_fix(w.diagnosis)
    assert w.diagnosis.meta["names"] == {"model": "m", "optimizers": ["o1", "o2"]}
    assert fix.startswith("Add it to the optimizer group that fits it (o2 group 0: lr 0.01, "
                          "weight_decay 0):")
    assert fixtext.first_code(fix) == 'o2.param_groups[0]["params"].append(m.fc2.bias)'
    exec(fixtext.first_code(fix))  # noqa: S102 - as pasted, here
    assert any(p is m.fc2.bias for p in o2.param_groups[0]["params"])


def test_a_wrapper_seen_through_is_spelled_out():
    torch.manual_seed(0)
    m = MLP()
    compiled = torch.compile(m, backend="eager")
    opt = torch.optim.SGD([m.fc1.weight, m.fc1.bias, m.fc2.weight], lr=0.1)
    w = diagkit.watch(compiled, opt, steps=2, live=False)
    train(compiled, opt, steps=3)
    diag = w.stop()
    assert diag.meta["names"]["model"] == "compiled._orig_mod"
    assert "compiled._orig_mod.fc2.bias" in fixtext.first_code(orphan_fix(diag))


def test_an_expression_that_runs_code_keeps_the_generic_words():
    torch.manual_seed(0)
    m = MLP()
    opts = {"main": torch.optim.SGD([m.fc1.weight, m.fc1.bias, m.fc2.weight], lr=0.1)}
    w = diagkit.watch(m.train(), opts["main"], steps=2, live=False)
    train(m, opts["main"], steps=3)
    diag = w.stop()
    assert diag.meta["names"] == {"optimizers": ["opts['main']"]}
    code = fixtext.first_code(orphan_fix(diag))
    assert code == """opts['main'].param_groups[0]["params"].append(model.fc2.bias)"""


def test_a_dict_of_modules_names_each_by_its_own_variable():
    torch.manual_seed(0)
    enc, dec = MLP(), MLP(d_in=3)
    oe = torch.optim.SGD(enc.parameters(), lr=0.1)
    od = torch.optim.SGD([dec.fc1.weight, dec.fc1.bias, dec.fc2.weight], lr=0.1)
    w = diagkit.watch({"encoder": enc, "decoder": dec}, [oe, od], steps=2, live=False)
    for _ in range(3):
        oe.zero_grad()
        od.zero_grad()
        dec(enc(fixed_batch())).pow(2).mean().backward()
        oe.step()
        od.step()
    diag = w.stop()
    assert diag.meta["names"]["model"] == {"encoder": "enc", "decoder": "dec"}
    assert fixtext.first_code(orphan_fix(diag)) == \
        'od.param_groups[0]["params"].append(dec.fc2.bias)'


def test_simple_expressions_only():
    for text in ("m", "self.model", "trainer.optimizers[0]", "ns['opt']", "a.b[1].c"):
        assert simple_expression(text), text
    for text in ("m()", "m.train()", "a + b", "x[i]", "__import__('os')", "", None, "1", "a;b",
                 "lambda: 0", "[m]"):
        assert not simple_expression(text), text


def test_a_whole_run_watch_names_them_too(caplog):
    """A whole run judges each window itself: its logged line and final fix say `opt2`."""
    torch.manual_seed(0)
    model2 = TwoHeads()
    opt2 = torch.optim.SGD(two_heads_groups(dict(model2.named_parameters()), planted=True),
                           lr=0.05)
    with caplog.at_level("WARNING", logger="diagkit"):
        w = diagkit.watch(model2, opt2, steps=None, every=2, live=False)
        train(model2, opt2, steps=8)
        diag = w.stop()
    assert fixtext.first_code(orphan_fix(diag)).startswith(
        'opt2.param_groups[0]["params"].append(model2.head2.weight)')
    logged = [r.getMessage() for r in caplog.records if "orphan" in r.getMessage()]
    assert logged and "opt2.param_groups" in logged[0], logged
