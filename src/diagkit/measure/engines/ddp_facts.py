"""What DistributedDataParallel itself reports about a wrapped model: the second opinion beside
diagkit's own observation (which tensors DDP syncs, how many bytes it found unused, whether a
static graph is possible). Used by `--nproc` and by `watch` alike.

Beside DDP's logging data, two facts about the model as it is now against DDP as it was built,
so that a tensor whose values drift apart between ranks is explained by what was seen
(`judge.rules_ranks`): `replaced`, the parameters that are not the tensors DDP was built with
(assigned anew after wrapping; names as `ddp.module.named_parameters()` gives them), and
`trainable_now`, how many of the tensors DDP was built with require grad now (more than
`num_parameter_tensors`, the ones DDP averages: some were unfrozen after wrapping).
"""

from __future__ import annotations

_KEEP = ("unused_parameter_size", "can_set_static_graph", "find_unused_parameters",
         "static_graph", "num_parameter_tensors", "total_parameter_size_bytes",
         "bucket_sizes", "has_rebuilt_buckets", "comm_hook", "backend_name")
MAX_NAMES = 50  # replaced parameters named in the facts (their count is always given)


def ddp_facts(ddp) -> dict:
    """DDP's own logging data (unused_parameter_size, can_set_static_graph, ...) and the
    wiring facts above, or {}."""
    if ddp is None:
        return {}
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:  # private API: absent or changed in this torch
        return {}
    return {**{k: data[k] for k in _KEEP if k in data}, **_wiring(ddp)}


def _wiring(ddp) -> dict:
    """`replaced`, `replaced_count` and `trainable_now` (see the module's docstring), by
    identity: DDP keeps the parameter objects it was built with (`_module_parameters`)."""
    built = getattr(ddp, "_module_parameters", None)
    if built is None:  # private attribute: absent in this torch
        return {}
    ignored = getattr(ddp, "parameters_to_ignore", set())
    ids = {id(p) for p in built}
    replaced = [n for n, p in ddp.module.named_parameters()
                if n not in ignored and id(p) not in ids]
    return {"replaced": replaced[:MAX_NAMES], "replaced_count": len(replaced),
            "trainable_now": sum(bool(p.requires_grad) for p in built)}
