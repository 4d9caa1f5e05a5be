"""The callbacks inside a real torchrun job (2 processes, gloo, CPU): every rank watches, rank
0 gathers both ranks' steps into one diagnosis and is the only one to write `out`; the other
rank's `diagnosis` is None."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import diagkit
from integration_helpers import OFFLINE
from jobs import finished, run_job

HELPERS = Path(__file__).resolve().parents[1] / "helpers"  # ddp_jobs.py and what it imports
CASES = {"hf": ("transformers", {"score.weight": ["orphan"]}),
         "lightning": ("lightning", {"dead.weight": ["unused"], "dead.bias": ["unused"]})}


@pytest.mark.parametrize("job", sorted(CASES))
def test_rank_0_gathers_and_alone_writes(job, tmp_path):
    pytest.importorskip(CASES[job][0])
    env = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])}
    done = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", "--max-restarts=0", str(HELPERS / "ddp_jobs.py"),
                    job, str(tmp_path / "diag")], cwd=tmp_path, env=env, timeout=300)
    assert finished(done.returncode, done.stdout + done.stderr), \
        done.stdout[-3000:] + done.stderr[-3000:]
    ranks = {r["rank"]: r for r in (json.loads(f.read_text())
                                    for f in (tmp_path / "diag_ranks").glob("*.json"))}
    assert sorted(ranks) == [0, 1] and all(r["done"] for r in ranks.values())
    assert {r["wrapped"] for r in ranks.values()} == {"DistributedDataParallel"}
    assert ranks[1]["verdicts"] is None and ranks[0]["nproc"] == 2
    assert ranks[0]["ranks_in_steps"] == [0, 1]
    verdicts = ranks[0]["verdicts"]
    planted = CASES[job][1]
    assert {n: verdicts.pop(n) for n in planted} == planted
    assert {v for vs in verdicts.values() for v in vs} == {"ok"}
    saved = diagkit.load(tmp_path / "diag")
    assert {n: sorted(v) for n, v in saved.verdicts().items()} == ranks[0]["verdicts"] | planted
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(("_trainer", "_ranks"))] == ["diag"]
