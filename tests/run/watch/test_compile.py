"""On a `torch.compile`d model, observing takes nothing away from the graph: attaching,
observed and unobserved steps and detaching add no graph break, no new graph and no traced
frame (dynamo's own counters), under `watch` (steps and the whole run) and `diagnose`; the
verdicts stay exact. Under compiled autograd the hooks are traced away: the steps are not
observed, one logged line says so, and nothing raises (docs/watch.md, "torch.compile")."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import diagkit

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.body(x))


def dynamo_counts() -> dict:
    return {"graph_break": sum(counters["graph_break"].values()),
            "unimplemented": sum(counters["unimplemented"].values()),
            "frames": counters["frames"]["total"],
            "unique_graphs": counters["stats"]["unique_graphs"]}


@pytest.fixture
def compiled():
    """A compiled model whose head no optimizer holds (an orphan), compiled on its first
    call (never before), with dynamo's counters from zero."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.body.parameters(), lr=0.1)
    return model, torch.compile(model, backend="aot_eager"), opt  # dynamo's counters: any backend


def steps(cm, opt, n):
    for _ in range(n):
        loss = cm(torch.randn(6, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


ONE_GRAPH = {"graph_break": 0, "unimplemented": 0, "frames": 1, "unique_graphs": 1}


@pytest.mark.parametrize("warm", [0, 2], ids=["attached-before-compiling", "attached-after"])
@pytest.mark.parametrize("length", [3, None], ids=["steps", "whole-run"])
def test_watch_adds_no_break_no_graph_no_frame(compiled, warm, length):
    model, cm, opt = compiled
    steps(cm, opt, warm)
    w = diagkit.watch(cm, opt, steps=length, every=2)
    steps(cm, opt, 6)  # observed and (every=2) unobserved steps
    w.stop()
    steps(cm, opt, 2)  # detached
    assert dynamo_counts() == ONE_GRAPH
    verdicts = w.diagnosis.verdicts()
    assert "orphan" in verdicts["head.weight"] and verdicts["body.0.weight"] == {"ok"}


def test_diagnose_adds_no_break_no_graph_no_frame(compiled):
    model, cm, opt = compiled
    diag = diagkit.diagnose(cm, opt, batch_fn=lambda: torch.randn(6, 8),
                            loss_fn=lambda m, b: m(b).pow(2).mean(), steps=3)
    steps(cm, opt, 2)
    assert dynamo_counts() == ONE_GRAPH
    verdicts = {n.removeprefix("_orig_mod."): v for n, v in diag.verdicts().items()}
    assert "orphan" in verdicts["head.weight"] and verdicts["body.0.weight"] == {"ok"}


def test_compiled_autograd_is_said_in_one_line_and_never_raises(compiled, caplog):
    from torch._dynamo import compiled_autograd
    model, cm, opt = compiled

    def step():
        loss = cm(torch.randn(6, 8)).pow(2).mean()
        opt.zero_grad()
        with compiled_autograd._enable(torch.compile(backend="eager")):
            loss.backward()
        opt.step()
    with caplog.at_level(logging.WARNING, logger="diagkit"):
        w = diagkit.watch(cm, opt, steps=3)
        for _ in range(4):
            step()
        w.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "diagkit"]
    assert len(said) == 1 and "compiled autograd" in said[0]
    assert sum(counters["graph_break"].values()) == 0
    diag = w.diagnosis
    assert diag.steps.empty  # nothing seen: nothing judged as if it were
    [why] = {d["why"] for d in diag.meta["dropped_steps"]}
    assert said[0].endswith(why)
    assert not [f for f in diag.findings if f.code in ("unused", "orphan", "stalled")]


def test_a_compiled_hf_llama_whole_run_adds_no_graph():
    """An HF model's compiled forward makes dynamo guard on torch's global module hooks: the
    whole run's wiring check sets none on a compiled model (`measure.engines.unwrap.compiled`)."""
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cm = torch.compile(model, backend="aot_eager")

    def steps(n):
        for _ in range(n):
            x = torch.randint(1, 64, (2, 8))
            loss = cm(input_ids=x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    steps(1)
    before = dynamo_counts()
    w = diagkit.watch(cm, opt, steps=None, every=2)
    steps(4)
    w.stop()
    steps(1)
    assert dynamo_counts() == before and before["graph_break"] == 0
    assert not [f for f in w.diagnosis.findings if f.severity != "info"]
