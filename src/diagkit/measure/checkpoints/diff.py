"""Two checkpoints measured against each other, tensor by tensor, streaming (see
`diagkit.measure.checkpoints.stream`): each tensor is compared in slices of at most `CHUNK`
elements, so peak memory is a few slices, not the two files. Measures files only: no model,
no hooks."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ...core.errors import DiagkitError
from .read import align_prefix
from .kind import open_checkpoint
from .stream import itemsize

CHUNK = 1 << 18  # elements of one tensor read, compared and released at a time


# name -> meaning. Order is the column order of `Comparison.table`.
COLUMNS: dict[str, str] = {
    "name": "tensor name (in A's spelling when only the `module.` prefix differs)",
    "module": "dotted name of the module that owns it ('' for the root)",
    "status": "changed, unchanged, only_in_a, only_in_b or shape_mismatch",
    "in_a": "present in checkpoint A",
    "in_b": "present in checkpoint B",
    "shape_a": "tuple of ints (None when absent)",
    "shape_b": "tuple of ints (None when absent)",
    "dtype_a": "e.g. 'torch.float32' (None when absent)",
    "dtype_b": "e.g. 'torch.float32' (None when absent)",
    "numel": "elements (B's when present, else A's)",
    "bytes": "numel * element size (B's when present, else A's)",
    "identical": "same shape and every element equal: bitwise when the dtypes agree, by value "
                 "when they differ",
    "max_abs_diff": "max |B - A| over elements (NaN unless the shapes agree)",
    "delta_norm": "L2 norm of B - A",
    "norm_a": "L2 norm of A",
    "relative_change": "delta_norm / norm_a (0 when identical, inf when A is all zeros)",
}


STATUSES = ("shape_mismatch", "unchanged", "only_in_a", "only_in_b", "changed")


def _row_blocks(shape: tuple[int, ...]):
    """(start, stop) row ranges of at most ~CHUNK elements; (None, None) for the whole tensor."""
    numel = math.prod(shape)
    if not shape or numel <= CHUNK:
        yield None, None
        return
    per_row = max(numel // shape[0], 1)
    step = max(CHUNK // per_row, 1)
    for start in range(0, shape[0], step):
        yield start, min(start + step, shape[0])


def _float64(x: torch.Tensor) -> torch.Tensor:
    return (torch.view_as_real(x) if x.is_complex() else x).reshape(-1).to(torch.float64)


def _measure(a, key_a, b, key_b, shape, same_dtype: bool) -> dict:
    identical, max_abs, delta_sq, a_sq = True, 0.0, 0.0, 0.0
    for start, stop in _row_blocks(shape):
        x, y = a.rows(key_a, start, stop), b.rows(key_b, start, stop)
        x64 = _float64(x)
        a_sq += float(torch.dot(x64, x64)) if x64.numel() else 0.0
        same = (torch.equal(x.view(torch.uint8), y.view(torch.uint8)) if same_dtype
                else torch.equal(x64, _float64(y)))
        if not same:
            identical = False
            d = (_float64(y) - x64).abs_()
            largest = float(d.max())  # NaN when an element is NaN: it stays NaN
            max_abs = largest if math.isnan(largest) else max(max_abs, largest)
            delta_sq += float(torch.dot(d, d))
            del d
        del x64
        a.pages.release(key_a, x)
        b.pages.release(key_b, y)
    norm_a, delta = math.sqrt(a_sq), (0.0 if identical else math.sqrt(delta_sq))
    if identical:
        relative = 0.0
    elif norm_a > 0:
        relative = delta / norm_a
    else:
        relative = math.inf if delta > 0 or math.isnan(delta) else 0.0
    return {"identical": identical, "max_abs_diff": 0.0 if identical else max_abs,
            "delta_norm": delta, "norm_a": norm_a, "relative_change": relative}


def _row(name, a, key_a, b, key_b) -> dict:
    row = {"name": name, "module": name.rsplit(".", 1)[0] if "." in name else "",
           "in_a": key_a is not None, "in_b": key_b is not None,
           "shape_a": None, "shape_b": None, "dtype_a": None, "dtype_b": None,
           "identical": False, "max_abs_diff": math.nan, "delta_norm": math.nan,
           "norm_a": math.nan, "relative_change": math.nan}
    metas = {}
    for side, file, key in (("a", a, key_a), ("b", b, key_b)):
        if key is not None:
            shape, dtype = file.meta(key)
            metas[side] = (shape, dtype)
            row[f"shape_{side}"], row[f"dtype_{side}"] = shape, str(dtype)
    shape, dtype = metas.get("b", metas.get("a"))
    row["numel"] = math.prod(shape)
    row["bytes"] = row["numel"] * itemsize(dtype)
    if key_a is None:
        row["status"] = "only_in_b"
    elif key_b is None:
        row["status"] = "only_in_a"
    elif metas["a"][0] != metas["b"][0]:
        row["status"] = "shape_mismatch"
    else:
        row.update(_measure(a, key_a, b, key_b, shape, metas["a"][1] == metas["b"][1]))
        row["status"] = "unchanged" if row["identical"] else "changed"
    return row


def _summary(table: pd.DataFrame, path_a: str, path_b: str) -> dict:
    status = table["status"]
    both = table["in_a"] & table["in_b"]
    size = table["bytes"]
    out = {"path_a": path_a, "path_b": path_b, "tensors": len(table),
           "in_both": int(both.sum()), "bytes": int(size.sum()),
           "bytes_in_both": int(size[both].sum())}
    for key in STATUSES:
        out[key] = int((status == key).sum())
        out[f"{key}_bytes"] = int(size[status == key].sum())
    out["dtype_mismatch"] = int((both & (table["dtype_a"] != table["dtype_b"])).sum())
    finite = table["relative_change"][status == "changed"]
    finite = finite[np.isfinite(finite)]
    out["max_relative_change"] = float(finite.max()) if len(finite) else None
    return out


def diff_checkpoints(path_a, path_b, trust: bool = False) -> tuple[pd.DataFrame, dict]:
    """(table of `COLUMNS`, totals) for checkpoint A (the earlier save) against B.

    Names that differ only by the DDP prefix `module.` are aligned (A's spelling is kept).
    Checkpoints with no name in common are not saves of one model: a one-line error.
    """
    a = open_checkpoint(path_a, trust)
    try:
        b = open_checkpoint(path_b, trust)
    except BaseException:
        a.close()
        raise
    try:
        keys_a = {k: k for k in a.keys()}
        keys_b = align_prefix({k: k for k in b.keys()}, set(keys_a))
        if not set(keys_a) & set(keys_b):
            raise DiagkitError(
                f"checkpoints {path_a} and {path_b} have no tensor name in common "
                f"({len(keys_a)} and {len(keys_b)} tensors, e.g. {next(iter(keys_a))!r} and "
                f"{next(iter(keys_b))!r}): they are not saves of the same model")
        names = list(keys_a) + [n for n in keys_b if n not in keys_a]
        rows = [_row(n, a, keys_a.get(n), b, keys_b.get(n)) for n in names]
    finally:
        a.close()
        b.close()
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table = table.astype({"numel": np.int64, "bytes": np.int64, "identical": bool,
                          "in_a": bool, "in_b": bool})
    return table, _summary(table, str(path_a), str(path_b))
