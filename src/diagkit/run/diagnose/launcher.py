"""Run a diagnosis under real torch.distributed: torchrun launches N ranks of
`diagkit.run.diagnose.worker`.

gloo on CPU, NCCL on GPUs, a free port chosen by torchrun's standalone rendezvous. Each rank
writes its observations to a run folder as it goes; this side waits with a deadline, then
assembles them into one `Diagnosis` whose steps table has a `rank` column. A rank that raises,
hangs or dies ends the run within the deadline with an error naming the rank, the steps before
it are kept, and the whole process group is killed: no process outlives the call. The rank
named is the cause (`rank_failure`): a rank's own error wins over the collective errors its
exit gave the others, and a rank still building (or importing) is the one the others waited
for.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from ...core.errors import DiagkitError
from ...core.options import DEFAULTS, check_run_options
from ...core.result import Diagnosis, LoadReport
from ...core.schema import STEPS_COLUMNS
from .pipeline import Observation, judge_observation
from .rank_failure import run_failure


def diagnose_distributed(target: str, target_args: dict | None = None, *, nproc: int = 2,
                         steps: int | None = None, checkpoint: str | None = None,
                         trust_checkpoint: bool = False,
                         timeout: float = DEFAULTS["timeout"], measure_cost: bool = True,
                         delta: str = DEFAULTS["delta"], every: int = DEFAULTS["every"],
                         fixes: dict | None = None) -> Diagnosis:
    """Diagnose `target` in `nproc` processes of one torch.distributed job (`timeout`: seconds
    for the whole run, setup included). `steps=None`: the target's own `steps`, else the
    default, decided in each rank once the target is built (as in one process). `fixes`: a
    `run.diagnose.fixes` plan each rank applies to its copy right after building it (--try-fix)."""
    if nproc < 2:
        raise DiagkitError(f"nproc must be >= 2 for a distributed run, got {nproc}")
    most, of_what = machine_ranks()
    if nproc > most:
        raise DiagkitError(f"--nproc {nproc} is more ranks than this machine runs at once "
                           f"({most}, one per {of_what}): use --nproc {most} or fewer")
    check_run_options(steps=steps, delta=delta, every=every)  # one line here, not in N ranks
    with tempfile.TemporaryDirectory(prefix="diagkit-ddp-") as tmp:
        run_dir = Path(tmp)
        spec = {"run_dir": str(run_dir), "target": target, "target_args": target_args or {},
                "delta": delta, "every": every, "steps": steps,
                "checkpoint": checkpoint, "trust": trust_checkpoint,
                # collectives wait longer than our deadline, so the deadline names the stuck rank
                "collective_timeout": timeout + 60.0, "measure_cost": measure_cost,
                "fixes": fixes}
        (run_dir / "spec.json").write_text(json.dumps(spec))
        returncode, timed_out, log = _launch(run_dir, nproc, timeout)
        ranks = _rank_states(run_dir, nproc)
        rows = _load(run_dir / "rows.pkl")
        steps_table = _steps(run_dir, nproc)
        meta, cost, loaded = (_json(run_dir / name) for name in
                              ("meta.json", "cost.json", "checkpoint.json"))
    failure = run_failure(ranks, returncode, timed_out, timeout, steps_table, log)
    if rows is None:
        raise DiagkitError(failure.error if failure else "the distributed run produced nothing")
    meta = {**(meta or {}), "nproc": nproc, "ranks": ranks}
    return judge_observation(Observation(rows, steps_table, failure, meta),
                             checkpoint=LoadReport(**loaded["load"]) if loaded else None,
                             ddp=meta.get("ddp", {}), cost=cost)


def _json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def machine_ranks() -> tuple[int, str]:
    """How many ranks this machine runs at once: one per GPU under NCCL, else one per CPU core
    this process may use (gloo; 2 on a single core: a 2-rank job still runs there). More only
    oversubscribe it: 1000 ranks on 2 cores ran it out of memory and left ranks behind."""
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.cuda.device_count(), "GPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, cores or 1), "CPU core"


def _launch(run_dir: Path, nproc: int, timeout: float) -> tuple[int | None, bool, str]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.setdefault("TORCH_DISTRIBUTED_DEBUG", "INFO")  # DDP names unused tensors (DETAIL crashes)
    # --log-dir: torchrun's own folder (else a torchelastic_* in /tmp, never removed) goes
    # with the run folder.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.5",
           f"--log-dir={run_dir / 'torchrun'}",
           "-m", "diagkit.run.diagnose.worker", str(run_dir / "spec.json")]
    log_path = run_dir / "torchrun.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # its own group: killed as a whole
        try:
            timed_out = _wait(proc, run_dir, nproc, timeout)
        finally:
            _stop(proc, run_dir)
    return proc.returncode, timed_out, log_path.read_text(errors="replace")


_POLL_S = 0.25  # how often the run folder is read while the ranks run
_GRACE_S = 5.0  # after a rank reported a failure: time for the others to report theirs


def _wait(proc: subprocess.Popen, run_dir: Path, nproc: int, timeout: float) -> bool:
    """Wait for torchrun, at most `timeout` seconds (True: it ran out). A rank that reported a
    failure ends the run `_GRACE_S` later, whatever the others do: a peer left waiting in a
    collective (FSDP2's shard combine, NCCL, which never notices a peer's exit) would otherwise
    wait for the group's timeout, and a rank whose process lingers after its report (a
    non-daemon thread of the target's) would hold the run until `timeout`. The same once every
    rank has reported: nothing is left to wait for."""
    ends = time.monotonic() + timeout
    settle_by = None
    while True:
        left = ends - time.monotonic()
        if left <= 0:
            return True
        try:
            proc.wait(timeout=min(_POLL_S, left))
            return False
        except subprocess.TimeoutExpired:
            pass
        if settle_by is None and _reported_enough(run_dir, nproc):
            settle_by = time.monotonic() + _GRACE_S
        if settle_by is not None and time.monotonic() >= settle_by:
            return False


def _reported_enough(run_dir: Path, nproc: int) -> bool:
    """Whether a rank reported a failure, or every rank reported."""
    states = [_json_or_none(run_dir / f"rank{r}.status.json") for r in range(nproc)]
    reported = [s for s in states if s is not None]
    return len(reported) == nproc or any(
        s.get("state") == "error" or s.get("failure") for s in reported)


def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet (each file is written atomically)
        return None


def _stop(proc: subprocess.Popen, run_dir: Path) -> None:
    """End torchrun and every rank. torchrun starts its ranks in sessions of their own, so
    killing its group is not enough: ranks are found by the run folder in their command line."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # torchrun stops its ranks on SIGTERM
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    for pid in [proc.pid, *_ranks_of(run_dir)]:
        try:
            os.killpg(pid, signal.SIGKILL) if pid == proc.pid else os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    # A SIGKILLed process is gone only once the kernel has run it to its end, which on a
    # loaded machine takes a moment: wait for that, so that none outlives this call.
    gone_by = time.monotonic() + 10
    while _ranks_of(run_dir) and time.monotonic() < gone_by:
        time.sleep(0.05)


def _ranks_of(run_dir: Path) -> list[int]:
    marker = str(run_dir / "spec.json").encode()
    pids = []
    if not Path("/proc").is_dir():  # not Linux: torchrun's own SIGTERM handling has to do
        return pids
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _load(path: Path):
    return pickle.loads(path.read_bytes()) if path.is_file() else None


def _rank_states(run_dir: Path, nproc: int) -> dict[int, dict]:
    states = {}
    for rank in range(nproc):
        status = run_dir / f"rank{rank}.status.json"
        progress = run_dir / f"rank{rank}.progress.json"
        states[rank] = {
            **(json.loads(status.read_text()) if status.is_file() else {"state": "unfinished"}),
            "progress": json.loads(progress.read_text()) if progress.is_file() else None}
    return states


def _steps(run_dir: Path, nproc: int) -> pd.DataFrame:
    """Steps completed by every rank (a step one rank never finished can't be compared)."""
    per_rank = {r: sorted(run_dir.glob(f"rank{r}.step*.pkl")) for r in range(nproc)}
    common = min((len(files) for files in per_rank.values()), default=0)
    tables = [pickle.loads(f.read_bytes()) for r in range(nproc) for f in per_rank[r][:common]]
    if not tables:
        return pd.DataFrame(columns=["rank", *STEPS_COLUMNS, "checksum"])
    return pd.concat(tables, ignore_index=True).sort_values(["step", "rank"], kind="stable",
                                                           ignore_index=True)
