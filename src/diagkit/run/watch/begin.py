"""What a watch takes as it begins, before any hook is set (`taken`): the objects under the
wrappers the loop holds, their inventory, where the optimizers' groups were built
(`group_sources`), the user's names for the objects (`user_names`) and the process group's
channel to rank 0 (`opened_channel`); and the DDP wrapper whose facts the result reports
(`ddp_model`)."""

from __future__ import annotations

import torch

from ...core.errors import DiagkitError
from ...measure.engines.unwrap import compiled_entry
from ...measure.model.inventory import take_inventory
from ...measure.origin.provenance import watch_sources
from ...measure.origin.watch_call import watch_names
from ..diagnose.gather import RankChannel, distributed
from .ends import replace_earlier
from .options import unwrapped


def taken(w, model, optimizer_or_list, *, caller, sources, halt_on) -> tuple:
    """Set on watch `w` what it watches, each as it is taken (a failure leaves on it what was
    taken before, which its failed result says): the wrappers, the compiled entry, the
    inventory, the groups' sources, the user's names, the channel. Returns (the module under
    the wrappers, the torch optimizers). A `DiagkitError` is what the user passed (or an
    engine diagkit refuses); an earlier watch on the same objects is stopped first (a cell
    run again: one watch)."""
    inner, w.wrappers, optimizers = unwrapped(model, optimizer_or_list)
    replace_earlier(w, inner, optimizers)
    w.entry = compiled_entry(model)  # a compiled model's forward hook: on its wrapper
    w.inventory = take_inventory(inner, optimizers)
    w.sources = group_sources(caller, optimizers, sources)
    w.names = user_names(caller, model, inner, optimizers, w.names)  # meta["names"]
    w.channel = opened_channel(w.inventory, optimizers, halt_on)
    return inner, optimizers


def group_sources(caller, optimizers, sources) -> list:
    """Where the optimizers' groups were built: `sources` recorded by a callback as the trainer
    built them, else read from the caller's `watch(...)` statement (`caller`: its frame)."""
    if sources is not None:
        return sources
    return watch_sources(caller, optimizers) if caller is not None else []


def user_names(caller, model, inner, optimizers, names) -> dict:
    """The user's names for the model and optimizers, which the fixes say (README, "Reading a
    finding"): `names` given, else read from the caller's `watch(...)` statement."""
    if not names and caller is not None:
        return watch_names(caller, model, inner, len(optimizers))
    return names


def opened_channel(inventory, optimizers, halt_on) -> RankChannel | None:
    """The channel to rank 0 under a process group (None without one), this rank's rows and
    tensors on it. A `DiagkitError` for nothing to watch, or `halt_on` under a process group."""
    if not inventory.tensors:
        raise DiagkitError("the model has no parameters and the optimizers hold none: "
                           "nothing to watch")
    channel = RankChannel() if distributed() else None
    if halt_on is not None and channel is not None:
        raise DiagkitError("halt_on cannot be used under a process group: a rank that "
                           "stops training alone leaves the others waiting in their "
                           "collectives (docs/whole-run.md, \"The whole run\")")
    if channel is not None:  # rank 0 joins them: pipeline stages differ
        channel.publish_rows(inventory.rows)
        channel.follow(inventory.tensors, optimizers)  # a rank that never steps
    return channel


def ddp_model(model, wrappers: list[str]):
    """The DistributedDataParallel the loop holds (its facts join the result), or None."""
    return (model if isinstance(model, torch.nn.Module)
            and "DistributedDataParallel" in wrappers else None)
