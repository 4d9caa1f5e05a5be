"""`rank_divergent` names the cause it saw (issue 21, section 5), in a real torchrun job (gloo,
2 ranks) that watches five ordinary DDP mistakes one after the other: a backbone unfrozen after
DDP was built, a model converted (`.double().float()`) after it, a parameter replaced after it,
a loop that bypasses the wrapper on some steps, and a model never wrapped at all. Only the
first says "unfrozen after wrapping"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import diagkit
from jobs import finished

ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}

JOB = textwrap.dedent('''
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    import diagkit

    def job(mode):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        if mode == "unfreeze":
            model[0].requires_grad_(False)
        ddp = DDP(model, find_unused_parameters=(mode == "replace")) if mode != "bare" else model
        if mode == "unfreeze":
            model[0].requires_grad_(True)
        elif mode == "convert":
            model.double().float()
        elif mode == "replace":
            model[0].weight = nn.Parameter(model[0].weight.detach().clone())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        watch = diagkit.watch(ddp, opt, steps=3, out=mode, timeout=30)
        g = torch.Generator().manual_seed(100 + dist.get_rank())  # each rank its own data
        for step in range(3):
            net = model if mode == "bypass" and step == 1 else ddp
            loss = net(torch.randn(16, 4, generator=g)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        watch.stop()

    dist.init_process_group("gloo")
    for mode in sys.argv[1:]:
        job(mode)
    dist.destroy_process_group()
''')
MODES = ("unfreeze", "convert", "replace", "bypass", "bare")


@pytest.fixture(scope="module")
def diagnoses(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rank_causes")
    (folder / "job.py").write_text(JOB)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "--max-restarts=0", "job.py", *MODES],
                          cwd=folder, env=ENV, capture_output=True, text=True, timeout=300)
    assert finished(done.returncode, done.stdout + done.stderr), done.stderr[-4000:]
    return {mode: diagkit.load(folder / mode) for mode in MODES}


def divergent(diag):
    (finding,) = [f for f in diag.findings if f.code == "rank_divergent"]
    return finding


def test_unfrozen_after_wrapping_says_so(diagnoses):
    f = divergent(diagnoses["unfreeze"])
    assert f.params == ("0.weight", "0.bias")
    assert "DDP was built when 2 of its tensors required grad and 4 do now" in f.message
    assert "unfrozen after DDP was built" in f.message
    assert "requires_grad before DistributedDataParallel(model)" in f.fix


def test_converted_after_wrapping_names_the_replaced_storage(diagnoses):
    f = divergent(diagnoses["convert"])
    assert len(f.params) == 4  # the whole model lost DDP's hooks
    assert "storage was replaced after DDP was built" in f.message
    assert ".double().float()" in f.message and "unfrozen" not in f.message
    assert "Convert the model (dtype, device) before" in f.fix


def test_a_parameter_replaced_after_wrapping_is_named(diagnoses):
    diag = diagnoses["replace"]
    assert diag.verdicts()["0.weight"] == {"rank_divergent"}
    assert diag.verdicts()["0.bias"] == {"ok"}  # still the tensor DDP averages
    f = divergent(diag)
    assert f.params == ("0.weight",)
    assert "`0.weight` is not the tensor DDP was built with" in f.message
    assert "unfrozen" not in f.message
    assert "Replace parameters before DistributedDataParallel(model)" in f.fix


def test_a_step_that_bypasses_the_wrapper_is_named(diagnoses):
    f = divergent(diagnoses["bypass"])
    assert "averaged across ranks on steps 0, 2 but not on step 1" in f.message
    assert "unfrozen" not in f.message
    assert "through the DDP-wrapped model" in f.fix


def test_a_model_never_wrapped_is_named(diagnoses):
    diag = diagnoses["bare"]
    assert diag.meta["wrappers"] == []
    f = divergent(diag)
    assert "not wrapped in DistributedDataParallel (it was given as the bare module)" \
        in f.message
    assert "unfrozen" not in f.message
