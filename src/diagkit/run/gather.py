"""Every rank's observations to rank 0, through the user's own process group.

Each rank publishes what it observed as it goes (its steps, one table per observed step, and at
its end its status) to the process group's key-value store: the rendezvous store that
torch.distributed itself uses, reachable from every node whatever the backend. Rank 0 then
collects. Going through the store rather than a collective means that a rank that died or hangs
cannot block rank 0 beyond `timeout`: rank 0 keeps every step each rank published, and names
the ranks it did not hear from.
"""

from __future__ import annotations

import pickle
import time

import pandas as pd
import torch.distributed as dist

from ..core.errors import DiagkitError

_SERIAL = {"n": 0}  # watches started by this process; every rank starts them in the same order


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
        the ranks' by name (`measure.aggregate.join_rank_rows`: pipeline stages hold
        different tensors)."""
        self.store.set(self._key(self.rank, "rows"), pickle.dumps(rows))

    def rows(self, own: list[dict]) -> list[dict]:
        """(Rank 0) every rank's rows joined, this rank's being `own`; a rank that published
        none (yet) adds nothing."""
        from ..measure.aggregate import join_rank_rows
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

    def finish(self, status: dict) -> None:
        """This rank is done observing: `status` says how it ended."""
        self.store.set(self._key(self.rank, "status"), pickle.dumps(status))

    def collect(self, timeout: float
                ) -> tuple[list[pd.DataFrame], dict[int, dict | None], dict[int, int]]:
        """(every published step table not taken yet, each rank's status or None, how many
        steps each rank published in all): rank 0 waits up to `timeout` seconds for the other
        ranks' statuses."""
        deadline = time.monotonic() + timeout
        pending = list(range(self.world))
        while pending:
            pending = [r for r in pending if not self.store.check([self._key(r, "status")])]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        tables, statuses, published = [], {}, {}
        for r in range(self.world):
            published[r] = ready = self.store.add(self._key(r, "ready"), 0)
            tables += [_table(self.store.get(self._key(r, f"step{i}")))
                       for i in range(self.taken[r], ready)]
            statuses[r] = (pickle.loads(self.store.get(self._key(r, "status")))
                           if r not in pending else None)
        return tables, statuses, published

    def clear(self) -> None:
        """Free the keys rank 0 has read (the store lives as long as the job)."""
        for r in range(self.world):
            steps = self.store.add(self._key(r, "ready"), 0)
            for what in ["ready", "status", "rows",
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
