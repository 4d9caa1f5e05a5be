"""Run a diagnosis under real torch.distributed: torchrun launches N ranks of `diagkit.run.diagnose.worker`.

gloo on CPU, NCCL on GPUs, a free port chosen by torchrun's standalone rendezvous. Each rank
writes its observations to a run folder as it goes; this side waits with a deadline, then
assembles them into one `Diagnosis` whose steps table has a `rank` column. A rank that raises,
hangs or dies ends the run within the deadline with an error naming the rank, the steps before
it are kept, and the whole process group is killed: no process outlives the call. The rank
named is the cause: a rank's own error wins over the collective errors its exit gave the
others, and a rank still building (or importing) is the one the others waited for.
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
from ...core.result import Diagnosis, LoadReport, StepFailure
from ...core.schema import STEPS_COLUMNS
from .pipeline import Observation, judge_observation


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
    failure = _failure(ranks, nproc, returncode, timed_out, timeout, steps_table, log)
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


def _failure(ranks, nproc, returncode, timed_out, timeout, steps_table, log) -> StepFailure | None:
    """One failure for the run, naming the rank that caused it and where the others were.

    A rank's own error wins over the errors the others got because it went away (a closed
    connection, a collective timed out: `_collateral`), whatever their rank numbers: with
    several of its own, the earliest step's, then the lowest rank's."""
    done = len(steps_table["step"].unique()) if len(steps_table) else 0
    reports = _reports(ranks, done)
    silent = [r for r, s in ranks.items() if s.get("state") not in ("done", "error")]
    own = [x for x in reports if not x[0]]
    if own:
        return _named(min(own, key=lambda x: x[1:3]), reports)
    if silent and not timed_out:
        # A rank vanished (killed, os._exit, out of memory); the others only lost their peer.
        where = "; ".join(f"rank {r} {_where(ranks[r])}" for r in silent)
        step = min((x[1] for x in reports), default=done)
        return StepFailure(step, f"rank {', '.join(map(str, silent))} died "
                                 f"(torchrun exit {returncode}): {where}", log[-4000:])
    if reports and not timed_out:
        return _named(min(reports, key=lambda x: x[1:3]), reports)
    if timed_out:
        unfinished = [r for r, s in ranks.items() if s.get("state") != "done"]
        where = "; ".join(f"rank {r} {_where(ranks[r])}" for r in unfinished) or "all ranks done"
        stuck = _stuck(ranks, unfinished)
        return StepFailure(done, f"timed out after {timeout:.0f} s: {where}"
                           + (f"; rank {stuck} is the one that stopped (the others waited for "
                              "it)" if stuck is not None else ""), log[-4000:])
    # Every rank reported done: a non-zero exit after that is a crash at process teardown
    # (seen with gloo, pandas and pyarrow loaded: "terminate called without an active
    # exception"), after every result was written. The run is complete.
    return None


def _reports(ranks: dict, done: int) -> list[tuple]:
    """Every failure a rank reported, as (collateral, step, rank, text, traceback): an error
    that ended the rank (`state` "error", at the step it had reached) or a failed step."""
    reports = []
    for r, s in ranks.items():
        if s.get("state") == "error":
            where = _where(s, failed=True)
            text = f"rank {r} failed{' ' * bool(where)}{where}: {s['error']}"
            reports.append((_collateral(s["error"]), done, r, text, s.get("traceback", "")))
        elif s.get("state") == "done" and s.get("failure"):
            f = s["failure"]
            reports.append((_collateral(f["error"]), f["step"], r, f"rank {r}: {f['error']}",
                            f.get("traceback", "")))
    return reports


def _named(first: tuple, reports: list[tuple]) -> StepFailure:
    """The run's failure from its first report; the other ranks' reports said in a few words:
    those of their own ("also on rank 0"), and those that only lost the first rank."""
    collateral, step, rank, text, tb = first
    others = [x for x in reports if x[2] != rank]
    own = sorted(x[2] for x in others if not x[0] or collateral)
    lost = sorted(x[2] for x in others if x[0] and not collateral)
    if own:
        text += f" (also on rank {', '.join(map(str, own))})"
    if lost:
        text += f" (then rank {', '.join(map(str, lost))} lost its peer)"
    return StepFailure(step, text, tb)


_COLLATERAL = ("Connection closed by peer", "Connection reset", "Broken pipe", "NCCL error",
               "Gloo", "gloo", "timed out", "Timed out")


def _collateral(error: str) -> bool:
    """An error a rank gets because another rank went away, not a cause of its own."""
    return any(marker in error for marker in _COLLATERAL)


def _where(state: dict, failed: bool = False) -> str:
    """Where a rank was, from its last progress report (`failed`: how its error is placed)."""
    p = state.get("progress")
    if not p:
        return "before it started" if failed else "never started"
    if p["event"] in _SETUP:
        return _SETUP[p["event"]][failed]
    phase = {"begin": "before its backward", "backward": "in its backward",
             "end": "after finishing"}[p["event"]]
    return f"in step {p['step']}, {phase}" if failed else f"stopped in step {p['step']}, {phase}"


# The progress a rank reports before its first step (`worker`): (where it stopped, where it
# failed; an error while importing or building says so itself, `target.load_target`).
# "built": its target is built and it waits for the others (DDP's first broadcast).
_SETUP = {"importing": ("stopped while importing the target", ""),
          "setup": ("stopped while building the target", ""),
          "built": ("had built the target and was waiting for the others",
                    "after building the target")}
_ORDER = {"importing": 0, "setup": 1, "built": 2, "begin": 3, "backward": 4, "end": 5}


def _stuck(ranks: dict, unfinished: list[int]) -> int | None:
    """The rank that is behind: the others wait for it in a collective."""
    position = {r: ((ranks[r]["progress"] or {}).get("step", -2),
                    _ORDER.get((ranks[r]["progress"] or {}).get("event"), -1))
                for r in unfinished}
    if len(position) < 2:
        return unfinished[0] if unfinished else None
    lowest = min(position.values())
    behind = [r for r, p in position.items() if p == lowest]
    return behind[0] if len(behind) == 1 else None
