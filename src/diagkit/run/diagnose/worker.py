"""One rank of a distributed diagnosis (`python -m diagkit.run.diagnose.worker SPEC.json`, under torchrun).

Every rank imports the target itself, observes its own steps, and writes what it saw to the run
folder as it goes: its static rows once, one table per completed step, its progress (step and
phase), and at the end its status. The launcher assembles these files, so a rank that raises,
hangs or dies still leaves the steps before it, and says where it was.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import pickle
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ...measure.engines.ddp_facts import ddp_facts
from ..target import deadline


def main(argv: list[str]) -> int:
    os.environ.pop(deadline.ENV, None)  # the launcher bounds a rank, with the same --timeout
    spec = json.loads(Path(argv[0]).read_text())
    run_dir = Path(spec["run_dir"])
    rank = int(os.environ["RANK"])
    files = _RankFiles(run_dir, rank)
    try:
        return _run(spec, rank, files)
    except BaseException as exc:  # report it to the launcher, then end this rank
        files.status({"state": "error", "error": _error_text(exc),
                      "traceback": traceback.format_exc()})
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _error_text(exc: BaseException) -> str:
    """One line for the launcher: diagkit's own errors are sentences already (a target that
    raised while building says so, with its exception); anything else gets its type."""
    from ...core.errors import DiagkitError
    return str(exc) if isinstance(exc, DiagkitError) else f"{type(exc).__name__}: {exc}"


class _RankFiles:
    """The files one rank leaves in the run folder (written atomically)."""

    def __init__(self, run_dir: Path, rank: int):
        self.dir, self.rank = run_dir, rank

    def write(self, name: str, payload: bytes) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_bytes(payload)
        os.replace(tmp, self.dir / name)

    def status(self, payload: dict) -> None:
        self.write(f"rank{self.rank}.status.json", json.dumps(payload).encode())

    def progress(self, event: str, step: int, observer) -> None:
        self.write(f"rank{self.rank}.progress.json",
                   json.dumps({"event": event, "step": step, "time": time.time()}).encode())
        if event == "begin" and step == 0 and self.rank == 0:  # before anything can hang
            self.write("rows.pkl", pickle.dumps(observer.inv.rows))
        if event == "end" and self.rank == 0 and observer.unregistered.found_now:
            self.write("rows.pkl", pickle.dumps(observer.rows))  # with the unregistered found
        if event == "end":
            table = observer.step_table(step)
            table.insert(0, "rank", self.rank)
            self.write(f"rank{self.rank}.step{step:06d}.pkl", pickle.dumps(table))


def _run(spec: dict, rank: int, files: _RankFiles) -> int:
    from ...measure.engines.shards import any_sharded
    from .pipeline import observe
    from ..target.target import load_target, resolve_target

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=timedelta(seconds=spec["collective_timeout"]))
    # Where this rank is before its first step, so that a rank that hangs or fails there is
    # told from the ranks that waited for it: importing, building, then "built" (waiting for
    # the others in the first collective). The import here is checked and then made again by
    # load_target, as in one process (`diagkit check` imports the target before running it).
    files.progress("importing", -1, None)
    resolve_target(spec["target"])
    files.progress("setup", -1, None)
    setup = load_target(spec["target"], **spec["target_args"])
    if spec.get("checkpoint"):
        from ...measure.checkpoints.load import load_checkpoint
        report = load_checkpoint(setup.model, spec["checkpoint"], trust=spec.get("trust"),
                                 optimizers=setup.optimizers)
        if rank == 0:
            files.write("checkpoint.json", json.dumps({"load": report.to_dict()}).encode())
    plan, applied = spec.get("fixes"), None
    if plan:  # --try-fix's fixed run: the plan applied to this rank's fresh copy
        from .fixes import fix_for_ranks
        setup, applied = fix_for_ranks(setup, plan)
    files.progress("built", -1, None)
    # FSDP2 reduces the gradients itself: a DDP around it would reduce them twice.
    # So does a DeepSpeed engine.
    wrapped_by_us = (not isinstance(setup.model, DDP) and not any_sharded(setup.model)
                     and setup.engine is None)
    fup = True if not plan or plan.get("find_unused_parameters") is None else bool(
        plan["find_unused_parameters"])
    observed, ddp, drawn = _wrap(setup, fup) if wrapped_by_us else (
        setup, setup.model if isinstance(setup.model, DDP) else None, None)
    obs = observe(observed, spec["steps"], restore=False, checksums=True,
                  on_progress=files.progress, delta=spec.get("delta", "exact"),
                  every=spec.get("every", 1))
    if rank == 0:
        files.write("meta.json", json.dumps({
            **obs.meta, "backend": dist.get_backend(), "world_size": dist.get_world_size(),
            "wrapped_by_diagkit": wrapped_by_us,
            "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
            "ddp": ddp_facts(ddp), **({"fixes_applied": applied} if plan else {})},
            default=str).encode())
    failure = None if obs.failure is None else {
        "step": obs.failure.step, "error": obs.failure.error, "traceback": obs.failure.traceback}
    if failure is None and wrapped_by_us and spec.get("measure_cost"):
        cost = _measure_cost(setup, obs, spec, drawn)
        if rank == 0 and cost:
            files.write("cost.json", json.dumps(cost).encode())
    files.status({"state": "done", "failure": failure})
    return 1 if failure else 0  # a failed step ends the job: torchrun stops the other ranks


def _wrap(setup, find_unused_parameters: bool = True):
    """Wrap the target's model in DDP(find_unused_parameters=True), so that unused tensors are
    observed, not fatal (False: --try-fix's fixed run, where the advice allows it). The
    standard loop's loss_fn runs inside DDP's forward and still gets the target's own model
    (`loop.through_ddp`); the model observed is the target's, under the names its code saw.
    The last batches drawn are kept for `_measure_cost` to replay. (A train_step closes over
    its own model: the DDP built here only reports DDP's facts.)

    Returns (the setup to observe, the DDP, the deque of drawn batches or None)."""
    from .loop import through_ddp

    if setup.train_step is not None:
        return setup, DDP(setup.model, find_unused_parameters=find_unused_parameters), None
    observed, ddp = through_ddp(setup, find_unused_parameters=find_unused_parameters)
    drawn = collections.deque(maxlen=_COST_STEPS)

    def batch_fn():
        batch = setup.batch_fn()
        drawn.append(batch)
        return batch

    return dataclasses.replace(observed, batch_fn=batch_fn), ddp, drawn


_COST_ROUNDS, _COST_STEPS = 4, 3  # rounds per setting; timed steps per round


def _measure_cost(setup, obs, spec, drawn) -> dict | None:
    """Time find_unused_parameters=True against False on the same steps, interleaved.

    Only when every rank saw every trainable tensor used on every step (else False is not an
    option) and the standard loop is used (a train_step closes over its own model). The timed
    steps replay the last batches the observed steps drew and skip the lr scheduler, so the
    target's batch source and schedule are never asked for more than the run needed. This is
    diagkit's own extra: if it raises anyway, the cost is left out (None), never a failure.
    """
    try:
        steps = obs.steps
        rg = steps[steps["requires_grad"]]
        local_ok = (bool(len(rg)) and bool(rg["used"].all()) and setup.train_step is None
                    and bool(drawn))
        flag = torch.tensor([1 if local_ok else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if not int(flag.item()):
            return None
        return _time_both(setup, list(drawn), spec.get("cost_rounds", _COST_ROUNDS),
                          spec.get("cost_steps", _COST_STEPS))
    except Exception:  # a peer that failed here ends its collectives too: both give up
        return None


def _time_both(setup, batches: list, rounds: int, per_round: int) -> dict:
    """Seconds per step with find_unused_parameters True and False, medians of `rounds`."""
    from .loop import step_function, through_ddp

    replay = itertools.cycle(batches)
    base = dataclasses.replace(setup, batch_fn=lambda: next(replay), lr_scheduler=None)
    timings = {True: [], False: []}
    for i in range(rounds * 2):
        fup = (i % 2 == 0)
        timed, ddp = through_ddp(base, find_unused_parameters=fup)
        step = step_function(timed)
        step(0)  # warm-up: DDP builds its buckets on the first iteration
        dist.barrier()
        started = time.perf_counter()
        for j in range(per_round):
            step(j)
        dist.barrier()
        timings[fup].append((time.perf_counter() - started) / per_round)
        del ddp, step, timed
    true_s = sorted(timings[True])[len(timings[True]) // 2]
    false_s = sorted(timings[False])[len(timings[False]) // 2]
    return {"seconds_per_step_true": true_s, "seconds_per_step_false": false_s,
            "ratio": true_s / false_s if false_s > 0 else None,
            "rounds": rounds, "steps_per_round": per_round}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
