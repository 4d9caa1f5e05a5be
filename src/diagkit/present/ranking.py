"""How tables and figures rank tensors: the worst severity of a row, problems first, and the
module subtree a tensor belongs to. Shared by every presenter, so they all rank alike."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core import severity
from ..judge.verdicts import worst_verdict_severity


def row_severity(params: pd.DataFrame) -> pd.Series:
    """Worst severity per tensor row, aligned with params."""
    cache: dict[tuple, str] = {}
    out = []
    for vs in params["verdicts"]:
        key = tuple(vs)
        if key not in cache:
            cache[key] = worst_verdict_severity(key)
        out.append(cache[key])
    return pd.Series(out, index=params.index, dtype=object)


def problems_first(params: pd.DataFrame) -> np.ndarray:
    """Row positions: flagged tensors by severity then bytes (largest first), then the others
    in model order."""
    rank = row_severity(params).map(severity.rank).to_numpy()
    size = pd.to_numeric(params["bytes"], errors="coerce").fillna(0).to_numpy()
    position = np.arange(len(params))
    # flagged: sort on (-rank, -bytes, position); ok rows: model order after them
    key_size = np.where(rank > 0, -size, 0)
    return np.lexsort((position, key_size, -rank))


def subtree_labels(params: pd.DataFrame, depth: int = 1) -> pd.Series:
    """Module subtree of each tensor, `depth` levels deep.

    When every model tensor's name starts with the DDP wrapper prefix `module.`, levels are
    counted after it (depth 1 of `module.encoder.layer.0` is `module.encoder`). Tensors of the
    root module are '(root)'; tensors held by an optimizer only are '(not in model)'.
    """
    depth = max(int(depth), 1)
    modules = params["module"].fillna("").astype(str)
    in_model = (params["in_model"].astype(bool) if "in_model" in params
                else pd.Series(True, index=params.index))
    names = params["name"].astype(str)[in_model]
    skip = 1 if len(names) and names.str.startswith("module.").all() else 0

    def label(module: str) -> str:
        parts = module.split(".") if module else []
        if len(parts) <= skip:
            return "(root)"
        return ".".join(parts[:skip + depth])

    labels = modules.map(label)
    return labels.where(in_model, "(not in model)").astype(object)
