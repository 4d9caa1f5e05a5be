"""Every rank's observations to rank 0, through the user's own process group.

Each rank publishes what it observed as it goes (its steps, one table per observed step, and at
its end its status) to the process group's key-value store: the rendezvous store that
torch.distributed itself uses, reachable from every node whatever the backend. Rank 0 then
collects. Going through the store rather than a collective means that a rank that died or hangs
cannot block rank 0 beyond `timeout`: rank 0 keeps every step each rank published, and names
the ranks it did not hear from.

A rank that never calls `optimizer.step()` observes no step and would look just as silent, and
under DDP it cannot say so at its end either: it waits in its next backward's collective for
rank 0, which waits for it. So until its first step each rank also publishes, at each backward's
end, how many it has run (`measure.clock.first_step`). A rank that has run more backward passes than
rank 0 needed for its own first step, without stepping, never steps where rank 0 does: rank 0
stops waiting for it and says so (`judge.rules_ranks.never_stepped`), instead of calling it dead
after the whole `timeout`.
"""

from __future__ import annotations

import dataclasses
import pickle
import time

import pandas as pd
import torch.distributed as dist

from ...core.errors import DiagkitError
from ...measure.clock.first_step import FirstStep

_SERIAL = {"n": 0}  # watches started by this process; every rank starts them in the same order
# A rank found not stepping is reported once its count of backward passes has held still this
# long (under DDP it stops at rank 0's own count: the next backward waits for rank 0), or after
# SETTLE_AT_MOST seconds (a rank that runs on without a collective: "at least" that many).
SETTLE = 0.5
SETTLE_AT_MOST = 3.0


@dataclasses.dataclass
class Gathered:
    """What rank 0 collected: the step tables it had not taken yet; per rank its status (None:
    not heard from within the timeout) and how many steps it published in all; per rank not
    heard from, its last sign of life ((backward passes, stepped): `RankChannel.sign`), if any."""

    tables: list[pd.DataFrame]
    statuses: dict[int, dict | None]
    published: dict[int, int]
    signs: dict[int, tuple[int, bool]]


class RankChannel:
    """One watch's key space in the store: `diagkit/watch<serial>/r<rank>/...`."""

    def __init__(self):
        try:
            self.store = dist.distributed_c10d._get_default_store()
        except Exception as exc:  # private API: absent in some torch, or no default group
            raise DiagkitError(f"cannot reach the process group's store to gather the ranks: "
                               f"{type(exc).__name__}: {exc}") from None
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backend = str(dist.get_backend())  # read now: the group may be gone at the end
        self.prefix = f"diagkit/watch{_SERIAL['n']}"
        _SERIAL["n"] += 1
        self.published = 0
        self.taken = [0] * self.world  # per rank, the steps rank 0 has taken (and freed)
        self.progress: FirstStep | None = None  # this rank's backward passes before its first step

    def _key(self, rank: int, what: str) -> str:
        return f"{self.prefix}/r{rank}/{what}"

    def publish_step(self, columns: dict, wiring: int | None = None) -> None:
        """One observed step of this rank: its columns (arrays, with `rank` and `checksum`)
        and, in a whole run, its wiring's digest. Arrays, not a DataFrame: a rank publishes at
        every observed step, and building and pickling a frame there cost more than the step's
        measuring on small models (benchmarks/README.md, section M)."""
        self.store.set(self._key(self.rank, f"step{self.published}"),
                       pickle.dumps((columns, wiring)))
        self.published += 1
        self.store.add(self._key(self.rank, "ready"), 1)  # counted only once the step is there

    def publish_rows(self, rows: list[dict]) -> None:
        """This rank's inventory rows, at the start and whenever they change: rank 0 joins
        the ranks' by name (`measure.tables.aggregate.join_rank_rows`: pipeline stages hold
        different tensors)."""
        self.store.set(self._key(self.rank, "rows"), pickle.dumps(rows))

    def rows(self, own: list[dict]) -> list[dict]:
        """(Rank 0) every rank's rows joined, this rank's being `own`; a rank that published
        none (yet) adds nothing."""
        from ...measure.tables.aggregate import join_rank_rows
        by_rank = {self.rank: own}
        for r in range(self.world):
            key = self._key(r, "rows")
            if r != self.rank and self.store.check([key]):
                by_rank[r] = pickle.loads(self.store.get(key))
        return join_rank_rows(by_rank)

    def take_steps(self, rank: int) -> list[pd.DataFrame]:
        """(Rank 0, a whole-run watch) rank `rank`'s steps published since the last take; what
        was read is freed, so the store does not grow with the run."""
        ready = self.store.add(self._key(rank, "ready"), 0)
        tables = []
        for i in range(self.taken[rank], ready):
            key = self._key(rank, f"step{i}")
            tables.append(_table(self.store.get(key)))
            try:
                self.store.delete_key(key)
            except Exception:  # a store without delete: kept, as before
                pass
        self.taken[rank] = max(self.taken[rank], ready)
        return tables

    def follow(self, tensors: list, optimizers: list) -> None:
        """Publish this rank's backward passes until its first optimizer step, as each ends
        (`measure.clock.first_step`), so rank 0 can tell a rank that never steps from a dead one.
        Nothing without an optimizer (each backward is then a step). Never raises: without
        the count such a rank is only a silent one, as before."""
        if not optimizers:
            return
        store, key = self.store, self._key(self.rank, "alive")

        def beat(backwards: int, stepped: bool) -> None:  # holds the store, not the channel
            store.set(key, pickle.dumps((backwards, stepped)))

        try:
            self.progress = FirstStep(tensors, optimizers, beat)
        except Exception:
            self.progress = None

    def own_first(self) -> int | None:
        """The backward passes this rank ran before its first optimizer step; None before it
        stepped, or where they were not counted."""
        p = self.progress
        return p.backwards if p is not None and p.stepped and not p.broken else None

    def sign(self, rank: int) -> tuple[int, bool] | None:
        """Rank `rank`'s last sign of life: (backward passes, whether it began an optimizer
        step), published until its first step; None if it published none."""
        key = self._key(rank, "alive")
        return pickle.loads(self.store.get(key)) if self.store.check([key]) else None

    def done(self, rank: int) -> bool:
        """Rank `rank` said it is done observing (every step it observed is published)."""
        return self.store.check([self._key(rank, "status")])

    def never_steps(self, rank: int) -> int | None:
        """(Rank 0, once it stepped) rank `rank`'s backward passes if it ran more of them than
        this rank needed for its first step, without stepping: it does not step where this rank
        does (under DDP it then waits in its next backward's collective for this rank: waiting
        for it only times out). Else None."""
        first = self.own_first()
        sign = self.sign(rank) if first is not None else None
        if sign is None or sign[1] or sign[0] <= first:
            return None
        return sign[0]

    def finish(self, status: dict) -> None:
        """This rank is done observing: `status` says how it ended; with it, whether this rank
        ever stepped and, if not, its backward passes (`follow`)."""
        p = self.progress
        if p is not None:
            p.close()
            if not p.broken:
                status = {**status, "stepped": p.stepped, "backward_passes": p.backwards}
        self.store.set(self._key(self.rank, "status"), pickle.dumps(status))

    def collect(self, timeout: float) -> Gathered:
        """(Rank 0) every published step table not taken yet and each rank's status: rank 0
        waits up to `timeout` seconds for the other ranks' statuses, but not for a rank that
        never steps (`never_steps`), whose status then says so (`running`: still alive)."""
        deadline = time.monotonic() + timeout
        pending = set(range(self.world))
        held: dict[int, tuple[int, float, float]] = {}  # rank -> (count, changed at, found at)
        while pending:
            pending = {r for r in pending if not self.done(r)}
            now = time.monotonic()
            for r in pending:
                k, last = self.never_steps(r), held.get(r)
                if k is None:
                    held.pop(r, None)
                elif last is None or last[0] != k:
                    held[r] = (k, now, now if last is None else last[2])
            settled = {r for r, (_k, changed, found) in held.items()
                       if now - changed >= SETTLE or now - found >= SETTLE_AT_MOST}
            if pending <= settled or now > deadline:
                break
            time.sleep(0.02)
        got = Gathered([], {}, {}, {})
        for r in range(self.world):
            got.published[r] = ready = self.store.add(self._key(r, "ready"), 0)
            got.tables += [_table(self.store.get(self._key(r, f"step{i}")))
                           for i in range(self.taken[r], ready)]
            if r not in pending:
                got.statuses[r] = pickle.loads(self.store.get(self._key(r, "status")))
            elif r in held:  # alive, not stepping: it said so before its next backward
                got.statuses[r] = {"running": True, "stepped": False, "failure": None,
                                   "backward_passes": held[r][0], "optimizer_steps": 0,
                                   "observed": ready}
            else:
                got.statuses[r] = None
                sign = self.sign(r)
                if sign is not None:
                    got.signs[r] = sign
        return got

    def clear(self) -> None:
        """Free the keys rank 0 has read (the store lives as long as the job)."""
        for r in range(self.world):
            steps = self.store.add(self._key(r, "ready"), 0)
            for what in ["ready", "status", "rows", "alive",
                         *(f"step{i}" for i in range(self.taken[r], steps))]:
                try:
                    self.store.delete_key(self._key(r, what))
                except Exception:  # a store without delete (e.g. FileStore on some torch)
                    return


def _table(blob: bytes) -> pd.DataFrame:
    """A published step as the steps table's rows (`attrs["wiring"]`: its digest, if any)."""
    columns, wiring = pickle.loads(blob)
    table = pd.DataFrame(columns, columns=list(columns))
    if wiring is not None:
        table.attrs["wiring"] = wiring
    return table


def distributed() -> bool:
    """Whether this process is a rank of an initialised process group."""
    return dist.is_available() and dist.is_initialized()
