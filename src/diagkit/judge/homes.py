"""Which optimizer group a tensor no optimizer holds should join: its home.

One choice for both the orphan's fix (the code a user pastes) and `--try-fix` (which applies it
to a fresh copy), so that what is previewed is what is advised (README, "Reading a finding").

A group fits a tensor when its weight decay is one the user gives tensors of that kind: a
bias, a normalization weight or any tensor of fewer than two dimensions is "no-decay" kind,
every other tensor "decay" kind (a no-decay-kind tensor also fits a group without weight decay).
Among the groups that fit (all of them when none does), the home is the one holding most of
the tensors under the deepest module above the tensor that holds any: its own module's
siblings first, else its parent's, up to the whole model. So a model split into a decay and a
no-decay group sends a bias to the no-decay one, not to the group of its sibling weight (AdamW's
default weight_decay=0.01 on a tensor the user kept out of weight decay); a model split by
module (another lr for the head) sends it to its own module's group. Pure: reads the params
table only.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

Pair = tuple[int, int]


def no_decay_kind(name: str, shape, module_type) -> bool:
    """A tensor usually kept out of weight decay: a bias, a normalization module's weight, or
    any tensor of fewer than two dimensions (a gain, a scale, a gate)."""
    dims = len(shape) if shape is not None else 2
    return dims < 2 or str(name).endswith("bias") or "Norm" in str(module_type or "")


def home_groups(params: pd.DataFrame, names) -> dict[str, Pair]:
    """{name: (optimizer, group)} for each tensor of `names` in `params`: the group it should
    join (module docstring). {} when no optimizer holds any tensor."""
    held = _held(params)
    if not held:
        return {}
    decay = _group_decay(params)
    kinds: dict[bool, set] = {True: set(), False: set()}  # kind -> the decays it is given
    for pair, kind in held_kinds(params):
        if pair in decay:
            kinds[kind].add(decay[pair])
    under = _under(held)
    wanted, homes = set(names), {}
    for name, module, shape, mtype in zip(*_columns(params, "name", "module", "shape",
                                                    "module_type")):
        if name not in wanted:
            continue
        kind = no_decay_kind(name, shape, mtype)
        fits = {p for p, wd in decay.items()
                if wd in kinds[kind] or (kind and wd == 0)} or set(decay)
        homes[name] = _nearest(module, under, fits)
    return homes


def group_settings(params: pd.DataFrame) -> dict[Pair, dict]:
    """{(optimizer, group): {"lr", "weight_decay"}} as the params table shows them (of the
    tensors whose first group it is); a value not known is None."""
    out: dict[Pair, dict] = {}
    for pairs, lr, wd in zip(*_columns(params, "memberships", "lr", "weight_decay")):
        pairs = _pairs(pairs)
        if pairs and pairs[0] not in out:
            out[pairs[0]] = {"lr": _number(lr), "weight_decay": _number(wd)}
    return out


def held_kinds(params: pd.DataFrame) -> list[tuple[Pair, bool]]:
    """(first group, no-decay kind) of each tensor an optimizer holds."""
    return [(_pairs(pairs)[0], no_decay_kind(n, s, t))
            for n, s, t, pairs in zip(*_columns(params, "name", "shape", "module_type",
                                                "memberships")) if _pairs(pairs)]


def _held(params: pd.DataFrame) -> list[tuple[str, Pair]]:
    """(module, first group) of each tensor of the model an optimizer holds."""
    return [(m, _pairs(pairs)[0]) for m, pairs, inside in zip(
        *_columns(params, "module", "memberships", "in_model")) if _pairs(pairs) and bool(inside)]


def _group_decay(params: pd.DataFrame) -> dict[Pair, float]:
    """Each group's weight decay (0 when the table has none for it)."""
    return {p: (s["weight_decay"] or 0.0) for p, s in group_settings(params).items()}


def _under(held) -> dict[str, Counter]:
    """module -> how many tensors each group holds in it or below it ('' : the whole model).
    Indexed once, so each tensor's search is a few lookups (a 70B model's hundreds of orphan
    modules)."""
    under: dict[str, Counter] = {}
    for module, pair in held:
        parts = module.split(".") if module else []
        for depth in range(len(parts) + 1):
            under.setdefault(".".join(parts[:depth]), Counter())[pair] += 1
    return under


def _nearest(module: str, under: dict[str, Counter], fits: set) -> Pair:
    """The fitting group holding most tensors under the deepest ancestor of `module` that has
    any fitting group's tensor (ties: the lowest optimizer and group)."""
    parts = module.split(".") if module else []
    for depth in range(len(parts), -1, -1):
        counts = under.get(".".join(parts[:depth]), Counter())
        mine = [(n, p) for p, n in counts.items() if p in fits]
        if mine:
            return min(mine, key=lambda c: (-c[0], c[1]))[1]
    return min(fits)


def _columns(params: pd.DataFrame, *names: str) -> list[list]:
    """Columns as lists: a row at a time from an arrow-backed column costs a call each."""
    return [params[n].tolist() for n in names]


def _pairs(pairs) -> list[Pair]:
    if pairs is None:
        return []
    return [(int(o), int(g)) for o, g in pairs]


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number
