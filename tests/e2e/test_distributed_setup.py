"""Under `--nproc`, a target's setup is honoured as in one process (real torchrun, gloo, 2 ranks):
its own `steps`, a batch source that yields exactly that many batches (diagkit's cost timing
draws no more), sibling imports of a file target, and a `loss_fn` that gets the model the
target returned (a Lightning-style `model.training_step(batch)`), with DDP still averaging.

The runs that end well share one torchrun job (`tests/helpers/ranks_one_job.py`: each is the real
`diagnose_distributed` call, its ranks those of the shared job); the faults below, which are
the launcher's own (a rank that fails or hangs alone), keep a job each."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from diagkit import DiagkitError
from diagkit.run.diagnose.launcher import diagnose_distributed
from ranks_one_job import diagnose_together

DIAGKIT = str(Path(sys.executable).parent / "diagkit")

HELPERS = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    def rank_batches(n, seed=1):
        """n regression batches, different on each rank (so unsynced gradients would show)."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        gen = torch.Generator().manual_seed(seed + rank)
        return [(torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen))
                for _ in range(n)]

    def mse(model, batch):
        x, y = batch
        return F.mse_loss(model(x), y)
''')

# A loader of exactly `batches` batches: a list indexed until IndexError, or an iterator
# until StopIteration. The model is the target's own (diagkit wraps it in DDP).
EXACT = textwrap.dedent('''
    import torch
    from torch import nn
    from helpers import mse, rank_batches      # beside this file

    def build(steps=3, batches=3, source="list"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        data = rank_batches(batches)
        if source == "list":
            drawn = [0]
            def batch_fn():
                batch = data[drawn[0]]         # IndexError past the last batch
                drawn[0] += 1
                return batch
        else:
            batch_fn = iter(data).__next__     # StopIteration past the last batch
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "batch_fn": batch_fn, "loss_fn": mse, "steps": steps}

    def build_one_shot(steps=3):
        """Each batch is a one-shot iterator that loss_fn consumes: a replayed one is empty."""
        setup = build(steps, batches=steps, source="iter")
        batches = setup["batch_fn"]
        return {**setup, "batch_fn": lambda: iter([batches()]),
                "loss_fn": lambda model, once: mse(model, next(once))}
''')

# Lightning-style: loss_fn calls model.training_step, which calls the submodules directly.
# The optimizer is built from the names this code sees, and leaves `memory` out: an orphan.
LIGHTNING = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn
    from helpers import rank_batches

    class Lit(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 16)
            self.head = nn.Linear(16, 2)
            self.memory = nn.Parameter(torch.zeros(16))

        def training_step(self, batch):
            x, y = batch
            return F.mse_loss(self.head(torch.tanh(self.body(x) + self.memory)), y)

    def build(steps=3):
        torch.manual_seed(0)
        model = Lit()
        held = [p for n, p in model.named_parameters() if not n.startswith("memory")]
        batches = iter(rank_batches(100))
        return {"model": model, "optimizer": torch.optim.SGD(held, lr=0.1),
                "batch_fn": batches.__next__,
                "loss_fn": lambda model, batch: model.training_step(batch), "steps": steps}
''')

# `scale` is frozen when DDP is built and made trainable by loss_fn at step 1: DDP never
# averages its gradient, so with rank-dependent batches its copies drift apart.
UNFREEZE = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn
    from helpers import rank_batches

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(8, 2)
            self.scale = nn.Parameter(torch.ones(2), requires_grad=False)

        def forward(self, x):
            return self.body(x) * self.scale

    def build(steps=3):
        torch.manual_seed(0)
        model = Scaled()
        calls = [0]

        def loss_fn(model, batch):
            if calls[0] == 1:
                model.scale.requires_grad_(True)   # unfrozen after DDP was built
            calls[0] += 1
            x, y = batch
            return F.mse_loss(model(x), y)

        batches = iter(rank_batches(100))
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "batch_fn": batches.__next__, "loss_fn": loss_fn, "steps": steps}
''')


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("targets")
    for name, text in {"helpers": HELPERS, "exact": EXACT, "lightning": LIGHTNING,
                       "unfreeze": UNFREEZE}.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def _clean_run(diag):
    """No failure of any kind, every tensor ok, and the find_unused cost was measured."""
    assert diag.failure is None
    assert not [f for f in diag.findings if f.severity == "error"], diag.findings
    assert set().union(*diag.verdicts().values()) == {"ok"}
    cost = diag.advice["find_unused_parameters"]["measured_cost"]
    assert cost["seconds_per_step_true"] > 0 and cost["seconds_per_step_false"] > 0


@pytest.fixture(scope="module")
def runs(targets):
    """The five runs below, in one torchrun job: {name: Diagnosis (or the error raised)}."""
    exact, lightning, unfreeze = (f"{targets / name}.py:build"
                                  for name in ("exact", "lightning", "unfreeze"))
    return diagnose_together({
        "list": dict(target=exact),
        "iter": dict(target=exact, target_args={"source": "iter", "batches": 2}, steps=2),
        "one_shot": dict(target=f"{targets / 'exact.py'}:build_one_shot"),
        "lightning": dict(target=lightning),
        "unfreeze": dict(target=unfreeze)})


def run_of(runs, name):
    """One run's Diagnosis, as `diagnose_distributed` returned it (its error raised)."""
    if isinstance(runs[name], BaseException):
        raise runs[name]
    return runs[name]


def test_the_targets_steps_and_an_exactly_sized_list_loader(runs):
    """No --steps: the target's 3 steps run, from a list of exactly 3 batches; timing the
    find_unused cost draws none (it replays), so nothing raises IndexError."""
    diag = run_of(runs, "list")
    assert diag.meta["steps_requested"] == 3 and diag.meta["steps_observed"] == 3
    _clean_run(diag)


def test_an_explicit_steps_overrides_the_target_and_an_exact_iterator(runs):
    """steps=2 overrides the target's 3; an iterator of exactly 2 batches is enough."""
    diag = run_of(runs, "iter")
    assert diag.meta["steps_requested"] == 2 and diag.meta["steps_observed"] == 2
    _clean_run(diag)


def test_a_failing_cost_timing_leaves_the_cost_out_and_the_diagnosis_whole(runs):
    """Replaying a consumed batch raises inside diagkit's timing: no cost, no failure."""
    diag = run_of(runs, "one_shot")
    assert diag.failure is None and diag.meta["steps_observed"] == 3
    assert not [f for f in diag.findings if f.severity == "error"], diag.findings
    assert "measured_cost" not in diag.advice["find_unused_parameters"]


def test_loss_fn_gets_the_targets_model_and_ddp_still_averages(runs):
    diag = run_of(runs, "lightning")
    assert diag.failure is None, diag.failure
    verdicts = diag.verdicts()
    # the names the target's code saw: no `module.` prefix of diagkit's own wrapper
    assert set(verdicts) == {"body.weight", "body.bias", "head.weight", "head.bias", "memory"}
    assert verdicts["memory"] == {"orphan", "grad_not_cleared"}
    # Different batches on each rank, yet equal values: DDP averaged every gradient, so the
    # forward ran inside DDP's forward although loss_fn called model.training_step.
    assert all(v == {"ok"} for n, v in verdicts.items() if n != "memory")
    assert (diag.steps.groupby(["step", "name"])["checksum"].nunique() == 1).all()
    (orphan,) = [f for f in diag.findings if f.code == "orphan"]
    # the filter saw unwrapped names: the `module.` prefix is not blamed
    assert "module." not in orphan.message + orphan.fix
    assert "pile up" in orphan.message and "→" in orphan.message
    assert "model.memory" in orphan.fix


def test_a_tensor_unfrozen_after_ddp_was_built_is_named_with_the_cause(runs):
    diag = run_of(runs, "unfreeze")
    assert diag.failure is None, diag.failure
    assert "rank_divergent" in diag.verdicts()["scale"]
    assert "rank_divergent" not in diag.verdicts()["body.weight"]
    (finding,) = [f for f in diag.findings if f.code == "rank_divergent"]
    assert finding.params == ("scale",)
    assert "requires_grad changed during the run (`scale` False → True at step 1)" \
        in finding.message
    assert "after DDP was built" in finding.message
    assert "re-create DDP" in finding.fix and "requires_grad before" in finding.fix


@pytest.mark.parametrize("steps", [0, -1, True, 2.5])
def test_a_bad_steps_is_one_line_before_any_rank_starts(targets, steps):
    """Formerly `steps or 5` turned 0 into 5; now a bad value is refused up front."""
    with pytest.raises(DiagkitError, match=r"^steps must be a positive int"):
        diagnose_distributed(f"{targets / 'exact.py'}:build", nproc=2, steps=steps)


# ------------------------------------------------------------------ faults that mislead (#21)
# Rank 1 fails (or hangs) on its own while building, importing, or in FSDP2's shard combine;
# rank 0 only loses its peer. Each rank writes its pid to PIDS, so that the test can check that
# none of this run's ranks outlives it (torchrun starts each rank in a session of its own).
FAULTS = textwrap.dedent('''
    import os, pathlib, threading
    import torch.distributed as dist

    HERE = pathlib.Path(__file__).parent
    if os.environ.get("RANK") == "1" and (HERE / "HANG_AT_IMPORT").exists():
        (HERE / "pids").mkdir(exist_ok=True)
        (HERE / "pids" / "rank1").write_text(str(os.getpid()))
        threading.Event().wait()           # rank 1 never finishes importing this file

    def _pid():
        (HERE / "pids").mkdir(exist_ok=True)
        (HERE / "pids" / f"rank{dist.get_rank()}").write_text(str(os.getpid()))

    def build(fault="raise"):
        from diagkit.demos.wired import clean
        _pid()
        if dist.get_rank() == 1:
            if fault == "hang":
                threading.Event().wait()       # nobody ever sets it
            raise ValueError("rank one cannot build its model")
        return clean(steps=2)
''')


@pytest.fixture()
def faults(tmp_path):
    (tmp_path / "faults.py").write_text(FAULTS)
    return tmp_path


def ranks_left(folder) -> list[int]:
    """The pids this run's ranks wrote that still run a diagkit rank."""
    alive = []
    for file in (folder / "pids").glob("rank*"):
        pid = int(file.read_text())
        try:
            if b"diagkit.run.diagnose.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                alive.append(pid)
        except OSError:
            continue
    return alive


def test_a_rank_that_raises_while_building_is_named_not_the_peer_that_lost_it(faults):
    """Rank 0 gets gloo's "Connection closed by peer" once rank 1 is gone: the line names
    rank 1 and its own error, whatever the rank numbers."""
    run = subprocess.run([DIAGKIT, "check", "faults.py:build", "--nproc", "2"], cwd=faults,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("diagkit: error: rank 1 failed: target 'faults.py:build' raised "
                           "while building the setup: ValueError: rank one cannot build its "
                           "model"), line
    assert "rank 0 failed" not in line and "Connection closed" not in line, line
    assert ranks_left(faults) == []


def test_a_rank_that_hangs_while_building_is_the_one_the_others_waited_for(faults):
    started = time.monotonic()
    with pytest.raises(DiagkitError) as caught:
        diagnose_distributed(f"{faults / 'faults.py'}:build", {"fault": "hang"}, nproc=2,
                             timeout=25)
    assert time.monotonic() - started < 120
    text = str(caught.value)
    assert text.startswith("timed out after 25 s: "), text
    assert "rank 0 had built the target and was waiting for the others" in text, text
    assert "rank 1 stopped while building the target" in text, text
    assert "rank 1 is the one that stopped (the others waited for it)" in text, text
    assert ranks_left(faults) == []


# Rank 1's all-reduce of FSDP2's shard combine (inside the observer's end_step) fails at
# step 1, and its process lingers after that (a producer thread of the target's that is no
# daemon): rank 0 only loses its peer, and torchrun would wait for rank 1 until --timeout.
COMBINE = textwrap.dedent('''
    import os, pathlib, sys, threading, time
    import torch
    import torch.distributed as dist

    HERE = pathlib.Path(__file__).parent
    sys.path.insert(0, os.environ["DIAGKIT_EXAMPLES"])
    from fsdp2_job import build as sharded

    def build():
        setup = sharded(steps=3)
        (HERE / "pids").mkdir(exist_ok=True)
        (HERE / "pids" / f"rank{dist.get_rank()}").write_text(str(os.getpid()))
        if dist.get_rank() == 1:
            real, stepped = dist.all_reduce, []
            setup["optimizer"].register_step_post_hook(lambda *_: stepped.append(1))

            def all_reduce(tensor, *args, **kwargs):
                # the shard combine's vector, at the end of step 1 (its optimizer step done)
                if tensor.dtype == torch.float64 and tensor.dim() == 2 and len(stepped) == 2:
                    raise RuntimeError("rank 1's combine failed on purpose")
                return real(tensor, *args, **kwargs)

            dist.all_reduce = all_reduce
            threading.Thread(target=time.sleep, args=(600,), daemon=False).start()
        return setup
''')


def test_a_rank_failing_in_the_fsdp2_shard_combine_is_named_and_ends_the_run(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("DIAGKIT_EXAMPLES", str(Path(__file__).resolve().parents[2] / "examples"))
    (tmp_path / "combine.py").write_text(COMBINE)
    started = time.monotonic()
    diag = diagnose_distributed(f"{tmp_path / 'combine.py'}:build", nproc=2, timeout=100)
    assert time.monotonic() - started < 80  # not the --timeout: the report ends it
    assert diag.failure.step == 1 and diag.meta["steps_observed"] == 1
    assert diag.failure.error.startswith("rank 1 failed in step 1"), diag.failure.error
    assert "RuntimeError: rank 1's combine failed on purpose" in diag.failure.error
    assert "rank 0 failed" not in diag.failure.error
    assert ranks_left(tmp_path) == []


def test_a_rank_that_hangs_while_importing_the_target_is_named_with_the_phase(faults):
    """Only rank 1 hangs at import (the launcher's own check of the target imports fine)."""
    (faults / "HANG_AT_IMPORT").touch()
    with pytest.raises(DiagkitError) as caught:
        diagnose_distributed(f"{faults / 'faults.py'}:build", nproc=2, timeout=25)
    text = str(caught.value)
    assert "rank 1 stopped while importing the target" in text, text
    assert "rank 0 had built the target and was waiting for the others" in text, text
    assert "rank 1 is the one that stopped" in text, text
    assert ranks_left(faults) == []
