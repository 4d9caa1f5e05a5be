"""Verdicts of a distributed run: what differs between ranks on the same step; and the one
run-level finding about a rank itself, a rank that never steps (`never_stepped`).

`rank_differences` is the one analysis behind both rules and the report's per-rank view.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.fixtext import compose
from ..core.result import Finding
from .verdict import verdict
from .wording import iter_expr, subject

NEVER_STEPPED = "rank_never_stepped"


def rank_differences(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (name, step) of a steps table with a `rank` column: `mixed` (used on some ranks,
    not others), `diverged` (the value checksums differ) and `spread` (the largest relative
    checksum spread, (max - min) / max |checksum|; inf when one rank's is NaN; 0 when equal)."""
    keys = [steps["name"].astype(str), steps["step"]]
    mixed = steps["used"].astype(bool).groupby(keys).nunique() > 1
    if "checksum" not in steps.columns:
        return pd.DataFrame({"mixed": mixed, "diverged": False, "spread": 0.0})
    cs = pd.to_numeric(steps["checksum"], errors="coerce")
    hi, lo = cs.groupby(keys).max(), cs.groupby(keys).min()
    diverged = cs.groupby(keys).nunique(dropna=False) > 1
    scale = np.maximum(hi.abs(), lo.abs())
    spread = ((hi - lo) / scale.where(scale > 0)).fillna(0.0)
    spread = spread.where(~(cs.isna().groupby(keys).any() & diverged), np.inf)
    return pd.DataFrame({"mixed": mixed, "diverged": diverged,
                         "spread": spread.where(diverged, 0.0)})


def _names_where(params: pd.DataFrame, steps: pd.DataFrame, column: str) -> pd.Series:
    if "rank" not in steps or (column == "diverged" and "checksum" not in steps):
        return pd.Series(False, index=params.index)
    found = rank_differences(steps)
    hit = found.index[found[column].to_numpy(dtype=bool)].get_level_values(0).unique()
    return params["name"].isin(hit)


@verdict("rank_divergent", "error",
         ("(distributed) Its value differs between ranks after a step: DDP does not average "
          "its gradient (a tensor outside the model, or made trainable after DDP was built)."),
         per_rank=True,
         needs="values")
def rank_divergent(params, steps):
    return _names_where(params, steps, "diverged")


@rank_divergent.explains
def _explain_divergent(label, group, steps):
    """The concrete cause the steps point to. DDP averages the gradients of the parameters of
    the model it wraps that required grad when it was built, and no others: a tensor outside
    the model, or made trainable after DDP was built, trains on each rank's own gradient."""
    head = f"{subject(label, group)} holds different values on different ranks after a step"
    rebuild = ("Set requires_grad before DistributedDataParallel(model) is built, or re-create "
               "DDP after changing it (model = DistributedDataParallel(model.module, ...)).")
    changed = _requires_grad_changes(group, steps)
    if changed:
        where = ", ".join(f"`{n}` {'False → True' if now else 'True → False'} at step {k}"
                          for n, (k, now) in list(changed.items())[:3])
        return (f"{head}: its requires_grad changed during the run ({where}), after DDP was "
                "built, and DDP keeps the set of tensors it averages from the moment it was "
                "built.", rebuild)
    if not group["in_model"].astype(bool).all():
        return (f"{head}: an optimizer steps it, but it is not a parameter of the model DDP "
                "wraps (a tensor passed to forward as an argument?), so DDP never averages its "
                "gradient.",
                "Register it on the model before wrapping it in DDP (self.scale = "
                "nn.Parameter(...) in __init__, used in forward), so that DDP averages its "
                "gradient; build the optimizer from model.parameters().")
    if not _required_grad(group, steps):
        return (f"{head}, although it never required grad in the observed steps: something "
                "changes it outside the gradient, differently on each rank (an in-place update "
                "from the rank's data?).",
                "Make that update the same on every rank (e.g. torch.distributed.broadcast("
                "p.data, src=0) after it), or stop updating a tensor that should stay fixed.")
    return _divergent_while_trainable(head, group, rebuild)


def _divergent_while_trainable(head: str, group: pd.DataFrame, rebuild: str) -> tuple:
    """It required grad on every observed step: name what was seen. Whether DDP averaged its
    gradient on each step (the .grad the optimizer steps on is then the same on every rank),
    how the model was wrapped, and DDP's tensors against the model's (`measure.engines.ddp_facts`).
    "Unfrozen after wrapping" only where requires_grad changed since DDP was built."""
    ctx = group.attrs.get("context")
    names = list(group["name"])
    averaged = gradient_averaged(ctx.by_rank, names) if ctx is not None else {}
    on = [k for k, a in averaged.items() if a]
    off = [k for k, a in averaged.items() if not a]
    head = f"{head}, although it required grad on every observed step"
    if on and off:
        return (f"{head}: its gradient was averaged across ranks on {_steps(on)} but not on "
                f"{_steps(off)}, so on those the step did not go through DDP (the forward "
                "called the model itself, or its .module, instead of the DDP wrapper, or ran "
                "inside no_sync() before the optimizer stepped).",
                "Run every step's forward through the DDP-wrapped model (ddp(x), not "
                "ddp.module(x)), and step the optimizer only after a backward outside no_sync().")
    if on:
        return (f"{head}, and its gradient was averaged across ranks on every observed step: "
                "something changes it outside the gradient, differently on each rank (an "
                "in-place update from the rank's data?).",
                "Make that update the same on every rank (e.g. torch.distributed.broadcast("
                "p.data, src=0) after it), or stop it.")
    return _not_averaged(head, names, ctx, rebuild)


def _not_averaged(head: str, names: list, ctx, rebuild: str) -> tuple:
    """Its gradient was averaged on no observed step (or that was not measured)."""
    ddp = ctx.ddp if ctx is not None else {}
    wrappers = ctx.wrappers if ctx is not None else None
    if wrappers is not None and not ddp and "DistributedDataParallel" not in wrappers:
        given = " > ".join(wrappers) if wrappers else "the bare module"
        return (f"{head}: the model is not wrapped in DistributedDataParallel (it was given "
                f"as {given}), so nothing averages its gradient across ranks.",
                "Wrap it before training: ddp = DistributedDataParallel(model); run the "
                "forward through ddp and pass ddp to diagkit.watch.")
    replaced = {_bare(n) for n in ddp.get("replaced", ())}
    hit = [n for n in names if _bare(n) in replaced]
    if hit:
        return (f"{head}: {_listed(hit)} is not the tensor DDP was built with (the parameter "
                "was replaced after DistributedDataParallel(model) was built), so DDP "
                "averages the gradient of the old one, never of this one.",
                "Replace parameters before DistributedDataParallel(model) is built, or re-create "
                "DDP after replacing them (model = DistributedDataParallel(model.module, ...)).")
    built, now = ddp.get("num_parameter_tensors"), ddp.get("trainable_now")
    if built is not None and now is not None and now > built:
        return (f"{head}: DDP was built when {built} of its tensors required grad and {now} "
                "do now, so requires_grad changed after wrapping (it was unfrozen after DDP "
                "was built), and DDP keeps the set of tensors it averages from the moment it "
                "was built.", rebuild)
    if now is not None:
        return (f"{head}: DDP was built with these same tensor objects, and no more of its "
                "tensors require grad now than then, yet it averaged their gradient on none of "
                "the observed steps: their storage was replaced after DDP was built (a dtype "
                "or device round trip such as .double().float() or .to(...), or param.data = "
                "...), which drops DDP's gradient hook.",
                "Convert the model (dtype, device) before DistributedDataParallel(model) is "
                "built, or re-create DDP after converting it (model = "
                "DistributedDataParallel(model.module, ...)).")
    return (f"{head}: DDP did not average its gradient, and the steps do not show why (made "
            "trainable, replaced or converted after DDP was built, or changed outside the "
            "gradient, differently on each rank).", rebuild)


def gradient_averaged(by_rank: pd.DataFrame, names: list) -> dict[int, bool]:
    """{step: whether every tensor of `names` with a .grad on every rank had the same .grad
    norm at the optimizer step on all ranks} (DDP averages into bitwise-equal gradients), over
    the steps where some did; {} without ranks or gradients."""
    if "rank" not in by_rank or by_rank["rank"].nunique() < 2:
        return {}
    s = by_rank[by_rank["name"].isin(set(names))]
    norm = pd.to_numeric(s["grad_total_norm"], errors="coerce")
    keys = [s["name"].astype(str), s["step"]]
    had = norm.notna().groupby(keys).all() & (s.groupby(keys)["rank"].nunique() > 1)
    same = norm.groupby(keys).nunique(dropna=False) == 1
    per_step = same[had].groupby(level=1).all()
    return {int(k): bool(v) for k, v in per_step.items()}


def _steps(ks: list[int]) -> str:
    shown = ", ".join(map(str, ks[:6])) + (", ..." if len(ks) > 6 else "")
    return f"step{'s' if len(ks) > 1 else ''} {shown}"


def _listed(names: list[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return shown


def _bare(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (DDP's `module.`, compile's
    `_orig_mod.`), so that DDP's names and the observed ones compare."""
    bare = None
    while bare != name:
        bare, name = name, name.removeprefix("module.").removeprefix("_orig_mod.")
    return name


def _requires_grad_changes(group: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """{name: (first step at which its requires_grad changed, the new value)} for the tensors
    of `group` whose requires_grad changed between observed steps."""
    s = steps[steps["name"].isin(set(group["name"]))].sort_values("step", kind="stable")
    changes = {}
    for name, rows in s.groupby("name", sort=False):
        rg = rows["requires_grad"].astype(bool).to_numpy()
        flips = np.flatnonzero(rg[1:] != rg[:-1])
        if len(flips):
            changes[name] = (int(rows["step"].iloc[flips[0] + 1]), bool(rg[flips[0] + 1]))
    return changes


def _required_grad(group: pd.DataFrame, steps: pd.DataFrame) -> bool:
    s = steps[steps["name"].isin(set(group["name"]))]
    return bool(s["requires_grad"].astype(bool).any()) if len(s) else bool(
        group["requires_grad"].any())


@verdict("rank_dependent_use", "warning",
         "(distributed) Used on some ranks and not on others in the same step.", per_rank=True,
         needs="ranks")
def rank_dependent_use(params, steps):
    return _names_where(params, steps, "mixed")


@rank_dependent_use.explains
def _explain_dependent(label, group, steps):
    message = (f"{subject(label, group)} received a gradient on some ranks and not on others "
               "in the same step: the forward branches on each rank's data, so DDP needs "
               "find_unused_parameters=True.")
    return message, compose(
        ("Keep DDP(find_unused_parameters=True).", None),
        ("Or make the branch contribute on every rank, in your loop before loss.backward():",
         f"loss = loss + 0.0 * sum(p.sum() for p in {iter_expr(label, group)})"))


def never_stepped(ranks: dict | None) -> list[Finding]:
    """A rank that ran backward passes while watched but never began an optimizer step, while
    another rank stepped (`meta["ranks"]` of a watch: `run.watch.ranks.rank_state`): one
    error for the run, in no tensor's verdicts. It is not one of the fixed vocabulary's verdicts
    (those judge tensors from their observed steps, and such a rank observes none); its wiring
    is the other ranks', so the fault is its loop's: a step guarded by the rank, or a rank
    that only runs forward and backward. Nothing where no rank stepped (a watch stopped before
    the first step) or where the ranks did not count their backward passes."""
    if not isinstance(ranks, dict):
        return []
    ranks = {int(r): s for r, s in ranks.items() if isinstance(s, dict)}
    never = {r: s["backward_passes"] for r, s in sorted(ranks.items()) if "backward_passes" in s}
    stepped = sorted(r for r, s in ranks.items()
                     if "backward_passes" not in s and s.get("optimizer_steps"))
    if not never or not stepped:
        return []
    passes = [f"{k} backward pass{'es' * (k != 1)}" for k in never.values()]
    who = (f"rank {next(iter(never))} ran {passes[0]}" if len(never) == 1 else
           "ranks " + ", ".join(f"{r} ({p})" for r, p in zip(never, passes)) + " ran backward "
           "passes")
    ref = stepped[0]
    alive = [r for r in never if ranks[r].get("state") == "running"]
    still = (f" Rank{'s' * (len(alive) > 1)} {', '.join(map(str, alive))} "
             f"{'were' if len(alive) > 1 else 'was'} alive, still training, when rank 0 gathered "
             "the ranks (not dead, not hanging)." if alive else "")
    message = (f"{who} but never called optimizer.step() while watched (rank {ref} stepped "
               f"{ranks[ref]['optimizer_steps']} time{'s' * (ranks[ref]['optimizer_steps'] != 1)}"
               f"): its optimizer is not stepped, so its copy of the model never trains and "
               f"drifts from the other ranks' (under DDP its gradients are still averaged into "
               f"theirs).{still}")
    fix = ("Call optimizer.step() on every rank, after every backward that should count: a "
           "step guarded by the rank (if rank == 0: optimizer.step()) runs on that rank alone. "
           "Keep only logging and saving to rank 0.")
    return [Finding(NEVER_STEPPED, "error", (), message, fix)]
