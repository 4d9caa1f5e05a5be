"""What diagkit cannot observe exactly, refused in one line before anything runs.

A verdict is only as good as the identity it rests on: optimizer membership is `is` between
the optimizer's tensors and the model's. Some engines break that on purpose. FSDP1 merges a
module's tensors into one flat parameter (with use_orig_params=True it keeps them, observed
through `measure.engines.fsdp1`); DeepSpeed ZeRO's optimizer holds flat fp32
partitions, and under ZeRO-3 the model's parameters are empty placeholders between forwards;
a custom optimizer wrapper may hold its own flat buffers. Judged as they stand, the whole model
would be `orphan` and the buffers `not_in_model`: confidently wrong. So each is refused here,
by name where the engine is known (`refuse_engines`), and by its signature where it is not
(`refuse_flat_buffers`). DeepSpeed ZeRO is observed through its own optimizer
(`measure.engines.zero`); what is refused of it is the torch optimizer under it, or a ZeRO-3 model
handed without ZeRO's optimizer. docs/distributed.md, "Engines: what is observed, what is
refused", has the table.
Duck-typed: no engine is imported.
"""

from __future__ import annotations

import torch

from ...core.errors import DiagkitError
from .zero import is_zero

SUPPORTED = ("Supported: DDP, FSDP2 (torch.distributed.fsdp.fully_shard), FSDP1 with "
             "use_orig_params=True, tensor parallelism (DTensor parameters), DeepSpeed ZeRO 1-3 "
             "(the engine and its optimizer), or a plain module")


def refuse_engines(model: torch.nn.Module, optimizers: list, fsdp1: dict) -> None:
    """The engines known by name: FSDP1 with `use_orig_params=False`, its flat parameters
    wherever they are found, and its original tensors away from their units (`fsdp1`: those
    watched through their units, `measure.engines.fsdp1.slices`); a DeepSpeed engine inside the model,
    and ZeRO-3's partitioned parameters without ZeRO's optimizer (whose groups alone hold
    them)."""
    for module in model.modules():
        kind = type(module).__name__
        if kind == "FullyShardedDataParallel" and not getattr(module, "_use_orig_params", False):
            raise DiagkitError(_fsdp1_line(module))
        if kind == "DeepSpeedEngine":
            raise DiagkitError(
                "diagkit watches a DeepSpeed engine passed as the model itself "
                "(watch(engine) or watch(engine, engine.optimizer)), not one inside another "
                f"module. {SUPPORTED}")
    zero = any(is_zero(getattr(opt, "zero", None)) for opt in optimizers)
    held = [t for opt in optimizers for g in opt.param_groups for t in g["params"]]
    for tensor in [*model.parameters(), *held]:
        if _fsdp1_flattened(tensor) and id(tensor) not in fsdp1:
            raise DiagkitError(
                "diagkit does not observe FSDP1's flat parameters away from their "
                "FullyShardedDataParallel: this module (or its optimizer) holds FSDP1's "
                "flattened tensors (a FlatParameter, which merges the model's tensors into one, "
                "or with use_orig_params=True views into one, whose gradients reach only the "
                "views FSDP makes inside its forward), so gradients and optimizer membership "
                "are not per tensor here (a module taken from under FullyShardedDataParallel is "
                "still flattened): pass the FullyShardedDataParallel model itself, built with "
                f"use_orig_params=True. {SUPPORTED}")
        if (hasattr(tensor, "ds_id") or hasattr(tensor, "ds_tensor")) and not zero:
            raise DiagkitError(
                "diagkit observes DeepSpeed ZeRO-3's partitioned parameters only with ZeRO's "
                "own optimizer, whose groups hold them (the torch optimizer under it holds flat "
                "partitions): pass the engine, watch(engine), or watch(engine.module, "
                f"engine.optimizer). {SUPPORTED}")


def _fsdp1_flattened(tensor) -> bool:
    """FSDP1 marks its FlatParameter and, with use_orig_params=True, the original tensors
    it views (`_fsdp_flattened`, torch's own mark, so they are not flattened twice)."""
    return (getattr(tensor, "_fsdp_flattened", False) or getattr(tensor, "_is_flat_param", False)
            or type(tensor).__name__ == "FlatParameter")


def _fsdp1_line(module) -> str:
    """One accurate line for an FSDP1 model built with use_orig_params=False."""
    return ("diagkit does not observe FSDP1 (FullyShardedDataParallel) models built with "
            "use_orig_params=False: their flat parameters replace the model's tensors, so "
            "names, gradients and optimizer membership are not per tensor. Build it with "
            f"use_orig_params=True. {SUPPORTED}")


def refuse_flat_buffers(tensors: list[torch.Tensor], rows: list[dict]) -> None:
    """An engine or optimizer wrapper diagkit does not know, by its signature: every tensor
    the optimizers hold is 1-D, none of the model's and of none of its shapes, and together
    (times the ranks, each holding its partition) they have about as many elements as the
    model's trainable tensors, which no optimizer holds. The real bugs that look alike keep
    something of the model: a stale head after a rebuild keeps its shapes, a module kept in a
    plain list its 2-D weights, a scalar passed to forward sits beside held tensors. A model
    with no trainable tensor at all has nothing for buffers to stand in for: whatever its
    optimizers hold (a stray tensor beside a frozen model), it is judged, and the finding is
    `nothing_trains`, not an engine."""
    held = [k for k, row in enumerate(rows) if row["memberships"]]
    shapes = {row["shape"] for row in rows if row["in_model"]}
    if not held or any(rows[k]["in_model"] or tensors[k].dim() != 1
                       or rows[k]["shape"] in shapes for k in held):
        return
    unheld = sum(row["numel"] for row in rows if row["in_model"] and row["requires_grad"])
    if not unheld:
        return
    world = _world()
    flat = sum(rows[k]["numel"] for k in held)
    if not unheld / 2 <= flat * world <= 2 * unheld + 1024 * world:  # ZeRO pads partitions
        return
    raise DiagkitError(
        f"diagkit cannot observe this optimizer exactly: it holds {len(held)} flat 1-D "
        f"tensor{'s' * (len(held) > 1)} ({flat:,} elements) that are none of the model's, and "
        f"none of the model's trainable tensors ({unheld:,} elements): the flat buffers of an "
        "engine or optimizer wrapper diagkit does not know (ZeRO partitions, a flattening "
        "wrapper), so every verdict about membership would be wrong. Pass the torch "
        "optimizer over the model's own parameters (under DeepSpeed: the engine, or "
        f"engine.optimizer, never the torch optimizer ZeRO wraps). {SUPPORTED}")


def _world() -> int:
    """The process group's size (1 without one): a rank's flat partition is a share."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
