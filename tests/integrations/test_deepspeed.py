"""DeepSpeed ZeRO 1, 2 and 3 observed exactly, under a real torchrun of 2 processes
(DS_ACCELERATOR=cpu: gloo; docs/distributed.md, "Engines: what is observed, what is refused").

Each stage runs a planted orphan (`head2`, trained by the loss, in no optimizer group) watched
as the engine, and its clean twin watched as `engine.module` + ZeRO's optimizer. The oracle is
the same model, data and bug without DeepSpeed (DDP, already proven against brute force): every
measured gradient and change norm must match it, and so must the static facts (shapes, lr,
weight decay), although under ZeRO-3 each rank holds only a slice of each tensor. The torch
optimizer ZeRO wraps (which holds flat partitions) is refused in one line. One job runs them
all, to keep the test short."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from jobs import same_norm, torchrun_program

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0",
       "PYTHONPATH": os.pathsep.join(map(str, (ROOT / "src", ROOT / "tests" / "helpers")))}
STEPS = 3

PROGRAM = textwrap.dedent('''
    import json, sys
    import torch, torch.distributed as dist
    import deepspeed
    import diagkit

    STEPS = int(sys.argv[2])

    from models import TwoHeads as Net, rank_batches, two_heads_groups, watched_under_ddp

    def groups(model, planted):
        return two_heads_groups(dict(model.named_parameters()), planted)

    def batches(n):
        return rank_batches(n, dist.get_rank())

    def summary(w):
        d = w.diagnosis
        if d is None:
            return None
        cols = ["name", "shape", "placement", "lr", "weight_decay", "optimizer", "group"]
        return {"verdicts": {k: sorted(v) for k, v in d.verdicts().items()},
                "errors": sorted({f.code for f in d.findings if f.severity == "error"}),
                "fixes": [f.fix for f in d.findings if f.code == "orphan"],
                "unused_advice": d.advice["find_unused_parameters"]["recommendation"],
                "params": d.params[cols].astype(str).values.tolist(),
                "steps": {f"{r.step} {r.name}": [r.grad_norm, r.delta_norm]
                          for r in d.steps.itertuples()}}

    def engine_of(stage, planted, **zero):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.Adam(groups(model, planted), lr=0.01)
        config = {"train_micro_batch_size_per_gpu": 4, "zero_allow_untested_optimizer": True,
                  "gradient_accumulation_steps": zero.pop("accumulate", 1),
                  "zero_optimization": {"stage": stage, **zero}}
        engine, zero_opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
        return engine, zero_opt, opt

    dist.init_process_group("gloo")
    out = {}
    for planted in (True, False):  # the same model and bug without DeepSpeed: the oracle
        out[f"ddp {planted}"] = summary(watched_under_ddp(planted, STEPS))
    for stage in (1, 2, 3):
        for planted in (True, False):
            # under ZeRO-3 every tensor partitioned, none kept whole for being small; the
            # gradients copied into small buckets and freed inside the backward (overlap_comm)
            engine, zero, opt = engine_of(stage, planted, stage3_param_persistence_threshold=0,
                                          overlap_comm=stage > 1, reduce_bucket_size=16)
            if planted:
                try:
                    diagkit.watch(engine.module, opt, steps=STEPS)
                    out[f"{stage} torch"] = "judged"
                except diagkit.DiagkitError as exc:
                    out[f"{stage} torch"] = "refused: " + str(exc)
            w = (diagkit.watch(engine, steps=STEPS) if planted
                 else diagkit.watch(engine.module, engine.optimizer, steps=STEPS))
            for x in batches(STEPS):
                engine.backward(engine(x))
                engine.step()
            out[f"{stage} {planted}"] = summary(w)
            out[f"{stage} {planted} own step back"] = "step" not in vars(zero)
    # One step per optimizer step: 2 micro-batches each, and ZeRO-3's optimizer stepping its
    # torch optimizer once per sub-group (16 elements: several per step).
    engine, _, _ = engine_of(3, True, accumulate=2, sub_group_size=16,
                             stage3_param_persistence_threshold=0)
    w = diagkit.watch(engine, steps=2)
    done_after = None
    for i, x in enumerate(batches(6)):
        engine.backward(engine(x))
        engine.step()
        if done_after is None and w.done:
            done_after = i + 1
    d = w.diagnosis
    out["accumulated"] = {"done_after": done_after,
                          "steps": None if d is None else sorted(set(d.steps["step"]))}
    # fp16 under ZeRO-2, its loss scaler skipping step 1 (an overflow, forced): a step that
    # still counts, with its tensors `skipped`, never `stalled`. DeepSpeed's CPU accelerator
    # has fp16 only where oneDNN does on this CPU (some hosts of the same kind lack it).
    from deepspeed.accelerator import get_accelerator
    if not get_accelerator().is_fp16_supported():
        out["fp16"] = "unsupported"
        if dist.get_rank() == 0:
            json.dump(out, open(sys.argv[1], "w"))
        dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
        dist.destroy_process_group()
        sys.exit(0)
    torch.manual_seed(0)
    model = Net()
    config = {"train_micro_batch_size_per_gpu": 4, "zero_allow_untested_optimizer": True,
              "fp16": {"enabled": True, "initial_scale_power": 4},  # no overflow but ours
              "zero_optimization": {"stage": 2}}
    engine, zero, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), config=config)
    w = diagkit.watch(engine, steps=3)
    for i, x in enumerate(batches(3)):
        loss = engine(x.half()).float() * (1e30 if i == 1 else 1.0)
        engine.backward(loss)
        engine.step()
    d = w.diagnosis
    if d is not None:
        s = d.steps
        out["fp16"] = {"verdicts": sorted({v for vs in d.verdicts().values() for v in vs}),
                       "skipped_steps": sorted(set(s.loc[s["skipped"].astype(bool), "step"])),
                       "all_skipped_at_1": bool(s.loc[s["step"] == 1, "skipped"].all()),
                       "changed_at_1": bool(s.loc[s["step"] == 1, "changed"].any()),
                       "skipped_optimizer_steps": d.meta["skipped_optimizer_steps"],
                       "dtype": sorted(set(d.params["dtype"]))}
    if dist.get_rank() == 0:
        json.dump(out, open(sys.argv[1], "w"))
    dist.barrier()  # nobody leaves before rank 0 wrote (tests/helpers/jobs.py)
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepspeed")
    program = PROGRAM.replace("sys.argv[2]", str(STEPS))
    return torchrun_program(folder, program, 2, ENV, timeout=400)




@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_planted_orphan_is_the_only_error(job, stage):
    got = job[f"{stage} True"]
    assert got["errors"] == ["orphan"]
    assert "orphan" in got["verdicts"]["head2.weight"] and "orphan" in got["verdicts"]["head2.bias"]
    assert all(v == ["ok"] for k, v in got["verdicts"].items() if not k.startswith("head2."))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_fix_is_deepspeeds_lever(job, stage):
    """Watched as the engine or as engine.module + engine.optimizer alike: ZeRO takes no group
    after it is built, and has no find_unused_parameters."""
    (fix,) = job[f"{stage} True"]["fixes"]
    assert "before deepspeed.initialize" in fix and "add_param_group" not in fix, fix
    for planted in (True, False):
        assert "runs under DeepSpeed" in job[f"{stage} {planted}"]["unused_advice"]
    assert "DeepSpeed" not in job["ddp True"]["unused_advice"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_clean_twin_is_all_ok(job, stage):
    got = job[f"{stage} False"]
    assert got["errors"] == [] and set(got["verdicts"]) == {
        f"{m}.{p}" for m in ("body", "head", "head2") for p in ("weight", "bias")}
    assert all(v == ["ok"] for v in got["verdicts"].values())


@pytest.mark.parametrize("planted", [True, False])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_measurement_is_the_one_without_deepspeed(job, stage, planted):
    oracle, got = job[f"ddp {planted}"], job[f"{stage} {planted}"]
    assert set(got["steps"]) == set(oracle["steps"])
    assert len(oracle["steps"]) == STEPS * 6
    for key, (grad, delta) in oracle["steps"].items():
        assert same_norm(got["steps"][key][0], grad), (key, got["steps"][key], grad)
        assert same_norm(got["steps"][key][1], delta), (key, got["steps"][key], delta)
    # static facts: the whole shapes (ZeRO-3 holds a slice), each group's lr and decay
    strip = [row[:2] + row[3:] for row in got["params"]]
    assert strip == [row[:2] + row[3:] for row in oracle["params"]]
    assert {row[2] for row in got["params"]} == ({"ZeRO-3 partition"} if stage == 3 else {""})


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_gets_its_own_step_back(job, stage):
    assert job[f"{stage} True own step back"] and job[f"{stage} False own step back"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_torch_optimizer_zero_wraps_is_refused_in_one_line(job, stage):
    line = job[f"{stage} torch"]
    assert line.startswith("refused: diagkit") and "\n" not in line and "orphan" not in line
    assert "engine.optimizer" in line, line


def test_one_step_per_optimizer_step_through_accumulation_and_sub_groups(job):
    """2 observed steps of 2 micro-batches each end at the 4th `engine.step()`; before the fix
    ZeRO-3's sub-groups made 2 calls count as 3 steps."""
    assert job["accumulated"] == {"done_after": 4, "steps": [0, 1]}


def test_an_fp16_step_the_loss_scaler_skipped_still_counts_as_skipped(job):
    if job["fp16"] == "unsupported":
        pytest.skip("DeepSpeed's CPU accelerator has no fp16 on this CPU (oneDNN lacks it)")
    assert job["fp16"] == {"verdicts": ["ok"], "skipped_steps": [1], "all_skipped_at_1": True,
                           "changed_at_1": False, "skipped_optimizer_steps": 1,
                           "dtype": ["torch.float16"]}


# ------------------------------------------------------------------ a --nproc target's engine
TARGET = textwrap.dedent('''
    import torch

    from models import TwoHeads as Net


    def build(stage=3, planted=1):
        import deepspeed
        torch.manual_seed(0)
        model = Net()
        held = [p for n, p in model.named_parameters()
                if not (planted and n.startswith("head2."))]
        config = {"train_micro_batch_size_per_gpu": 4, "zero_allow_untested_optimizer": True,
                  "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.Adam(held, lr=0.01), config=config)

        def train_step(step):
            loss = engine(torch.randn(4, 8))
            engine.backward(loss)
            engine.step()
            return loss

        return {"model": engine, "train_step": train_step, "steps": 3}
''')


@pytest.mark.parametrize("stage, planted", [(3, 1), (2, 0)])
def test_a_target_returning_an_engine_under_nproc(tmp_path, stage, planted):
    """`diagkit check --nproc 2` of a target whose model is the engine (no optimizer given:
    the engine's own): the planted orphan is the only error, its twin all ok (exit 0)."""
    import json
    import sys

    from jobs import run_job

    (tmp_path / "ds_target.py").write_text(TARGET)
    diagkit = str(Path(sys.executable).parent / "diagkit")
    done = run_job([diagkit, "check", "ds_target.py:build", "--nproc", "2", "--arg",
                    f"stage={stage}", "--arg", f"planted={planted}", "--json", "out.json"],
                   cwd=tmp_path, env=ENV, timeout=300)
    assert done.returncode == planted, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "out.json").read_text())
    errors = {f["code"] for f in result["findings"] if f["severity"] == "error"}
    assert errors == ({"orphan"} if planted else set())
    params = result["params"]
    names = [row["name"] for row in params]
    assert sorted(names) == sorted(f"{m}.{p}" for m in ("body", "head", "head2")
                                   for p in ("weight", "bias"))
    by_name = {row["name"]: row for row in params}
    assert tuple(by_name["head.weight"]["shape"]) == (4, 8)
    assert by_name["head.weight"]["placement"] == ("ZeRO-3 partition" if stage == 3 else "")
    if not planted:
        assert all(row["verdicts"] == ["ok"] for row in params)


def test_an_engine_target_without_nproc_says_to_give_it_a_process_group(tmp_path):
    """One process, no process group: DeepSpeed looks for MPI to start one. The line says to
    run the target under `--nproc N` (exit 2), not only that mpi4py is missing."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("mpi4py") is not None:
        pytest.skip("mpi4py is installed: DeepSpeed then starts a process group through MPI")
    (tmp_path / "ds_target.py").write_text(TARGET)
    diagkit = str(Path(sys.executable).parent / "diagkit")
    done = subprocess.run([diagkit, "check", "ds_target.py:build"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    line, = done.stderr.strip().splitlines()
    assert line.startswith("diagkit: error: target 'ds_target.py:build' raised while building")
    assert line.endswith("No module named 'mpi4py' (DeepSpeed looks for MPI when no process "
                         "group exists: run the target under one, with --nproc N)")
