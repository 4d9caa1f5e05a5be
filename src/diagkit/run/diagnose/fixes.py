"""The fixes `--try-fix` applies: a plan made from a diagnosis, then applied to a fresh copy.

The plan is plain data (one dict per finding, tensors named as in `params.name`), so the same
plan is applied in this process or, under `--nproc`, by every rank to its own fresh copy.
Names are stable across builds of the same target; param groups are found by identity in the
fresh copy's optimizers. Nothing here touches the objects the diagnosis was made from.
"""

from __future__ import annotations

import torch

from ...core.errors import DiagkitError
from ...judge.homes import home_groups
from ...measure.model.inventory import take_inventory

# verdict -> the action its fix is, in memory (`apply_plan`).
ACTIONS = {
    "orphan": "join_group",
    "unused": "freeze_drop",
    "ddp_unused_parameters": "freeze_drop",
    "frozen_in_optimizer": "drop",
    "not_in_model": "drop",
    "decay_on_norm_or_bias": "no_decay",
    "in_multiple_optimizers": "keep_first",
}


def plan_fixes(diag) -> dict:
    """One fix per finding of `diag` (a finding with no automatic fix is listed, with action
    "none"), and the DDP setting the advice allows once the fixes are in."""
    params = diag.params
    orphaned = {n for f in diag.findings if f.code == "orphan" for n in f.params}
    fixes = []
    for f in diag.findings:
        action = ACTIONS.get(f.code, "none")
        if f.code == "grad_not_cleared" and f.params and set(f.params) <= orphaned:
            action = "covered"  # an optimizer's zero_grad clears it once it holds it
        fix = {"code": f.code, "severity": f.severity, "module": f.module,
               "names": list(f.params), "action": action, "bytes": int(f.bytes)}
        if action == "join_group":  # the groups the orphan's fix names (`judge.homes`)
            homes = home_groups(params, f.params)
            fix["homes"] = {n: list(homes.get(n, (0, 0))) for n in f.params}
            fix["optimizer"], fix["group"] = fix["homes"][f.params[0]] if f.params else [0, 0]
        fixes.append(fix)
    fup = (diag.advice or {}).get("find_unused_parameters", {})
    return {"fixes": fixes,
            "find_unused_parameters": bool(fup.get("after_fix", True)) if fup else None}


def apply_plan(setup, plan: dict) -> list[dict]:
    """Apply every fix of `plan` to `setup` (a fresh copy: it is changed in place). Returns
    the fixes, each with `applied` (what was done, in words) and `state_elements`
    ({"dropped": n, "added": n}: optimizer-state elements, see `state_bytes`)."""
    tensors = _by_name(setup)
    done = []
    for fix in plan["fixes"]:
        found = {n: tensors[n] for n in fix["names"] if n in tensors}
        fix = {**fix, "dropped_bytes": 0, "added_bytes": 0}
        if fix["action"] in ("none", "covered") or not found:
            fix["applied"] = {"none": "no automatic fix", "covered": "fixed by the orphan's fix"
                              }.get(fix["action"], "no tensor of that name in the fresh copy")
        elif fix["action"] == "join_group":
            fix["applied"] = _join_group(setup.optimizers, found, fix)
        else:
            fix["applied"] = _APPLY[fix["action"]](setup.optimizers, list(found.values()), fix)
        done.append(fix)
    return done


def fix_for_ranks(setup, plan: dict):
    """Under --nproc, in one rank: the plan applied to this rank's fresh copy. The target's own
    DDP is rebuilt around its module after the fixes (DDP fixes the tensors it reduces when it
    is built), with `find_unused_parameters=False` where the advice allows it, else its own.
    Returns (the setup to observe, the fixes applied)."""
    import dataclasses

    from torch.nn.parallel import DistributedDataParallel as DDP
    applied = apply_plan(setup, plan)
    if isinstance(setup.model, DDP):
        fup = plan.get("find_unused_parameters")
        old = setup.model
        rebuilt = DDP(old.module, find_unused_parameters=bool(
            old.find_unused_parameters if fup is None else fup))
        del old
        setup = dataclasses.replace(setup, model=rebuilt)
    return setup, applied


def _by_name(setup) -> dict[str, torch.Tensor]:
    """Every tensor of the fresh copy under each of its names (as `params.name` gives them)."""
    inv = take_inventory(setup.model, setup.optimizers)
    out = {}
    for tensor, row in zip(inv.tensors, inv.rows):
        for name in (row["name"], *row["aliases"]):
            out[name] = tensor
    return out


def _holders(optimizers) -> dict[int, list[tuple[int, int]]]:
    """id(tensor) -> the (optimizer, group) pairs holding it, by identity, in order (one pass
    over every group: a fix touches thousands of biases at once)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for i, opt in enumerate(optimizers):
        for j, group in enumerate(opt.param_groups):
            for p in group["params"]:
                out.setdefault(id(p), []).append((i, j))
    return out


def _drop(optimizers, tensors, fix, keep: set | None = None) -> int:
    """Take `tensors` out of every optimizer (but those in `keep`), with their state; counts
    the state bytes so saved into `fix`. Returns how many memberships were dropped."""
    ids, n = {id(t) for t in tensors}, 0
    for i, opt in enumerate(optimizers):
        if keep is not None and i in keep:
            continue
        for group in opt.param_groups:
            gone = [p for p in group["params"] if id(p) in ids]
            if gone:
                group["params"] = [p for p in group["params"] if id(p) not in ids]
                n += len(gone)
                fix["dropped_bytes"] += sum(state_bytes(opt, group, p) for p in gone)
                for p in gone:
                    opt.state.pop(p, None)
    return n


def _join_group(optimizers, found: dict, fix) -> str:
    """Each orphan (`found`: name -> tensor) into its home group itself (`judge.homes`), as
    the pasted fix does: it takes that group's lr, weight decay and schedule."""
    homes = fix.get("homes") or {}
    joined: dict[tuple[int, int], list] = {}
    for name, tensor in found.items():
        i, j = homes.get(name, (fix["optimizer"], fix["group"]))
        if i >= len(optimizers) or j >= len(optimizers[i].param_groups):
            raise DiagkitError(f"--try-fix: optimizer {i} group {j} is not in the fresh copy")
        joined.setdefault((i, j), []).append(tensor)
    said = []
    for (i, j), mine in sorted(joined.items()):
        group = optimizers[i].param_groups[j]
        group["params"].extend(mine)
        fix["added_bytes"] += sum(state_bytes(optimizers[i], group, t) for t in mine)
        said.append(f"joined optimizer {i} group {j} (lr {group.get('lr')}, weight decay "
                    f"{group.get('weight_decay', 0)})")
    return "; ".join(said)


def _freeze_drop(optimizers, tensors, fix) -> str:
    for t in tensors:
        t.requires_grad_(False)
    n = _drop(optimizers, tensors, fix)
    return "frozen (requires_grad_(False))" + (", dropped from the optimizer" if n else "")


def _drop_only(optimizers, tensors, fix) -> str:
    n = _drop(optimizers, tensors, fix)
    return f"dropped from the optimizer ({n} membership(s))"


def _no_decay(optimizers, tensors, fix) -> str:
    """Out of their groups into one new group per source group: same settings, no decay."""
    held = _holders(optimizers)
    moving: dict[tuple[int, int], list] = {}
    for t in tensors:
        for pair in held.get(id(t), [])[:1]:
            moving.setdefault(pair, []).append(t)
    for (i, j), mine in moving.items():
        source = optimizers[i].param_groups[j]
        ids = {id(t) for t in mine}
        source["params"] = [p for p in source["params"] if id(p) not in ids]
        optimizers[i].add_param_group({"params": mine, **{k: v for k, v in source.items()
                                                          if k != "params"},
                                       "weight_decay": 0.0})
    return "moved to a no-decay group (same lr, weight_decay 0)"


def _keep_first(optimizers, tensors, fix) -> str:
    held = _holders(optimizers)
    firsts = set()
    for t in tensors:
        if held.get(id(t)):
            first = held[id(t)][0][0]
            firsts.add(first)
            _drop(optimizers, [t], fix, keep={first})
    return f"kept in optimizer {', '.join(map(str, sorted(firsts)))} only"


_APPLY = {"freeze_drop": _freeze_drop, "drop": _drop_only,
          "no_decay": _no_decay, "keep_first": _keep_first}


def state_slots(optimizer, group: dict) -> int | None:
    """Per-element optimizer-state tensors of `optimizer`'s type with `group`'s settings, as
    torch's optimizers allocate them on their first step (None: a type not known here).
    Adam/AdamW: exp_avg + exp_avg_sq (+ max_exp_avg_sq with amsgrad); SGD: a momentum buffer
    when momentum > 0; RMSprop: square_avg (+ momentum_buffer, + grad_avg when centered).
    Scalar state (a step count) is left out: it does not grow with the tensor."""
    name = type(optimizer).__name__
    if name in ("Adam", "AdamW"):
        return 2 + int(bool(group.get("amsgrad")))
    if name in ("NAdam", "RAdam", "Adamax", "Adadelta"):
        return 2
    if name == "SGD":
        return int(bool(group.get("momentum")))
    if name == "RMSprop":
        return 1 + int(bool(group.get("momentum"))) + int(bool(group.get("centered")))
    if name in ("Adagrad", "ASGD"):  # sum; ax
        return 1
    if name == "Rprop":  # prev, step_size
        return 2
    return None


def state_bytes(optimizer, group: dict, tensor: torch.Tensor) -> int:
    """Bytes of `tensor`'s optimizer state: slots x numel x its element size (0 if unknown)."""
    slots = state_slots(optimizer, group)
    return (slots or 0) * tensor.numel() * tensor.element_size()
