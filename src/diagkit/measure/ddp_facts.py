"""What DistributedDataParallel itself reports about a wrapped model: the second opinion beside
diagkit's own observation (which tensors DDP syncs, how many bytes it found unused, whether a
static graph is possible). Used by `--nproc` and by `watch` alike."""

from __future__ import annotations

_KEEP = ("unused_parameter_size", "can_set_static_graph", "find_unused_parameters",
         "static_graph", "num_parameter_tensors", "total_parameter_size_bytes",
         "bucket_sizes", "has_rebuilt_buckets", "comm_hook", "backend_name")


def ddp_facts(ddp) -> dict:
    """DDP's own logging data (unused_parameter_size, can_set_static_graph, ...), or {}."""
    if ddp is None:
        return {}
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:  # private API: absent or changed in this torch
        return {}
    return {k: data[k] for k in _KEEP if k in data}
