"""Words shared by the verdicts' explanations: a tensor group as a subject, code to paste that
reaches the tensors by the user's own names (`Roots`), and how a gradient norm moved over the
steps."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.format import human_bytes
from ..measure.origin.watch_call import simple_expression


def accessor(name: str, root="model") -> str:
    """`layers.0.weight` -> `model.layers[0].weight`: code the user can paste. `root`: what the
    user's code calls the model, or for a dict of modules {key: expression}."""
    if isinstance(root, dict):
        key, _, rest = name.partition(".")
        if key not in root:
            return accessor(name)
        return accessor(rest, root[key])
    if not name:
        return root
    out = root
    for part in name.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if part.isidentifier()
                                                   else f".get_submodule({part!r})")
    return out


class Roots:
    """What a fix's code calls the model and each optimizer: the user's own expressions
    (`meta["names"]` of a watch, `measure.origin.watch_call`), else `model` and `optimizer`. A name
    that is not a simple expression (a saved file edited by hand) is not used."""

    def __init__(self, names: dict | None = None):
        names = names if isinstance(names, dict) else {}
        model = names.get("model")
        if isinstance(model, dict):
            model = {k: v for k, v in model.items()
                     if isinstance(k, str) and k.isidentifier() and simple_expression(v)} or None
        self.model = model if isinstance(model, dict) or simple_expression(model) else "model"
        given = names.get("optimizers")
        self._optimizers = [o if simple_expression(o) else None
                            for o in (given if isinstance(given, list) else [])]

    def optimizer(self, index: int = 0) -> str:
        """The code's name for optimizer `index` (in the watch's order)."""
        if 0 <= index < len(self._optimizers) and self._optimizers[index]:
            return self._optimizers[index]
        return "optimizer"

    def whole(self) -> str:
        """The model as one expression (a dict of modules has none: `model`)."""
        return self.model if isinstance(self.model, str) else "model"


def roots(group: pd.DataFrame) -> Roots:
    """The names a finding's fix uses, from its context (`judge.findings.FindingContext`)."""
    return Roots(getattr(group.attrs.get("context"), "names", None))


def subject(label: str, group: pd.DataFrame) -> str:
    size = human_bytes(int(group["bytes"].sum()))
    if len(group) == 1:
        return f"`{group['name'].iloc[0]}` ({size})"
    where = f"`{label}`" if label else "the whole model"
    if not group.attrs.get("whole", True):
        # "a set of": one subject, so the verbs after it ("is held", "requires") agree
        where = (f"a set of {len(group)} tensors in {where}" if label
                 else f"a set of {len(group)} tensors")
        return f"{where} ({size}; e.g. `{group['name'].iloc[0]}`)"
    return f"{where} ({len(group)} tensors, {size})"


def iter_expr(label: str, group: pd.DataFrame, root=None) -> str:
    """Something to loop over in a fix: the module's .parameters() when a subtree is whole."""
    root = roots(group).model if root is None else root
    if len(group) > 1 and label and group["in_model"].all() and group.attrs.get("whole", True):
        return f"{accessor(label, root)}.parameters()"
    return params_expr(label, group, root)


def params_expr(label: str, group: pd.DataFrame, root=None) -> str:
    """The group's tensors as a list to paste, on `root` (what the code there calls the
    model: `self` inside a LightningModule's hook, say; None: the user's name, `roots`)."""
    root = roots(group).model if root is None else root
    if len(group) == 1:
        return f"[{accessor(group['name'].iloc[0], root)}]"
    if label and group["in_model"].all() and group.attrs.get("whole", True):
        return f"list({accessor(label, root)}.parameters())"
    return "[" + ", ".join(accessor(n, root) for n in group["name"]) + "]"


def trend(steps: pd.DataFrame, names, column: str) -> str:
    """How the norm over `names` of a per-step norm `column` moved: "1 → 3 over 3 steps".

    Only steps where it was measured and is non-zero count: NaN means nothing was measured (no
    gradient), and a zero trajectory shows nothing, so neither is ever printed as "nan → nan"
    or "0 → 0"; "" when no step is left, one number when one is.
    """
    s = steps[steps["name"].isin(set(names))]
    values = pd.to_numeric(s[column], errors="coerce").to_numpy(dtype=float)
    keep = np.isfinite(values)
    if not keep.any():
        return ""
    per_step = (pd.Series(values[keep] ** 2, index=s["step"].to_numpy()[keep])
                .groupby(level=0).sum() ** 0.5)
    per_step = per_step[per_step > 0]
    if per_step.empty:
        return ""
    if len(per_step) < 2:
        return f"{per_step.iloc[0]:.3g}"
    return f"{per_step.iloc[0]:.3g} → {per_step.iloc[-1]:.3g} over {len(per_step)} steps"
