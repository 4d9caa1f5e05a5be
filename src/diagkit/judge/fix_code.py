"""Code a fix gives to paste: it changes the live model and optimizers in place, by the user's
own names (`wording.Roots`), so that the next watch of the same loop is clean.

Each helper returns lines of Python that run as they are, pasted after the optimizer was built
(`tests/judge/test_fix_code.py` parses every fix's code, and runs the orphan's). Tensors are
named by identity (`p is q`), never compared with `==` or `in` (a tensor's `==` is
element-wise).
"""

from __future__ import annotations

import pandas as pd

from .homes import group_settings, home_groups, no_decay_kind
from .wording import accessor, iter_expr, params_expr, roots

_EXPLICIT = 3  # tensors of one subtree listed one by one; past it, a filter on .parameters()


def join(label: str, group: pd.DataFrame, root=None,
         optimizer: str | None = None) -> tuple[str, str] | None:
    """(words, code) that put the tensors of an orphan's finding into the groups that fit them
    (`judge.homes`: the weight decay of their kind, then their neighbours'), None when no
    optimizer holds any tensor. `root`, `optimizer`: what the code calls the model and the
    (only) optimizer, else the user's names (`wording.roots`)."""
    ctx = group.attrs.get("context")
    params = getattr(ctx, "params", None)
    if params is None:
        return None
    homes = home_groups(params, list(group["name"]))
    if not homes:
        return None
    r = roots(group)
    root = r.model if root is None else root
    by_pair: dict[tuple[int, int], list[str]] = {}
    fallback = min(homes.values())
    for name in group["name"]:
        by_pair.setdefault(homes.get(name, fallback), []).append(name)
    settings = group_settings(params)
    lines, said = [], []
    for (i, j), names in sorted(by_pair.items()):
        target = f'{optimizer or r.optimizer(i)}.param_groups[{j}]["params"]'
        lines.append(target + _added(label, group, names, len(by_pair), root))
        said.append(_group_words(i, j, settings.get((i, j), {}), r, several=_optimizers(params)))
    plural = "s" if len(by_pair) > 1 else ""
    words = (f"Add it to the optimizer group{plural} that fit{'' if plural else 's'} it "
             f"({'; '.join(said)}):")
    return words, "\n".join(lines)


def _added(label, group, names, pairs, root) -> str:
    """`.append(x)` / `.extend(...)` of `names` (all of the finding's, or one kind of them)."""
    whole = (label and group["in_model"].all() and group.attrs.get("whole", True)
             and len(group) > 1)
    if whole and pairs == 1:
        return f".extend({accessor(label, root)}.parameters())"
    if len(names) == 1:
        return f".append({accessor(names[0], root)})"
    mine = set(names)
    facts = list(zip(*(group[c].tolist() for c in ("name", "shape", "module_type"))))
    kinds = {no_decay_kind(n, s, t) for n, s, t in facts if n in mine}
    by_dims = all(no_decay_kind(n, s, t) == (len(s) < 2) for n, s, t in facts if s is not None)
    if whole and len(names) > _EXPLICIT and len(kinds) == 1 and by_dims:
        test = "p.dim() < 2" if kinds == {True} else "p.dim() >= 2"
        return f".extend(p for p in {accessor(label, root)}.parameters() if {test})"
    return f".extend([{', '.join(accessor(n, root) for n in names)}])"


def _group_words(i, j, setting: dict, r, several: bool) -> str:
    """"group 1: lr 0.05, weight_decay 0" (with the optimizer's name when there are several)."""
    which = f"{r.optimizer(i)} group {j}" if several else f"group {j}"
    values = [f"{k} {_g(setting.get(k))}" for k in ("lr", "weight_decay")
              if setting.get(k) is not None]
    return which + (": " + ", ".join(values) if values else "")


def freeze(label: str, group: pd.DataFrame, root=None) -> str:
    """A loop that freezes the finding's tensors."""
    return f"for p in {iter_expr(label, group, root)}: p.requires_grad_(False)"


def drop_frozen(group: pd.DataFrame) -> str:
    """Lines that take every tensor that no longer requires grad out of the optimizers that
    hold the finding's tensors (one line per optimizer)."""
    r = roots(group)
    return "\n".join(f'for g in {r.optimizer(i)}.param_groups: g["params"] = '
                     '[p for p in g["params"] if p.requires_grad]'
                     for i in holders(group))


def drop_from(label: str, group: pd.DataFrame, optimizers) -> str:
    """Lines that take the finding's tensors out of `optimizers` (indices), by identity."""
    r = roots(group)
    listed = params_expr(label, group)
    return "\n".join(f'for g in {r.optimizer(i)}.param_groups: g["params"] = '
                     f'[p for p in g["params"] if all(p is not q for q in {listed})]'
                     for i in optimizers)


def drop_stale(group: pd.DataFrame) -> str:
    """Lines that keep, in the optimizers holding the finding's tensors, only the model's own
    tensors, and forget the state of the rest: tensors a whole run saw replaced have no name
    left to reach them by, only their absence from the model."""
    r = roots(group)
    lines = [f"keep = {{id(p) for p in {r.whole()}.parameters()}}"]
    for i in holders(group):
        opt = r.optimizer(i)
        lines += [f'for g in {opt}.param_groups: g["params"] = '
                  '[p for p in g["params"] if id(p) in keep]',
                  f"for p in [p for p in {opt}.state if id(p) not in keep]: del {opt}.state[p]"]
    return "\n".join(lines)


def to_no_decay(label: str, group: pd.DataFrame) -> str | None:
    """Lines that move the finding's tensors out of their decaying group into one without
    weight decay: an existing one of the same optimizer and lr, else a copy of their group's
    settings with weight_decay 0. None when they are not all in one optimizer's one group."""
    ctx = group.attrs.get("context")
    params = getattr(ctx, "params", None)
    pairs = {tuple(ms[0]) for ms in group["memberships"] if ms is not None and len(ms)}
    if params is None or len(pairs) != 1:
        return None
    (i, j), = pairs
    r = roots(group)
    opt = r.optimizer(i)
    settings = group_settings(params)
    lr = settings.get((i, j), {}).get("lr")
    home = next((k for (o, k), s in sorted(settings.items()) if o == i and k != j
                 and s.get("weight_decay") == 0 and s.get("lr") == lr), None)
    lines = [f"no_decay = {params_expr(label, group)}",
             f'for g in {opt}.param_groups: g["params"] = '
             '[p for p in g["params"] if all(p is not q for q in no_decay)]']
    if home is not None:
        lines.append(f'{opt}.param_groups[{home}]["params"].extend(no_decay)')
    else:
        lines.append(f'{opt}.add_param_group({{**{{k: v for k, v in {opt}.param_groups[{j}]'
                     '.items() if k != "params"}, "params": no_decay, "weight_decay": 0.0})')
    return "\n".join(lines)


def holders(group: pd.DataFrame) -> list[int]:
    """The optimizers holding any of the finding's tensors, in order."""
    return sorted({int(o) for ms in group["memberships"] if ms is not None for o, _ in ms})


def _optimizers(params: pd.DataFrame) -> bool:
    """Whether more than one optimizer holds tensors (then a group is named with its own)."""
    return len({int(o) for ms in params["memberships"] if ms is not None for o, _ in ms}) > 1


def _g(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
