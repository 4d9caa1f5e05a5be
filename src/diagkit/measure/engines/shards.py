"""FSDP2's sharded parameters: what each rank measures, and how the ranks' parts combine.

Under `torch.distributed.fsdp.fully_shard` every parameter is a `DTensor` whose rank-local
shard (`to_local()`) is all this rank holds. The observer keeps the DTensor itself for identity
(optimizer membership is `is`, and names are the model's), and measures the local shard: the
probes snapshot it, gradients are read from `.grad.to_local()`, checksums are of the shard.
Arithmetic on the DTensor itself would dispatch collectives from inside a measurement.

At the end of each observed step the sharded tensors' measurements are combined over the
ranks holding the other shards, in one all-reduce per step and mesh (`combine`): squared L2
norms are summed (the norm of the whole tensor, exactly), and `changed`, `used` and the other
flags are OR-ed ("changed" if any shard changed). No value fingerprint is taken of a shard:
the ranks hold different parts by design, so there is nothing to compare (`spread`). Every rank's row then holds the whole tensor's values, so
folding ranks and comparing them (`diagkit.measure.tables.aggregate`) needs nothing new.
docs/distributed.md, "FSDP2", lists what is and is not supported.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from ...core.errors import DiagkitError
from .zero import PARTITION, is_partitioned, partition, partition_group


def _dtensor_module():
    """`torch.distributed.tensor` if it is loaded, else None. A tensor can only be a DTensor
    once that module is imported (by FSDP2, tensor parallelism, or the user), so diagkit never
    imports it itself (about 0.3 s in a process that builds no optimizer, such as `report
    --from` or `compare`; building a torch optimizer imports it anyway, through dynamo)."""
    return sys.modules.get("torch.distributed.tensor")


def is_sharded(t) -> bool:
    """Whether `t` is a DTensor (FSDP2, tensor parallelism): measured through its shard."""
    module = _dtensor_module()
    return module is not None and isinstance(t, module.DTensor)


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's part of `t` (`t` itself unless it is a DTensor): a view of its storage,
    so the optimizer's in-place updates of the DTensor show in it."""
    if t is None or not is_sharded(t):
        return t
    with torch.no_grad():
        return t.to_local()


def any_sharded(model: torch.nn.Module) -> bool:
    """Whether the model's parameters are DTensors (FSDP2): no DDP is to be wrapped around it,
    since FSDP2 reduces the gradients itself."""
    return any(is_sharded(p) for p in model.parameters())


def placement(t) -> str:
    """'' for a plain tensor, else the DTensor's placements or ZeRO-3's partition: the params
    table's `placement`."""
    if is_partitioned(t):
        return PARTITION
    return ", ".join(map(repr, t.placements)) if is_sharded(t) else ""


def reduce_dims(t) -> tuple[int, ...]:
    """The mesh dimensions over which `t` is split: its measurements are summed over them.

    Replicated dimensions (HSDP's outer one) already hold the whole of it. `_StridedShard`
    (FSDP2 over tensor parallelism, a 2-D mesh) splits the elements in another order, but
    still into disjoint parts: summed over its dimension as `Shard` is. A `Partial`
    placement holds addends, not parts: no norm of it combines exactly, so it is refused.
    """
    dims, module = [], _dtensor_module()  # loaded: `t` is a DTensor
    parts = tuple(c for c in (module.Shard, _strided_shard()) if c is not None)
    for d, placement in enumerate(t.placements):
        if isinstance(placement, parts):
            dims.append(d)
        elif not isinstance(placement, module.Replicate):
            raise DiagkitError(f"diagkit cannot observe a DTensor parameter with placement "
                               f"{placement!r} (only Shard, _StridedShard and Replicate): "
                               f"shape {tuple(t.shape)}")
    return tuple(dims)


def _strided_shard():
    """torch's `_StridedShard` placement class (private: None where a torch lacks it)."""
    types = sys.modules.get("torch.distributed.tensor.placement_types")
    return getattr(types, "_StridedShard", None)


def measured_parts(tensors: list, slices: dict | None = None) -> tuple["ShardCombiner", bool,
                                                                     list]:
    """(the combiner of the sharded tensors, whether any is a DTensor, what is measured of each
    tensor: itself, this rank's shard of a DTensor, or its ZeRO-3 partition). `slices`: k ->
    `measure.engines.fsdp1.Slice` of the FSDP1 tensors, each itself this rank's slice."""
    sharded = any(map(is_sharded, tensors))
    combiner = ShardCombiner(tensors, slices or {})
    if not sharded and not any(map(is_partitioned, tensors)):
        return combiner, False, tensors
    return combiner, sharded, [partition(t) if is_partitioned(t) else local(t) for t in tensors]


# The per-tensor values that are combined, in the order of the all-reduced vector.
_SUMMED = ("delta", "value", "grad", "total", "checksum")
_FLAGS = ("changed", "used", "nonfinite", "carried", "has_total")


class ShardCombiner:
    """The sharded tensors among `tensors`, grouped by (mesh, dims to reduce over), the FSDP1
    slices and the ZeRO-3 partitions, grouped by their process group. A partition's or a
    slice's values are combined, and a slice's `.grad` (FSDP1 reduce-scatters it); their fresh
    gradient is not: each rank's hook saw the whole local gradient before the engine reduced
    it, as under DDP, so it stays that rank's, folded as DDP's are."""

    def __init__(self, tensors: list[torch.Tensor], slices: dict | None = None):
        # (process groups to reduce over, tensors, device, what is combined: "all", "values",
        # "values and .grad")
        self.groups: list[tuple[list, np.ndarray, torch.device, str]] = []
        by_key: dict[tuple, list[int]] = {}
        meshes = {}
        for k, t in enumerate(tensors):
            if k in (slices or {}):  # an FSDP1 slice: everything summed, as FSDP2's shards
                meshes[key := ("fsdp1", id(slices[k].group))] = slices[k].group
                by_key.setdefault(key, []).append(k)
            elif is_partitioned(t):
                group = partition_group(t)
                meshes[key := ("zero3", id(group))] = group
                by_key.setdefault(key, []).append(k)
            elif is_sharded(t):
                dims = reduce_dims(t)
                if dims:
                    key = (id(t.device_mesh), dims)
                    meshes[key] = t.device_mesh
                    by_key.setdefault(key, []).append(k)
        for key, ks in by_key.items():
            ks_array = np.array(ks, dtype=np.int64)
            if key[0] == "zero3":
                self.groups.append(([meshes[key]], ks_array, partition(tensors[ks[0]]).device,
                                    "values"))
                continue
            if key[0] == "fsdp1":
                self.groups.append(([meshes[key]], ks_array, tensors[ks[0]].device,
                                    "values and .grad"))
                continue
            mesh = meshes[key]
            groups = [mesh.get_group(d) for d in key[1]]
            self.groups.append((groups, ks_array, local(tensors[ks[0]]).device, "all"))
        self.sharded = np.array(sorted(k for _, ks, _, _ in self.groups for k in ks),
                                dtype=np.int64)
        # The tensors whose value fingerprint is taken to compare ranks: not the sharded ones,
        # whose ranks hold different parts by design (a float64 pass over every shard per
        # step was most of watch's price under FSDP2: `benchmarks/README.md`, section G).
        self.n = len(tensors)
        self.fingerprinted = np.setdiff1d(np.arange(self.n), self.sharded).tolist()

    def spread(self, values: np.ndarray) -> np.ndarray:
        """The fingerprints read back for `fingerprinted`, over all tensors (0 where sharded,
        equal on every rank; zeros when none was taken)."""
        if len(values) == self.n:
            return values
        out = np.zeros(self.n)
        if len(values):
            out[self.fingerprinted] = values
        return out

    def __bool__(self) -> bool:
        return bool(self.groups)

    def combine(self, v: dict[str, np.ndarray]) -> None:
        """Replace the sharded rows of the per-tensor arrays in `v` by the whole tensor's.

        `v` holds delta, value (the norm before the step), grad, total, checksum, changed,
        used, nonfinite, carried (numpy arrays over all tensors), all updated in place; ratio
        is recomputed from the combined delta and value norms. A norm that is NaN because
        there was nothing to measure (unused: no gradient; no .grad) adds nothing.
        """
        import torch.distributed as dist

        for groups, ks, device, what in self.groups:
            if what != "all":
                _combine_values(v, ks, groups, device, with_grad=what == "values and .grad")
                continue
            used, total = v["used"][ks], v["total"][ks]
            has_total = ~np.isnan(total)
            cols = [np.square(v["delta"][ks]), np.square(v["value"][ks]),
                    np.where(used, np.square(v["grad"][ks]), 0.0),
                    np.where(has_total, np.square(total), 0.0), v["checksum"][ks],
                    v["changed"][ks], used, v["nonfinite"][ks], v["carried"][ks], has_total]
            vec = torch.tensor(np.column_stack(cols).astype(np.float64), device=device)
            for group in groups:
                dist.all_reduce(vec, group=group)
            out = vec.cpu().numpy()
            summed = dict(zip(_SUMMED, out[:, :len(_SUMMED)].T))
            flags = {name: col > 0 for name, col in zip(_FLAGS, out[:, len(_SUMMED):].T)}
            for name in ("changed", "used", "nonfinite", "carried"):
                v[name][ks] = flags[name]
            v["delta"][ks] = np.sqrt(summed["delta"])
            v["value"][ks] = value = np.sqrt(summed["value"])
            v["grad"][ks] = np.where(flags["used"], np.sqrt(summed["grad"]), np.nan)
            v["total"][ks] = np.where(flags["has_total"], np.sqrt(summed["total"]), np.nan)
            v["checksum"][ks] = summed["checksum"]
            with np.errstate(divide="ignore", invalid="ignore"):
                v["ratio"][ks] = np.where(value > 0, v["delta"][ks] / value, np.nan)


def _combine_values(v: dict[str, np.ndarray], ks: np.ndarray, groups: list, device,
                    with_grad: bool) -> None:
    """A partition's or slice's change and value norms summed over its ranks, `changed`
    OR-ed; `with_grad`: the `.grad` each rank holds a slice of too (its norm, `carried`). A
    rank that holds none of it (NaN: nothing measured) adds nothing."""
    import torch.distributed as dist

    total = v["total"][ks]
    has_total = ~np.isnan(total)
    cols = [np.square(v["delta"][ks]), np.square(v["value"][ks]), v["changed"][ks]]
    if with_grad:
        cols += [np.where(has_total, np.square(total), 0.0), has_total, v["carried"][ks]]
    vec = torch.tensor(np.column_stack(cols).astype(np.float64), device=device)
    for group in groups:
        dist.all_reduce(vec, group=group)
    out = vec.cpu().numpy()
    v["delta"][ks] = np.sqrt(out[:, 0])
    v["value"][ks] = value = np.sqrt(out[:, 1])
    v["changed"][ks] = out[:, 2] > 0
    if with_grad:
        v["total"][ks] = np.where(out[:, 4] > 0, np.sqrt(out[:, 3]), np.nan)
        v["carried"][ks] = out[:, 5] > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        v["ratio"][ks] = np.where(value > 0, v["delta"][ks] / value, np.nan)
