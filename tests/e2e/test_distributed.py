"""Real torch.distributed runs: torchrun, 2 processes, gloo on this CPU.

The demos whose ranks all end together (forward_arg, rank_branch, ddp_strict) share one
torchrun job (`tests/helpers/ranks_one_job.py`: each is the real `diagnose_distributed` call,
its ranks those of the shared job); the CLI's run and the faults of the launcher's own (a rank that
hangs, raises or dies alone) keep a job each."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagkit.run.diagnose.launcher import diagnose_distributed
from jobs import JOB_MARKER, carrying, marked_here
from ranks_one_job import diagnose_together

DIAGKIT = str(Path(sys.executable).parent / "diagkit")
MEM = "module.metamodel.model.mem_tokens"


def workers_alive(tag: str) -> list[int]:
    """This run's processes still alive: those that carry its marker (`jobs.marked_here`),
    which torchrun and each rank inherit; another run's ranks on the machine are not ours."""
    return sorted(carrying(JOB_MARKER, tag))


def test_workers_alive_sees_only_its_own_runs_ranks():
    """Another run's rank on the machine (another test, another user's job) is not ours."""
    rank = [sys.executable, "-c", "import time; time.sleep(120)", "-m", "diagkit.run.diagnose.worker"]
    other = subprocess.Popen(rank)
    try:
        with marked_here() as tag:
            assert workers_alive(tag) == []
            mine = subprocess.Popen(rank, start_new_session=True)
            # until it has exec'd, /proc shows the environment this process started with
            # (without the marker): on a loaded machine that takes a moment
            deadline = time.monotonic() + 15
            while workers_alive(tag) != [mine.pid] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert workers_alive(tag) == [mine.pid]
        assert mine.wait(timeout=10) == -9 and other.poll() is None
    finally:
        other.kill()
        other.wait()


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One `diagkit check --nproc 2` of meta_memory, saved: the CLI's exit code and --json, and
    the library's result of the same run (`--save`, loaded), share one torchrun job."""
    out = tmp_path_factory.mktemp("nproc2")
    (out / "tmp").mkdir()  # its temporary folder: left clean (torchrun's own folder included)
    started = time.monotonic()
    run = subprocess.run([DIAGKIT, "check", "diagkit.demos:meta_memory", "--nproc", "2",
                          "--steps", "4", "--json", str(out / "out.json"), "--save",
                          str(out / "diag")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TMPDIR": str(out / "tmp")})
    return run, time.monotonic() - started, out


@pytest.fixture(scope="module")
def meta2(cli_run):
    import diagkit
    run, _, out = cli_run
    assert (out / "diag").is_dir(), run.stderr[-3000:]
    return diagkit.load(out / "diag")


def test_meta_memory_under_ddp_names_the_wrapped_orphan(meta2):
    assert meta2.verdicts()[MEM] == {"orphan", "grad_not_cleared"}
    assert meta2.failure is None
    assert set(meta2.steps["rank"]) == {0, 1}
    for rank in (0, 1):  # the same rising .grad on both ranks
        rows = meta2.steps[(meta2.steps["name"] == MEM) & (meta2.steps["rank"] == rank)]
        norms = rows["grad_total_norm"].tolist()
        assert len(norms) == 4 and all(b > a for a, b in zip(norms, norms[1:]))
    others = {n: v for n, v in meta2.verdicts().items() if n != MEM}
    assert set().union(*others.values()) == {"ok"}
    assert meta2.meta["backend"] == "gloo" and meta2.meta["world_size"] == 2
    assert meta2.advice["find_unused_parameters"]["ddp"]["unused_parameter_size"] == 0


def test_cli_nproc_2_exits_1_and_writes_json(cli_run):
    run, seconds, out = cli_run
    assert run.returncode == 1, run.stderr
    assert seconds < 60
    # nothing left in the temporary folder but torch's own compile cache, kept by design
    assert [p.name for p in (out / "tmp").iterdir()
            if not p.name.startswith("torchinductor_")] == []
    params = json.loads((out / "out.json").read_text())["params"]
    assert {"orphan", "grad_not_cleared"} == set(next(p for p in params if p["name"] == MEM)
                                                 ["verdicts"])


@pytest.fixture(scope="module")
def demos():
    """diagnose_distributed("diagkit.demos:NAME", nproc=2, steps=3) of three demos, in one
    job; ddp_strict, whose step fails on both ranks, last."""
    return diagnose_together({name: dict(target=f"diagkit.demos:{name}", steps=3)
                              for name in ("forward_arg", "rank_branch", "ddp_strict")})


def demo_run(demos, name):
    """One demo's Diagnosis, as `diagnose_distributed` returned it (its error raised)."""
    if isinstance(demos[name], BaseException):
        raise demos[name]
    return demos[name]


def test_forward_argument_tensor_diverges_between_ranks(demos):
    diag = demo_run(demos, "forward_arg")
    free = [n for n, v in diag.verdicts().items() if "rank_divergent" in v]
    assert len(free) == 1 and free[0].startswith("<optimizer")
    assert "not_in_model" in diag.verdicts()[free[0]]
    synced = diag.steps[~diag.steps["name"].isin(free)]
    spread = synced.groupby(["step", "name"])["checksum"].nunique()
    assert (spread == 1).all()  # DDP keeps every model tensor identical across ranks


def test_rank_dependent_branch(demos):
    diag = demo_run(demos, "rank_branch")
    flagged = {n for n, v in diag.verdicts().items() if "rank_dependent_use" in v}
    assert flagged and all("aux" in n for n in flagged)
    used = diag.steps[diag.steps["name"].isin(flagged)].groupby("rank")["used"].any()
    assert not used[0] and used[1]
    assert diag.advice["find_unused_parameters"]["value"] is True


def test_user_ddp_without_find_unused_is_a_finding_not_a_crash(demos):
    diag = demo_run(demos, "ddp_strict")
    assert diag.failure is not None and "Expected to have finished reduction" in diag.failure.error
    finding = diag.findings[0]
    assert finding.code == "ddp_unused_parameters" and finding.severity == "error"
    assert finding.params and all("head" in n for n in finding.params)
    assert diag.meta["steps_observed"] >= 1  # the steps before the error are kept


def test_a_hung_rank_ends_with_a_timeout_naming_it():
    started = time.monotonic()
    with marked_here() as tag:
        diag = diagnose_distributed("diagkit.demos:hang", nproc=2, steps=4, timeout=25,
                                    measure_cost=False)
        alive = workers_alive(tag)
    assert time.monotonic() - started < 60
    assert "timed out after 25 s" in diag.failure.error
    assert "rank 1 is the one that stopped" in diag.failure.error
    assert diag.meta["steps_observed"] >= 1
    assert alive == []  # no rank outlives the run


def test_a_crashing_rank_is_named():
    with marked_here() as tag:
        diag = diagnose_distributed("diagkit.demos:crash", nproc=2, steps=4,
                                    measure_cost=False)
        alive = workers_alive(tag)
    assert diag.failure is not None
    assert "rank 1" in diag.failure.error and "crashed on purpose" in diag.failure.error
    assert any(f.code == "step_failed" for f in diag.findings)
    assert alive == []


def test_bad_target_fails_before_launch(tmp_path):
    run = subprocess.run([DIAGKIT, "check", "no.such.module:f", "--nproc", "2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().startswith("diagkit: error: no module named")


DIES = '''
import os
import torch
import torch.distributed as dist
from diagkit.demos.wired import clean

def build():
    setup = clean(steps=4)
    loss_fn, calls = setup["loss_fn"], []

    def dying_loss(model, batch):
        calls.append(1)
        if dist.is_initialized() and dist.get_rank() == 1 and len(calls) == 2:
            os._exit(7)  # the rank's process dies without a word
        return loss_fn(model, batch)

    return {**setup, "loss_fn": dying_loss}
'''


def test_a_dying_rank_is_named(tmp_path):
    (tmp_path / "dies.py").write_text(DIES)
    started = time.monotonic()
    with marked_here() as tag:
        diag = diagnose_distributed(f"{tmp_path / 'dies.py'}:build", nproc=2, steps=4,
                                    timeout=40, measure_cost=False)
        alive = workers_alive(tag)
    assert time.monotonic() - started < 60
    assert diag.failure is not None and "rank 1" in diag.failure.error
    assert diag.meta["steps_observed"] >= 1
    assert alive == []
