"""The dry run on the meta device (`diagnose(..., device="meta")`, docs/meta.md, "Dry run on meta"):
the wiring verdicts from one real forward and backward on meta tensors, the value verdicts
reported as not measured and never fired, nothing allocated per parameter, bad input refused
in one line. Real torch throughout: the models are built under `torch.device("meta")`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diagkit import DiagkitError
from diagkit.judge.verdicts import VERDICTS
from diagkit.present.sections import diagnosis_html
from diagkit.present.text import render_findings
from diagkit.run.diagnose.api import diagnose

VALUE_VERDICTS = {n for n, v in VERDICTS.items() if v.needs is not None}


class Wired(nn.Module):
    """Every wiring bug a meta pass can see, one tensor or module each."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.body = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.dead = nn.Linear(8, 8)             # never in the forward: unused
        self.frozen = nn.Linear(8, 8)           # frozen, yet handed to the optimizer
        self.frozen.requires_grad_(False)
        self.loose = nn.Parameter(torch.zeros(8))  # used, in no optimizer: orphan
        self.twice = nn.Linear(8, 8)            # in both optimizers

    def forward(self, ids):
        h = self.norm(self.body(self.embed(ids)) + self.loose)
        return self.twice(self.frozen(h))


def build_wired():
    with torch.device("meta"):
        model = Wired()
        stale = nn.Parameter(torch.zeros(4))  # a stale head: held, not in the model
        main = [p for n, p in model.named_parameters() if not n.startswith(("loose", "body"))]
        opt = torch.optim.AdamW([{"params": main, "weight_decay": 0.1},
                                 # lr 0: `body` would be stalled in a real run
                                 {"params": list(model.body.parameters()) + [stale], "lr": 0.0,
                                  "weight_decay": 0.0}])
        second = torch.optim.SGD(model.twice.parameters(), lr=0.1)
    return model, [opt, second]


def ids_batch():
    return torch.randint(0, 10, (2, 5))  # real CPU ids


def sum_loss(model, batch):
    return model(batch).sum()


@pytest.fixture(scope="module")
def wired():
    model, opts = build_wired()
    return model, opts, diagnose(model, opts, batch_fn=ids_batch, loss_fn=sum_loss,
                                 device="meta")


def test_each_wiring_bug_gets_its_verdict_on_meta(wired):
    _, _, diag = wired
    v = diag.verdicts()
    assert v["loose"] == {"orphan"}
    assert v["dead.weight"] == {"unused"} and v["dead.bias"] == {"unused", "decay_on_norm_or_bias"}
    assert v["frozen.weight"] == {"frozen_in_optimizer"}
    assert v["norm.weight"] == {"decay_on_norm_or_bias"}
    assert v["twice.weight"] == {"in_multiple_optimizers"}
    assert v["<optimizer 0 group 1 #2>"] == {"not_in_model", "unused"}
    assert v["embed.weight"] == v["body.weight"] == {"ok"}
    used = dict(zip(diag.params["name"], diag.params["used_steps"]))
    assert used["embed.weight"] == 1 and used["dead.weight"] == 0 and used["frozen.weight"] == 0
    # bytes per verdict come from the meta tensors' shapes: 8x8 float32 + 8
    dead = [f for f in diag.findings if f.code == "unused"][0]
    assert dead.bytes == (64 + 8) * 4
    fup = diag.advice["find_unused_parameters"]
    assert fup["value"] is True and fup["unused_bytes"] == (64 + 8) * 4


def test_value_verdicts_are_not_measured_and_never_fire(wired):
    """A real run of this setup would call the orphan `grad_not_cleared` and the lr-0 `body`
    `stalled`; on meta neither rule runs, and the result says so."""
    _, _, diag = wired
    fired = {x for vs in diag.params["verdicts"] for x in vs}
    assert not fired & VALUE_VERDICTS
    assert set(diag.meta["not_measured"]) == VALUE_VERDICTS
    assert diag.meta["not_measured"]["stalled"] == "needs values"
    assert diag.meta["not_measured"]["intermittent"] == "needs more than one step"
    assert diag.params["changed_steps"].isna().all() and diag.params["grad_norm"].isna().all()
    text = " ".join(render_findings(diag).split())  # unwrapped
    assert "one meta pass (no values)" in text and "not measured on meta" in text
    assert "stalled (needs values)" in text
    assert "by verdict: in_multiple_optimizers 2 tensors 288 B; orphan 1 tensor 32 B" in text
    payload = json.loads(json.dumps(diag.to_json_dict(), default=str))
    assert payload["meta"]["device"] == "meta"
    assert set(payload["meta"]["not_measured"]) == VALUE_VERDICTS
    assert "not measured on meta: intermittent" in diagnosis_html(diag)


def test_hooks_are_removed_and_grads_put_back(wired):
    model, opts, _ = wired
    for p in list(model.parameters()) + [p for o in opts for g in o.param_groups
                                         for p in g["params"]]:
        assert p.grad is None
        assert not getattr(p, "_post_accumulate_grad_hooks", None)
        assert p.device.type == "meta"
    assert all(not o.state for o in opts)  # no optimizer step ran


def test_a_model_not_on_meta_is_refused_in_one_line():
    model = nn.Linear(3, 3)
    before = model.weight.detach().clone()
    with pytest.raises(DiagkitError) as err:
        diagnose(model, torch.optim.SGD(model.parameters(), lr=0.1),
                 batch_fn=lambda: torch.ones(2, 3), loss_fn=sum_loss, device="meta")
    assert "\n" not in str(err.value)
    assert "needs a model built on the meta device" in str(err.value)
    assert "2 tensors are on cpu" in str(err.value)
    assert torch.equal(model.weight, before)  # never moved


@pytest.mark.parametrize("device", ["cuda", "cpu", 1])
def test_another_device_is_refused(device):
    with torch.device("meta"):
        model = nn.Linear(3, 3)
    with pytest.raises(DiagkitError, match="device must be None .* or 'meta'"):
        diagnose(model, torch.optim.SGD(model.parameters(), lr=0.1),
                 batch_fn=lambda: torch.ones(2, 3), loss_fn=sum_loss, device=device)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.proj = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids, features):
        return self.head(self.embed(ids).mean(1) + self.proj(features))


def _classifier():
    with torch.device("meta"):
        model = Classifier()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_integer_ids_stay_real_and_floats_go_to_meta():
    model, opt = _classifier()
    seen = {}

    def loss_fn(m, b):
        seen.update({k: v.device.type for k, v in b.items()})
        return m(b["ids"], b["features"]).sum()

    diag = diagnose(model, opt, batch_fn=lambda: {"ids": torch.randint(0, 10, (2, 5)),
                                                  "features": torch.randn(2, 4)},
                    loss_fn=loss_fn, device="meta")
    assert seen == {"ids": "cpu", "features": "meta"}
    assert diag.meta["batch_on_meta"] == "floats" and diag.failure is None
    assert set(diag.params["used_steps"]) == {1}


def test_cpu_labels_in_a_meta_loss_move_to_meta_too():
    """cross_entropy of meta logits with CPU labels is a device mismatch: the pass is run once
    more with every tensor of the batch on meta."""
    model, opt = _classifier()
    diag = diagnose(model, opt, batch_fn=lambda: (torch.randint(0, 10, (2, 5)),
                                                  torch.randn(2, 4), torch.tensor([0, 2])),
                    loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), device="meta")
    assert diag.failure is None and diag.meta["batch_on_meta"] == "all"
    assert set(diag.params["used_steps"]) == {1}


def test_a_step_that_reads_a_value_is_a_one_line_failure():
    model, opt = _classifier()

    def loss_fn(m, b):
        loss = m(b, torch.ones(2, 4)).sum()
        if loss.item() > 0:  # a value: impossible on meta
            return loss
        return loss * 2
    diag = diagnose(model, opt, batch_fn=ids_batch, loss_fn=loss_fn, device="meta")
    assert diag.failure is not None and diag.failure.step == 0
    assert "meta" in diag.failure.error and "reads a value" in diag.failure.error
    assert "\n" not in diag.failure.error


def test_a_train_step_target_runs_once_on_meta():
    model, opt = _classifier()
    calls = []

    def train_step(i):
        calls.append(i)
        opt.zero_grad()
        model(torch.randint(0, 10, (2, 5)), torch.randn(2, 4)).sum().backward()
    diag = diagnose(model, opt, train_step=train_step, device="meta")
    assert calls == [0] and diag.failure is None
    assert set(diag.params["used_steps"]) == {1} and diag.meta["loop"] == "train_step"


BIG = textwrap.dedent('''
    import resource, sys, torch
    from torch import nn
    from diagkit.run.diagnose.api import diagnose

    def rss_mib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(16384, 16384) for _ in range(8)])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = sum(p.numel() for p in model.parameters())
    before = rss_mib()
    diag = diagnose(model, opt, batch_fn=lambda: torch.randn(1, 16384),
                    loss_fn=lambda m, b: m(b).sum(), device="meta")
    assert diag.failure is None, diag.failure
    print(params, int(diag.params["bytes"].sum()), before, rss_mib())
    print(sorted({"transformers", "peft"} & set(sys.modules)) or "none")
''')


def test_a_2b_parameter_model_costs_no_parameter_memory():
    """8.6 GB of float32 parameters (more than this machine can spare): the peak RSS of the
    process grows by under 100 MiB through the whole dry run; transformers and peft are never
    imported."""
    out = subprocess.run([sys.executable, "-c", BIG], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    params, size, before, after = int(out[0]), int(out[1]), float(out[2]), float(out[3])
    assert params > 2.1e9 and size == params * 4
    assert after - before < 100, (before, after)
    assert out[4] == "none"  # the core (and its meta path) never imports the optional extras


def test_the_notebook_runs_a_target_on_meta():
    """The notebook's `meta` parameter: checked as a bool, and its run is the dry run."""
    pytest.importorskip("peft")
    from diagkit.run.workbook import notebook
    with pytest.raises(DiagkitError, match="notebook parameter 'meta' must be bool"):
        notebook.validate({"meta": "yes"})
    settings = notebook.validate({"target": "diagkit.demos.llama_lora:llama_lora",
                                  "target_args": {"size": "tiny"}, "meta": True})
    diag, _ = notebook.run(settings)
    assert diag.meta["device"] == "meta" and "stalled" in diag.meta["not_measured"]
    assert {f.code for f in diag.findings} >= {"orphan", "frozen_in_optimizer"}
    with pytest.raises(DiagkitError, match="cannot be combined with nproc 2"):
        notebook.run({**settings, "nproc": 2})
