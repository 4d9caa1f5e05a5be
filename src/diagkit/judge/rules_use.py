"""Verdicts about use: whether autograd reached the tensor, and whether its .grad is cleared.

Each rule is followed by the explanation of its findings (see `diagkit.judge.verdict`)."""

from __future__ import annotations

from ..core.fixtext import compose
from ..core.schema import is_dtensor_placement
from . import fix_code
from .levers import hook_root, trainer_lever, user_hook
from .verdict import in_optimizer, per_tensor, rg_used_counts, verdict
from .wording import accessor, iter_expr, params_expr, roots, subject, trend


@verdict("orphan", "error",
         ('It wants to learn (requires grad) and gets gradients, but no optimizer holds it,'
          ' so it never changes. `optimizer.zero_grad()` does not clear its `.grad` either: '
          'unless something else does (`model.zero_grad()`), it keeps growing. '
          'Typical cause: a name filter such as `not n.startswith("module.metamodel")` — '
          'under DDP every name starts with `module.`.'), membership=True)
def orphan(params, steps):
    used_while_rg = rg_used_counts(params, steps)[1]  # outside the model: `unregistered`
    return (used_while_rg > 0) & ~in_optimizer(params) & params["in_model"].astype(bool)


@orphan.explains
def _explain_orphan(label, group, steps):
    names = list(group["name"])
    message = (f"{subject(label, group)} requires grad and receives gradients, but no optimizer "
               f"holds it: it is never trained" + _orphan_grad(steps, names) + ".")
    freeze = ("Or, if it should stay fixed, freeze it:", fix_code.freeze(label, group))
    hook = user_hook(group)
    if hook is not None:
        name, where = hook
        return message, compose(
            (f"Put it in the optimizer your `{name}` builds ({where}): include "
             f"{params_expr(label, group, hook_root(name))} in the params it passes.", None),
            freeze)
    if "DeepSpeedEngine" in (_context_wrappers(group) or ()):
        return message + _UNDER_ZERO, compose(
            ("Put it in the torch optimizer's groups before deepspeed.initialize(model=..., "
             "optimizer=...): ZeRO partitions only what that optimizer holds when the engine "
             "is built, and takes no group afterwards.", None), freeze)
    if "placement" in group and group["placement"].fillna("").map(is_dtensor_placement).all():
        message += (" Its tensors are DTensor shards (FSDP2): an optimizer built before "
                    "`fully_shard` holds the tensors that fully_shard replaced (listed as "
                    "not_in_model), not these.")
        return message, ("Build the optimizer after sharding: fully_shard(...) every module "
                         "first, then torch.optim.AdamW(model.parameters(), ...).")
    trainer = trainer_lever(label, group)
    if trainer is not None:
        return message + trainer[0], trainer[1]
    joined = fix_code.join(label, group) or (
        "Add it to an optimizer:",
        f'{roots(group).optimizer()}.add_param_group({{"params": {params_expr(label, group)}}})')
    prefixed = [n for n in names if n.startswith("module.")]
    if prefixed:
        # A `module.` name is what the target's own code saw (diagkit's own DDP wrap adds no
        # prefix), so a filter on those wrapped names is a plausible cause; else it is not.
        top = ".".join(prefixed[0].split(".")[:2])
        message += (" Its name carries the DDP wrapper prefix `module.`, as the target's code "
                    "saw it: a filter on names such as "
                    f"`not n.startswith(\"{top}\")` excludes it from the optimizer's groups.")
        joined = ("Include it explicitly, by identity: " + joined[0][0].lower()
                  + joined[0][1:], joined[1])
    return message, compose(joined, freeze)


_UNDER_ZERO = (" The model runs under DeepSpeed: ZeRO's optimizer was built from a torch "
               "optimizer that did not hold it, so ZeRO neither partitions nor updates it.")


def _context_wrappers(group):
    """The wrappers the model was given in (`judge.findings.FindingContext`), None unknown."""
    ctx = group.attrs.get("context")
    return getattr(ctx, "wrappers", None)


def _orphan_grad(steps, names) -> str:
    """What happens to an orphan's .grad, as the steps show it: carried over (nothing clears
    it) or not (something else, e.g. model.zero_grad(), clears it); nothing on one step."""
    s = steps[steps["name"].isin(set(names))]
    if s["carried_grad"].astype(bool).any():
        moved = trend(steps, names, "grad_total_norm")
        return (", and nothing clears its .grad (optimizer.zero_grad() clears only the tensors "
                "the optimizer holds), so gradients pile up across steps"
                + (f" (.grad norm {moved})" if moved else ""))
    if s.loc[s["used"].astype(bool), "step"].nunique() > 1:
        return (" (its .grad does not pile up: something else clears it between steps, e.g. "
                "model.zero_grad())")
    return ""


@verdict("unused", "warning",
         ('It requires grad but never gets a gradient: the forward does not use it. DDP '
          'then needs `find_unused_parameters=True`, and the tensor is dead weight in the '
          'optimizer and in every checkpoint.'))
def unused(params, steps):
    rg, used = rg_used_counts(params, steps)
    return (rg > 0) & (used == 0)


@unused.explains
def _explain_unused(label, group, steps):
    whole_module = (label and len(group) > 1 and group["in_model"].all()
                    and group.attrs.get("whole", True))
    message = (f"{subject(label, group)} requires grad but never receives a gradient: the forward "
               "never uses it. Under DDP this forces find_unused_parameters=True, and it is dead "
               "weight in the optimizer and every checkpoint.")
    if not group["in_model"].any():  # held by an optimizer only: nothing to freeze in the model
        return message, ("Drop it from the optimizer: build the optimizer from "
                         "model.parameters(), after anything that replaces them.")
    held = fix_code.drop_frozen(group)
    freeze = fix_code.freeze(label, group) + (f"\n{held}" if held else "")
    then = " (then DDP(model, find_unused_parameters=False) applies)"
    alternatives = [(f"Freeze it{' and take it out of the optimizer' if held else ''}{then}:",
                     freeze)]
    if whole_module:
        alternatives.append(("Or drop the submodule, before the optimizer is built:",
                             f"del {accessor(label, roots(group).model)}"))
    return message, compose(*alternatives)


@verdict("intermittent", "info",
         ('It gets gradients on some steps but not others (a data-dependent branch). DDP '
          'needs `find_unused_parameters=True`; `static_graph` is not possible.'),
         needs="steps")
def intermittent(params, steps):
    rg, used = rg_used_counts(params, steps)
    return (used > 0) & (used < rg)


@intermittent.explains
def _explain_intermittent(label, group, steps):
    s = steps[steps["name"].isin(set(group["name"])) & steps["requires_grad"].astype(bool)]
    used_at = sorted(s.loc[s["used"].astype(bool), "step"].unique().tolist())
    message = (f"{subject(label, group)} receives gradients on some steps only "
               f"(steps {used_at}): the forward takes a data-dependent branch.")
    return message, compose(
        ("Keep DDP(find_unused_parameters=True): static_graph is not possible.", None),
        ("Or make the branch contribute every step, in your loop before loss.backward():",
         f"loss = loss + 0.0 * sum(p.sum() for p in {iter_expr(label, group)})"))


@verdict("grad_not_cleared", "warning",
         ("A step's gradient landed on a non-zero `.grad` left by an earlier step: nothing "
          'zeroes it, so gradients silently accumulate across steps.'),
         needs="values")
def grad_not_cleared(params, steps):
    return per_tensor(params, steps, steps["carried_grad"].astype(bool)) > 0


@grad_not_cleared.explains
def _explain_grad_not_cleared(label, group, steps):
    moved = trend(steps, group["name"], "grad_total_norm")
    message = (f"{subject(label, group)}: each step's gradient lands on the .grad left by the "
               f"previous step, so gradients accumulate across steps"
               + (f" (.grad norm {moved})" if moved else "") + ".")
    if group["verdicts"].map(lambda vs: "orphan" in vs).all():
        return message, ("The orphan's fix clears it too: once an optimizer holds it, that "
                         "optimizer's zero_grad() clears its .grad.")
    return message, compose(
        ("Make something zero it every step: put it in an optimizer (its zero_grad() clears "
         "it).", None),
        ("Or zero the model's gradients in your loop, instead of optimizer.zero_grad():",
         f"{roots(group).whole()}.zero_grad(set_to_none=True)"))
