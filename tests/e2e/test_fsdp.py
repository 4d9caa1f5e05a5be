"""FSDP2 (`fully_shard`, DTensor parameters) under `diagnose`, `--nproc` and `watch`: real
sharding on gloo, world 1 and 2, with the optimizer-built-before-sharding bug
(`examples/fsdp2_job.py`). Each rank measures its shards; the combined norms must be those of
the whole tensors, which the torchrun program measures itself with `full_tensor()`.

The four programs of one process share one process (`one_process`): each is what a process of
its own would do, one after the other. The torchrun jobs are not shared: a rank's FSDP2 run
leaves DTensor's caches naming its process group, which a later group in the same process
cannot use (tests/helpers/ranks_one_job.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import diagkit
from diagkit.run.diagnose.launcher import diagnose_distributed
from jobs import finished, run_job

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "fsdp2_job.py"
TARGET = f"{JOB}:build"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
NAMES = ["embed.weight", "embed.bias", "blocks.0.0.weight", "blocks.0.0.bias",
         "blocks.1.0.weight", "blocks.1.0.bias", "norm.weight", "norm.bias", "head.weight",
         "head.bias"]


def python(code: str, cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=240)
    assert finished(done.returncode, done.stdout + done.stderr), done.stderr[-3000:]
    return done


# The programs of one process below, in ONE process (a process's CPU here is mostly importing
# torch and diagkit): each runs as `python -c PROGRAM` would, in a folder of its own, its
# output kept apart; an error in one is its test's failure, not the others'.
ONE_PROCESS = """
import contextlib, os, sys, traceback
for name, code in PROGRAMS:
    os.chdir(name)
    with open("stdout", "w") as out, contextlib.redirect_stdout(out):
        try:
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
            ended = "ok"
        except BaseException:
            ended = traceback.format_exc()
    open("ended", "w").write(ended)
    os.chdir("..")
"""


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one_process")
    programs = [("diagnose_False", DIAGNOSE.replace("OPTIMIZER_FIRST", "False")),
                ("diagnose_True", DIAGNOSE.replace("OPTIMIZER_FIRST", "True")),
                ("policies", POLICIES), ("fsdp1", FSDP1)]
    for name, _ in programs:
        (folder / name).mkdir()
    python(f"PROGRAMS = {programs!r}\n" + ONE_PROCESS, folder)
    return folder


def ran_alone(folder: Path, name: str) -> str:
    """One program's stdout, once it ended without an error."""
    ended = (folder / name / "ended").read_text()
    assert ended == "ok", ended
    return (folder / name / "stdout").read_text()


def torchrun(tmp_path, *args) -> Path:
    """The FSDP2 program under a real torchrun of 2 processes; returns its diag folder."""
    done = run_job([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                    "--max-restarts=0", "--standalone", str(JOB), "--out", "diag",
                    "--expect", "expect.json", *args], cwd=tmp_path, env=ENV, timeout=300)
    assert finished(done.returncode, done.stdout + done.stderr), done.stderr[-4000:]
    return tmp_path / "diag"


def assert_replaced_parameters(diag) -> None:
    """The optimizer built before fully_shard: the model's DTensors are orphans whose .grad
    piles up, the optimizer's tensors are the replaced ones; the fix says to build it after."""
    v = diag.verdicts()
    assert {n: v[n] for n in NAMES} == {n: {"orphan", "grad_not_cleared"} for n in NAMES}
    stale = {n: s for n, s in v.items() if n not in NAMES}
    assert len(stale) == len(NAMES)
    assert all(s == {"not_in_model", "unused"} for s in stale.values())
    orphan = next(f for f in diag.findings if f.code == "orphan")
    assert "fully_shard" in orphan.message and "after sharding" in orphan.fix
    assert "fully_shard" in next(f for f in diag.findings if f.code == "not_in_model").fix


def test_nproc_clean_sharded_run_is_all_ok():
    diag = diagnose_distributed(TARGET, nproc=2, steps=3)
    assert diag.failure is None and diag.meta["world_size"] == 2
    assert diag.verdicts() == {n: {"ok"} for n in NAMES}
    assert set(diag.params["placement"]) == {"Shard(dim=0)"}
    assert diag.params.set_index("name").loc["head.weight", "shape"] == (3, 16)  # the whole
    assert not diag.meta["wrapped_by_diagkit"]  # no DDP around FSDP2
    assert "FSDP2 (fully_shard), which has no find_unused_parameters" in \
        diag.advice["find_unused_parameters"]["recommendation"]
    # Every rank's row holds the whole tensor's values: the ranks agree exactly.
    spread = diag.steps.groupby(["step", "name"])[["grad_norm", "delta_norm", "checksum"]]
    assert (spread.nunique() == 1).all().all()


def test_nproc_optimizer_built_before_fully_shard():
    assert_replaced_parameters(diagnose_distributed(TARGET, nproc=2, steps=3,
                                                    target_args={"optimizer_first": True}))


def test_check_in_one_process_the_target_starts_its_group_of_one(tmp_path):
    """World 1 through the CLI: `build` starts a gloo group of one, as FSDP2 needs one."""
    done = subprocess.run([str(Path(sys.executable).parent / "diagkit"), "check", TARGET,
                           "--arg", "optimizer_first=true", "--json", "out.json"], cwd=tmp_path,
                          env=ENV, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr  # findings of error severity
    rows = {p["name"]: set(p["verdicts"]) for p in
            json.loads((tmp_path / "out.json").read_text())["params"]}
    assert all(rows[n] == {"orphan", "grad_not_cleared"} for n in NAMES)


def test_watch_under_torchrun_combines_shards_exactly(tmp_path):
    """head.bias has 3 elements: rank 0 holds 2 and rank 1 one. The norms in the steps table
    are the whole tensors' (what the program measured with full_tensor()), on both ranks."""
    diag = diagkit.load(torchrun(tmp_path))
    assert diag.verdicts() == {n: {"ok"} for n in NAMES}
    expect = json.loads((tmp_path / "expect.json").read_text())
    last = diag.steps[diag.steps["step"] == diag.steps["step"].max()]
    assert set(last["rank"]) == {0, 1}
    for _, row in last.iterrows():
        for col in ("grad_norm", "delta_norm"):
            assert math.isclose(row[col], expect[col][row["name"]], rel_tol=1e-5), (row, col)


def test_watch_under_torchrun_optimizer_built_before_fully_shard(tmp_path):
    diag = diagkit.load(torchrun(tmp_path, "--optimizer-first"))
    assert_replaced_parameters(diag)
    expect = json.loads((tmp_path / "expect.json").read_text())
    assert all(d == 0.0 for d in expect["delta_norm"].values())  # nothing trained, truly


DIAGNOSE = f"""
import sys, torch, torch.distributed as dist
sys.path.insert(0, {str(JOB.parent)!r})
import diagkit
from fsdp2_job import build
if not dist.is_initialized():  # one group of one for every program of one_process
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
setup = build(optimizer_first=OPTIMIZER_FIRST)
model = setup["model"]
before = {{n: p.detach().to_local().clone() for n, p in model.named_parameters()}}
diag = diagkit.diagnose(model, setup["optimizer"], batch_fn=setup["batch_fn"],
                        loss_fn=setup["loss_fn"], steps=3)
diag.save("diag")
restored = all(torch.equal(before[n], p.detach().to_local())
               for n, p in model.named_parameters())
print("restored", restored, all(p.grad is None for p in model.parameters()))
"""


@pytest.mark.parametrize("optimizer_first", [False, True])
def test_diagnose_in_one_process_under_a_group_of_one(one_process, optimizer_first):
    stdout = ran_alone(one_process, f"diagnose_{optimizer_first}")
    assert "restored True True" in stdout  # the sharded model is given back bitwise
    diag = diagkit.load(one_process / f"diagnose_{optimizer_first}" / "diag")
    if optimizer_first:
        assert_replaced_parameters(diag)
    else:
        assert diag.verdicts() == {n: {"ok"} for n in NAMES}


FSDP1 = """
import torch, torch.distributed as dist
import diagkit
from torch.distributed.fsdp import FullyShardedDataParallel
if not dist.is_initialized():  # one group of one for every program of one_process
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
for orig in (False, True):
    inner = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model = FullyShardedDataParallel(inner, device_id=torch.device("cpu"), use_orig_params=orig)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = lambda: torch.randn(2, 4)
    # the wrapper itself, under diagnose and watch; then the module taken from under it,
    # which the earlier line invited and which was then judged wrongly
    for what, call in (("diagnose", lambda: diagkit.diagnose(model, opt, batch_fn=batch,
                                                            loss_fn=lambda m, x: m(x).sum())),
                       ("watch", lambda: diagkit.watch(model, opt)),
                       ("module", lambda: diagkit.watch(model.module, opt))):
        try:
            result = call()
            result = result if what == "diagnose" else result.stop()
            print(f"judged {orig} {what}", sorted(set().union(*result.verdicts().values())))
        except diagkit.DiagkitError as exc:
            print(f"refused {orig} {what}:", exc)
"""


def test_fsdp1_without_orig_params_is_refused_in_one_accurate_line(one_process):
    """FSDP1 with use_orig_params=False, and the module under FSDP1 either way, end in one line
    that says why, not in a whole model judged `unused` and `rank_divergent`; with
    use_orig_params=True the wrapper itself is judged (all `ok` here; the 2-rank test with a
    planted orphan is tests/e2e/test_fsdp1.py)."""
    out = ran_alone(one_process, "fsdp1").splitlines()
    refused = {tuple(ln.split(":")[0].split()[1:]): ln for ln in out if ln.startswith("refused")}
    judged = {tuple(ln.split()[1:3]): ln.split(" ", 3)[3] for ln in out if ln.startswith("judged")}
    assert set(refused) == {("False", "diagnose"), ("False", "watch"), ("False", "module"),
                            ("True", "module")}, out
    assert judged == {("True", "diagnose"): "['ok']", ("True", "watch"): "['ok']"}, out
    for what in ("diagnose", "watch"):
        line = refused[("False", what)]
        assert "FSDP1 (FullyShardedDataParallel)" in line and "fully_shard" in line, line
        assert "use_orig_params=False" in line and "Build it with use_orig_params=True" in line
        assert "the model unwrapped" not in line, line
    # Under the wrapper the tensors are FSDP's: the flat parameter or views into it.
    for orig in ("False", "True"):
        line = refused[(orig, "module")]
        assert "FlatParameter" in line and "pass the FullyShardedDataParallel model" in line


POLICIES = """
import torch, torch.distributed as dist
import diagkit
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
if not dist.is_initialized():  # one group of one for every program of one_process
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def sharded(**policy):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    fully_shard(m[0], **policy)
    fully_shard(m, **policy)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


m, opt = sharded(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                reduce_dtype=torch.float32))
diag = diagkit.diagnose(m, opt, batch_fn=lambda: torch.randn(3, 4),
                        loss_fn=lambda m, x: m(x).float().pow(2).mean(), steps=3)
print("bf16 compute:", sorted(set().union(*diag.verdicts().values())),
      sorted(set(diag.params["dtype"])))
m, opt = sharded()


def accumulate(step):  # two micro-batches, the gradients reduced on the last one only
    opt.zero_grad()
    for j in range(2):
        m.set_requires_gradient_sync(j == 1)
        m(torch.randn(3, 4)).pow(2).mean().backward()
    opt.step()


diag = diagkit.diagnose(m, opt, train_step=accumulate, steps=3)
print("no-sync accumulation:", sorted(set().union(*diag.verdicts().values())))
"""


def test_fsdp2_mixed_precision_policy_and_unsynced_accumulation_are_clean(one_process):
    """bf16 compute with fp32 sharded parameters (FSDP2's MixedPrecisionPolicy), and
    micro-batches whose gradients FSDP2 reduces on the last one only: nothing false."""
    out = ran_alone(one_process, "policies")
    assert "bf16 compute: ['ok'] ['torch.float32']" in out
    assert "no-sync accumulation: ['ok']" in out
