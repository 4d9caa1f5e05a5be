"""Where each optimizer group was built (issue 15, item 2): recorded while a target is built
(`measure.origin.provenance`), carried in `meta["optimizer_sources"]`, put on the findings about
optimizer membership (`Finding.source`), shown in text, HTML and JSON, saved and loaded."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

import diagkit
from diagkit.core.errors import TargetError
from diagkit.measure.origin import provenance
from diagkit.present.sections import diagnosis_html, findings_table
from diagkit.present.text import render_findings

FILTER = 'not n.startswith("module.metamodel")'

TWO_OPTIMIZERS = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)
            self.head = nn.Linear(4, 4)
            self.still = nn.Linear(4, 1)

        def forward(self, x):
            return self.still(self.head(self.norm(self.enc(x))))


    def build():
        torch.manual_seed(0)
        model = Net()
        decay = [p for n, p in model.named_parameters() if n.startswith("enc.")]  # MARK-decay
        opt_a = torch.optim.AdamW([
            {"params": decay, "weight_decay": 0.01},
            {"params": list(model.norm.parameters()),  # MARK-norm
             "weight_decay": 0.01},
        ], lr=1e-3)
        head = list(model.head.parameters())  # MARK-head
        opt_b = torch.optim.SGD(head, lr=0.1)
        opt_b.add_param_group({"params": list(model.still.parameters()), "lr": 0.0})  # MARK-still
        return {"model": model, "optimizers": [opt_a, opt_b], "steps": 3,
                "batch_fn": lambda: torch.randn(8, 4),
                "loss_fn": lambda m, x: m(x).pow(2).mean()}


    def shared():
        torch.manual_seed(0)
        model = Net()
        model.enc.requires_grad_(False)
        opt_a = torch.optim.SGD(model.parameters(), lr=0.1)  # MARK-all
        opt_b = torch.optim.Adam(model.head.parameters(), lr=0.1)  # MARK-again
        return {"model": model, "optimizers": [opt_a, opt_b], "steps": 2,
                "batch_fn": lambda: torch.randn(8, 4),
                "loss_fn": lambda m, x: m(x).pow(2).mean()}


    def raises():
        model = Net()
        torch.optim.SGD(model.parameters(), lr=0.1)
        raise RuntimeError("the builder broke")
''')


def _line_of(text: str, mark: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if mark in line)


@pytest.fixture(scope="module")
def two_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("source") / "two_opts.py"
    path.write_text(TWO_OPTIMIZERS)
    return path


def _orphan(diag):
    return next(f for f in diag.findings if f.code == "orphan")


# ------------------------------------------------------------- the first seed's demo
def test_meta_memory_orphan_shows_the_filter_line_in_text_html_and_json(meta):
    orphan = _orphan(meta)
    assert orphan.source, "the orphan finding carries where the optimizer's groups were built"
    assert any(FILTER in line for s in orphan.source for line in s["lines"])
    assert all(s["file"].endswith("demos/metamem.py") for s in orphan.source)
    text = render_findings(meta)
    assert FILTER in text and "demos/metamem.py:" in text
    page = findings_table(meta.findings)
    assert 'not n.startswith(&quot;module.metamodel&quot;)' in page
    assert "metamem.py:" in diagnosis_html(meta)
    shown = json.loads(json.dumps(meta.to_json_dict()))["findings"]
    sources = next(f["source"] for f in shown if f["code"] == "orphan")
    assert any(FILTER in line for s in sources for line in s["lines"])
    # grad_not_cleared is not about optimizer membership: no source on it
    assert not next(f for f in meta.findings if f.code == "grad_not_cleared").source


def test_meta_memory_under_two_ranks_carries_the_source_to_rank_0():
    from diagkit.run.diagnose.launcher import diagnose_distributed
    diag = diagnose_distributed("diagkit.demos:meta_memory", nproc=2, steps=2,
                                measure_cost=False)
    assert any(FILTER in line for s in _orphan(diag).source for line in s["lines"])
    assert FILTER in render_findings(diag)


# ------------------------------------------------------------- several optimizers and groups
def test_each_group_of_two_optimizers_gets_its_own_line(two_file):
    setup = diagkit.load_target(f"{two_file}:build")
    src = {(s["optimizer"], s["group"]): s for s in setup.optimizer_sources}
    assert sorted(src) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [src[k]["class"] for k in sorted(src)] == ["AdamW", "AdamW", "SGD", "SGD"]
    text = TWO_OPTIMIZERS
    # group 0 names a list made on an earlier line: that line (the filter) is shown first
    assert src[(0, 0)]["line"] == _line_of(text, "MARK-decay")
    assert src[(0, 0)]["how"] == "assigned" and "MARK-decay" in src[(0, 0)]["lines"][0]
    # group 1: its own element of the list of groups, both of its lines
    assert src[(0, 1)]["line"] == _line_of(text, "MARK-norm")
    assert src[(0, 1)]["lines"][0].startswith('{"params": list(model.norm.parameters())')
    assert '"weight_decay": 0.01}' in src[(0, 1)]["lines"][1]
    # SGD(head, ...): the statement that made `head`, then the call
    assert src[(1, 0)]["line"] == _line_of(text, "MARK-head")
    assert "torch.optim.SGD(head" in src[(1, 0)]["lines"][-1]
    # a group added later: the add_param_group line
    assert src[(1, 1)]["line"] == _line_of(text, "MARK-still")
    assert len({s["line"] for s in src.values()}) == 4


def test_findings_point_at_their_own_group(two_file):
    diag = diagkit.diagnose(diagkit.load_target(f"{two_file}:build"))
    by_code = {f.code: f for f in diag.findings}
    stalled = by_code["stalled"]  # lr 0 in the group add_param_group made
    assert [(s["optimizer"], s["group"]) for s in stalled.source] == [(1, 1)]
    assert "MARK-still" in stalled.source[0]["lines"][0]
    decay = {f.module: [(s["optimizer"], s["group"]) for s in f.source]
             for f in diag.findings if f.code == "decay_on_norm_or_bias"}
    assert decay == {"norm": [(0, 1)], "enc.bias": [(0, 0)]}  # each in its own group
    assert "MARK-still" in render_findings(diag)


def test_frozen_and_shared_tensors_point_at_every_group_that_holds_them(two_file):
    diag = diagkit.diagnose(diagkit.load_target(f"{two_file}:shared"))
    by_code = {f.code: f for f in diag.findings}
    frozen = by_code["frozen_in_optimizer"]
    assert [(s["optimizer"], s["group"]) for s in frozen.source] == [(0, 0)]
    assert "MARK-all" in frozen.source[0]["lines"][0]
    twice = by_code["in_multiple_optimizers"]
    assert [(s["optimizer"], s["group"], s["class"]) for s in twice.source] == [
        (0, 0, "SGD"), (1, 0, "Adam")]
    assert "MARK-again" in twice.source[1]["lines"][0]


def test_patches_are_removed_after_the_build_even_when_the_target_raises(two_file):
    init, add = torch.optim.Optimizer.__init__, torch.optim.Optimizer.add_param_group
    with pytest.raises(TargetError, match="the builder broke"):
        diagkit.load_target(f"{two_file}:raises")
    assert torch.optim.Optimizer.__init__ is init
    assert torch.optim.Optimizer.add_param_group is add
    assert provenance._active == []
    diagkit.load_target(f"{two_file}:build")  # and after a build that succeeded
    assert torch.optim.Optimizer.__init__ is init
    assert torch.optim.Optimizer.add_param_group is add


def test_diagnose_of_objects_in_hand_has_no_source():
    """The optimizer was built before diagkit was called: nothing to record (docs/targets.md)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: torch.randn(4, 3),
                            loss_fn=lambda m, x: m(x).sum(), steps=2)
    assert _orphan(diag).source == ()
    assert "optimizer_sources" not in diag.meta


# ------------------------------------------------------------- watch
def _train(model, opt, steps=3):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 3)).pow(2).mean().backward()
        opt.step()


def test_watch_finds_the_optimizer_from_the_watch_call():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    kept = [p for n, p in model.named_parameters() if not n.startswith("1.")]  # MARK-watch
    opt = torch.optim.SGD([{"params": kept}], lr=0.1)
    w = diagkit.watch(model, opt, steps=2)
    _train(model, opt)
    orphan = _orphan(w.diagnosis)
    assert [(s["optimizer"], s["group"]) for s in orphan.source] == [(0, 0)]
    assert orphan.source[0]["file"] == __file__
    assert "MARK-watch" in orphan.source[0]["lines"][0]
    assert "torch.optim.SGD([{" in orphan.source[0]["lines"][1]


def _watch_elsewhere(model, opt):
    """The optimizer is a parameter here, assigned in no statement: the watch line is shown."""
    return diagkit.watch(model, opt, steps=2)  # MARK-handed


def test_watch_of_an_optimizer_built_elsewhere_shows_the_watch_call():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    w = _watch_elsewhere(model, opt)
    _train(model, opt)
    source = _orphan(w.diagnosis).source
    assert source[0]["how"] == "watch_call" and "MARK-handed" in source[0]["lines"][0]
    assert "handed over at" in render_findings(w.diagnosis)


def test_watch_called_from_no_user_code_has_no_source():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    scope = {"diagkit": diagkit, "model": model, "opt": opt}
    exec("w = diagkit.watch(model, opt, steps=2)", scope)  # noqa: S102 - no source file
    _train(model, opt)
    assert _orphan(scope["w"].diagnosis).source == ()


# ------------------------------------------------------------- saved and loaded
def test_saved_diagnosis_keeps_the_source_and_an_older_one_loads(meta, tmp_path):
    meta.save(tmp_path / "new")
    loaded = diagkit.load(tmp_path / "new")
    assert _orphan(loaded).source == _orphan(meta).source
    assert loaded.meta["optimizer_sources"] == meta.meta["optimizer_sources"]
    assert FILTER in render_findings(loaded)
    meta.save(tmp_path / "old")  # as saved before the field existed: no "source" key
    findings = tmp_path / "old" / "findings.json"
    rows = json.loads(findings.read_text())
    for row in rows:
        row.pop("source")
    findings.write_text(json.dumps(rows))
    old = diagkit.load(tmp_path / "old")
    assert _orphan(old).source == ()
    assert FILTER not in render_findings(old) and "orphan" in render_findings(old)


class _OwnGroups(torch.optim.SGD):
    """An optimizer whose add_param_group never calls the base's."""

    def add_param_group(self, param_group):
        param_group.setdefault("lr", self.defaults["lr"])
        param_group["params"] = list(param_group["params"])
        self.param_groups.append({**self.defaults, **param_group})


def test_an_optimizer_that_skips_the_base_add_param_group_gets_its_constructor_line():
    model = torch.nn.Linear(3, 1)
    with provenance.record_optimizer_sources() as recorder:
        opt = _OwnGroups(model.parameters(), lr=0.1)  # MARK-own
    [source] = provenance.sources_for(recorder, [opt])
    assert (source["optimizer"], source["group"], source["class"]) == (0, 0, "_OwnGroups")
    assert "MARK-own" in source["lines"][-1]
