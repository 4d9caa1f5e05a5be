"""Which rank a distributed run's failure names (`launcher`): the cause, not the ranks that only
lost it. A rank's own error wins over the collective errors its exit gave the others, a rank
that vanished is named with where it was, and on a timeout the rank still behind (building,
importing, or a step earlier) is the one the others waited for."""

from __future__ import annotations

from ...core.result import StepFailure


def run_failure(ranks, returncode, timed_out, timeout, steps_table, log) -> StepFailure | None:
    """One failure for the run, naming the rank that caused it and where the others were
    (`ranks`: each rank's status and progress; `steps_table`: the steps every rank finished;
    `log`: torchrun's output; `returncode`, `timed_out`, `timeout`: how torchrun ended).

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
