"""The two tables every layer speaks, written down once.

Measuring fills them, judging reads them, presenting shows them. A column documented here is
public (see docs/result.md, "The result"); adding one means adding it here first.
"""

from __future__ import annotations

import re

# name -> meaning. Order is the column order of the DataFrame.
# The result's schema (docs/result.md, "Schema version"): "<format>.<minor>". `FORMAT_VERSION`
# goes up when a field is removed, renamed or changes meaning (a diagkit that reads an older
# format refuses a newer one); the minor goes up when a field is added (readers ignore fields
# they do not know). `--json` and a saved folder's run.json carry it as `schema_version`; a test
# fails when a field changes and this does not (tests/core/test_schema_version.py).
FORMAT_VERSION = 1
SCHEMA_VERSION = f"{FORMAT_VERSION}.0"

PARAMS_COLUMNS: dict[str, str] = {
    "name": "first name model.named_parameters() gives the tensor; `<optimizer i group j #k>` "
            "for a tensor held by an optimizer but not by the model (in a whole run, one that "
            "left the model: `<head.weight, replaced at step 150>`); for a tensor in neither "
            "that gets gradients (unregistered), its path among the model's plain attributes "
            "(`cells[0].weight`) or `<unregistered #k shape dtype>`",
    "aliases": "tuple of the tensor's other names (tied weights, a module registered twice)",
    "module": "dotted name of the module that owns the tensor ('' for the root)",
    "module_type": "class name of that module",
    "shape": "tuple of ints",
    "numel": "number of elements",
    "bytes": "numel * element size",
    "dtype": "e.g. 'torch.float32'",
    "device": "e.g. 'cpu', 'cuda:0'",
    "placement": "how the tensor is split over ranks: '' for a plain tensor, else a DTensor's "
                 "placements (FSDP2: 'Shard(dim=0)'), 'ZeRO-3 partition' (DeepSpeed "
                 "ZeRO-3) or 'FSDP1 flat slice' (FullyShardedDataParallel with "
                 "use_orig_params=True): each rank holds a flat slice; shape, numel and bytes "
                 "are the whole "
                 "tensor's",
    "stage": "the ranks that hold the tensor ('1', '0,2') when the ranks do not all hold the "
             "same tensors (pipeline stages); '' when every rank holds it, and without ranks",
    "in_model": "the tensor is a parameter of the model (False with no memberships: "
                "unregistered)",
    "requires_grad": "requires_grad on the last observed step (at optimizer-step time)",
    "optimizer": "index of the first optimizer holding the tensor (<NA> if none)",
    "group": "index of the param group in that optimizer (<NA> if none)",
    "memberships": "tuple of (optimizer, group) pairs holding the tensor, decided by identity",
    "n_optimizers": "how many distinct optimizers hold the tensor",
    "lr": "learning rate of its (first) group on the last step (NaN if none)",
    "weight_decay": "weight decay of its (first) group (NaN if none)",
    "steps": "steps observed",
    "rg_steps": "steps on which it required grad",
    "used_steps": "steps on which autograd accumulated a gradient into it",
    "changed_steps": "steps on which its value changed (exact comparison)",
    "carried_steps": "steps whose first accumulation landed on a non-zero .grad",
    "nonfinite_steps": "steps on which its fresh gradient held NaN or Inf",
    "skipped_steps": "steps its optimizer skipped (steps.skipped): a loss scaler's overflow",
    "grad_norm": "fresh-gradient L2 norm on the last step it was used (NaN if never)",
    "grad_total_norm": "L2 norm of the .grad the optimizer saw on the last step (NaN if None)",
    "delta_norm": "mean over steps of the per-step change's L2 norm",
    "update_ratio": "mean over steps of delta_norm / norm of the value before the step",
    "verdicts": "tuple of verdict names, ('ok',) when none applies",
}

STEPS_COLUMNS: dict[str, str] = {
    "step": "0-based step index",
    "name": "tensor name, as in params.name",
    "requires_grad": "requires_grad when the first optimizer stepped (else at the end of the step)",
    "used": "autograd accumulated a gradient into it during the step (even an all-zero one)",
    "grad_norm": "L2 norm of the gradient produced during this step only (NaN if none); "
                 "exactly 0 only when every element is 0 (small values never underflow to 0)",
    "grad_total_norm": "L2 norm of the .grad the optimizer sees (NaN if None)",
    "carried_grad": "the step's first accumulation landed on a non-zero .grad from earlier",
    "delta_norm": "L2 norm of (value after the step - value before), in float64, never "
                  "overflowing: exactly 0 only when unchanged, inf when a value changed to or "
                  "from NaN or +-inf. delta='sampled': estimated from a fixed sample (NaN when "
                  "the change missed it, and for non-float dtypes); 'off': NaN",
    "update_ratio": "delta_norm / L2 norm of the value before (NaN if that is 0 or NaN)",
    "changed": "any element differs after the step (exact comparison: NaN equal to NaN, +0.0 "
               "to -0.0; bitwise for the fingerprinted tensors of delta='sampled'/'off')",
    "lr": "learning rate of its (first) group at optimizer-step time (NaN if none)",
    "nonfinite": "the step's fresh gradient held NaN or Inf",
    "skipped": "no optimizer holding it stepped, while one that holds it got gradients in the "
               "step (a loss scaler's skip after an overflow; see diagkit.measure.step.skips)",
}

# Present only in distributed runs (gathered from every rank).
DISTRIBUTED_STEPS_COLUMNS: dict[str, str] = {
    "rank": "the rank that observed the row",
    "checksum": "fingerprint of the tensor's value after the step (float64 sum and sum of "
                "squares): equal across ranks when the copies are equal",
}

# Columns holding tuples: stored as lists on disk, turned back into tuples on load.
# The `placement` of a DeepSpeed ZeRO-3 parameter: each rank holds a flat slice of it.
ZERO3_PARTITION = "ZeRO-3 partition"
# The `placement` of an FSDP1 original tensor (use_orig_params=True): each rank holds a slice.
FSDP1_SLICE = "FSDP1 flat slice"


def is_dtensor_placement(placement: str) -> bool:
    """Whether a `placement` value is a DTensor's (FSDP2, tensor parallelism)."""
    return placement not in ("", ZERO3_PARTITION, FSDP1_SLICE)


def former_name(name: str, how: str, step: int) -> str:
    """The name of a tensor a whole run saw leave the model at `step` (`how`: "replaced" when
    a tensor of its name took its place, else "removed"): `<head.weight, replaced at step 150>`."""
    return f"<{name}, {how} at step {step}>"


_FORMER = re.compile(r"<(?P<name>[^<>,]+), (?P<when>(?:replaced|removed) at step \d+)>")


def parse_former(name: str) -> tuple[str, str] | None:
    """(the name it had, "replaced at step 150") for a `former_name`; None for any other."""
    m = _FORMER.fullmatch(name)
    return (m["name"], m["when"]) if m else None


TUPLE_COLUMNS = ("aliases", "shape", "memberships", "verdicts")

# Boolean columns of the steps table (an empty table keeps these dtypes).
BOOL_STEP_COLUMNS = frozenset({"requires_grad", "used", "carried_grad", "changed", "nonfinite",
                               "skipped"})
