"""Verdicts about change: frozen tensors that move, trained ones that do not, and their gradients.

Each rule is followed by the explanation of its findings (see `diagkit.judge.verdict`)."""

from __future__ import annotations

from ..core.fixtext import compose
from ..measure.tables.aggregate import fold_ranks
from . import fix_code
from .precision import PRECISION_FIX, rounded_away, rounding_why
from .verdict import has_elements, in_optimizer, per_tensor, skipped, verdict
from .wording import roots, subject


@verdict("frozen_in_optimizer", "warning",
         ('An optimizer holds it although `requires_grad` is False (at the last step): '
          'momentum or weight decay can still move it, and its state costs memory.'),
         membership=True)
def frozen_in_optimizer(params, steps):
    return in_optimizer(params) & ~params["requires_grad"].astype(bool)


@frozen_in_optimizer.explains
def _explain_frozen_in_optimizer(label, group, steps):
    message = (f"{subject(label, group)} is held by an optimizer although requires_grad is False: "
               "momentum or weight decay can still move it, and its state costs memory.")
    return message, compose(
        ("Take the tensors that do not require grad out of the optimizer:",
         fix_code.drop_frozen(group)),
        ("Or build the optimizer from trainable tensors only: torch.optim.AdamW([p for p in "
         f"{roots(group).whole()}.parameters() if p.requires_grad], ...).", None))


@verdict("frozen_but_changing", "error",
         ('Its value changed on a step on which it did not require grad — e.g. Adam '
          'momentum after a mid-run freeze with `zero_grad(set_to_none=False)`.'),
         needs="values")
def frozen_but_changing(params, steps):
    mask = steps["changed"].astype(bool) & ~steps["requires_grad"].astype(bool)
    return per_tensor(params, steps, mask) > 0


@frozen_but_changing.explains
def _explain_frozen_but_changing(label, group, steps):
    message = (f"{subject(label, group)} changed on a step on which it did not require grad: "
               "something still updates it (momentum or weight decay of an optimizer that holds "
               "it, or an in-place write).")
    held = fix_code.drop_frozen(group)
    if not held:  # no optimizer holds it: an in-place write
        return message, "Check in-place writes to parameters (p.data, p.copy_, p.add_)."
    opt = roots(group).optimizer(fix_code.holders(group)[0])
    return message, compose(
        ("When freezing, also take it out of the optimizer:", held),
        ("Or clear gradients to None, so that the optimizer skips it:",
         f"{opt}.zero_grad(set_to_none=True)"),
        ("Else check in-place writes to parameters.", None))


@verdict("stalled", "error",
         ('It requires grad, an optimizer holds it, it gets gradients — and its value never'
          ' changes (a learning rate of 0, an optimizer that never steps, a tensor kept in'
          ' bf16/fp16 whose updates round away: the finding says which). Steps its optimizer'
          ' skipped do not count.'),
         needs="values", membership=True)
def stalled(params, steps):
    """A step its optimizer skipped is not a change that failed to happen: only taken steps
    count. An optimizer that skipped every step still never steps, unless it skipped because
    the gradients overflowed: that is `nonfinite_grad`'s finding, not a stall."""
    used, skip = steps["used"].astype(bool), skipped(steps)
    taken = per_tensor(params, steps, used & ~skip)
    overflowed = per_tensor(params, steps, used & skip & steps["nonfinite"].astype(bool))
    never_taken = (per_tensor(params, steps, used) > 0) & (taken == 0) & (overflowed == 0)
    changed = per_tensor(params, steps, steps["changed"].astype(bool))
    return (params["requires_grad"].astype(bool) & in_optimizer(params)
            & ((taken > 0) | never_taken) & (changed == 0) & has_elements(params))


@stalled.explains
def _explain_stalled(label, group, steps):
    lrs = sorted(set(group["lr"].dropna().tolist()))
    mine = steps[steps["name"].isin(set(group["name"]))]
    rounding = rounded_away(group)
    if lrs and all(lr == 0 for lr in lrs):
        why, fix = "its group's learning rate is 0", _lr_fix(group)
    elif len(mine) and not (mine["used"].astype(bool) & ~skipped(mine)).any():
        why = ("its optimizer skipped every step on which it got gradients: optimizer.step() "
               "never ran (a loop that does not call it, or a loss scaler skipping each step)")
        fix = ("Call optimizer.step() (scaler.step(optimizer) under a GradScaler) on every "
               "step; if a scaler skips them all, see the nonfinite_grad finding.")
    elif len(rounding):
        why, fix = rounding_why(rounding, everyone=len(rounding) == len(group)), PRECISION_FIX
    else:
        why = "the optimizer step leaves it unchanged"
        fix = ("Check its group's lr, gradient clipping to zero, an optimizer that never "
               "steps, or updates too small for its dtype.")
    message = (f"{subject(label, group)} requires grad, is held by an optimizer and receives "
               f"gradients, yet its value never changed: {why}.")
    return message, fix


def _lr_fix(group) -> str:
    """Name the group whose lr is 0 (the optimizer's own name for it)."""
    pairs = sorted({(int(o), int(g)) for ms in group["memberships"] if ms is not None
                    for o, g in ms[:1]})
    r = roots(group)
    where = ", ".join(f'{r.optimizer(o)}.param_groups[{g}]["lr"]' for o, g in pairs)
    return f"Give its param group a learning rate > 0 ({where} is 0)."


@verdict("zero_gradient", "warning",
         ("It gets gradients, every one exactly zero, one of them on a step that can tell "
          "(every other tensor that step used had changed before it, or never changes): it "
          "cannot influence the loss. Where no observed step can tell (a zero-initialised "
          "partner, a fresh LoRA's `lora_B` or an adaLN-Zero / ReZero gate, has not moved yet: "
          "one step of a fresh adapter), the tensor stays `ok` and the result says so in one "
          "line (`meta[\"not_judged\"][\"zero_gradient\"]`, shown under the banner): "
          "observe more steps."),
         needs="values")
def zero_gradient(params, steps):
    """Only zeros on steps that can tell count (`told`): a zero-initialised partner that has
    not moved yet (LoRA's lora_B on a fresh adapter's first step) zeroes it by design."""
    used, telling, nonzero = _zero_counts(params, steps)
    return (telling > 0) & (used > 0) & (nonzero == 0) & has_elements(params)


@zero_gradient.explains
def _explain_zero_gradient(label, group, steps):
    message = (f"{subject(label, group)} receives gradients, but every one is exactly zero, "
               "also on a step after the other tensors that step used had changed (or on which "
               "they never change): it is used, yet cannot influence the loss (multiplied by "
               "zero, masked, or behind a saturated activation).")
    fix = "Check the forward around it for a zero factor, a mask, or a .detach()-like cut."
    return message, fix


def zero_gradient_untold(params, steps) -> list[str]:
    """The tensors `zero_gradient` cannot judge: used, every gradient exactly zero, but only
    on steps that cannot tell (`told`), such as a fresh LoRA's lora_A on its first step (its
    lora_B still at zero). No verdict: the result says so in one line (`untold_why`)."""
    steps = fold_ranks(steps)
    if not len(steps):
        return []
    used, telling, nonzero = _zero_counts(params, steps)
    untold = (telling == 0) & (used > 0) & (nonzero == 0) & has_elements(params)
    return params.loc[untold.to_numpy(dtype=bool), "name"].tolist()


def untold_why(count: int, where: str) -> str:
    """Why `zero_gradient` was not judged for `count` tensors (`where`: their names or their
    modules' pattern): the value of `meta["not_judged"]["zero_gradient"]`."""
    return (f"{count} tensor{'s' if count != 1 else ''} ({where}) got only exactly-zero "
            "gradients, on steps that cannot tell: a partner initialised to zero (a fresh "
            "LoRA's lora_B, a zero gate or convolution) had not moved yet; observe more steps")


def _zero_counts(params, steps):
    """Per tensor: steps it was used, of those the steps that can tell (`told`), and those
    with a gradient not exactly zero."""
    used = steps["used"].astype(bool)
    nonzero = used & ~(steps["grad_norm"] == 0)
    return (per_tensor(params, steps, used), per_tensor(params, steps, used & told(steps)),
            per_tensor(params, steps, nonzero))


def told(steps):
    """Per steps row: whether its step can tell a tensor that cannot influence the loss from
    one whose partner is zero so far. It cannot when another tensor the step used (so one
    its gradient depends on) makes its first observed change on that step or later: until
    then that tensor may still hold a zero it started with (docs/choices.md, "A zero
    gradient needs a step that can tell"). One that never changes holds for every step."""
    used = steps["used"].astype(bool)
    first = steps.loc[steps["changed"].astype(bool)].groupby("name")["step"].min()
    pending = used & (steps["name"].map(first) >= steps["step"]).fillna(False).astype(bool)
    others = pending.groupby(steps["step"]).transform("sum") - pending.astype(int)
    return others == 0


@verdict("nonfinite_grad", "error",
         ('A gradient held NaN or Inf on a step its optimizer took, or on every step when all'
          ' were skipped. A step a loss scaler skipped because the gradients overflowed is the'
          ' scaler doing its job (`steps.skipped`).'),
         needs="values")
def nonfinite_grad(params, steps):
    """On a step its optimizer skipped, a non-finite gradient is a loss scaler doing its job
    (it skips the steps whose scaled gradients overflowed). Still an error: on a step that
    was taken, or when every step it got gradients on was skipped (nothing trains)."""
    nonfinite, skip = steps["nonfinite"].astype(bool), skipped(steps)
    taken_used = per_tensor(params, steps, steps["used"].astype(bool) & ~skip)
    return ((per_tensor(params, steps, nonfinite & ~skip) > 0)
            | ((per_tensor(params, steps, nonfinite) > 0) & (taken_used == 0)))


@nonfinite_grad.explains
def _explain_nonfinite_grad(label, group, steps):
    s = steps[steps["name"].isin(set(group["name"]))]
    nonfinite, skip = s["nonfinite"].astype(bool), skipped(s)
    if not (nonfinite & ~skip).any():  # only on skipped steps, and every step was skipped
        n = s.loc[skip, "step"].nunique()
        message = (f"{subject(label, group)}: its optimizer skipped every one of the {n} "
                   "observed step(s) on which it got gradients, which held NaN or Inf: a loss "
                   "scaler that skips every step trains nothing (the loss overflows at each "
                   "scale tried, or is itself inf or NaN).")
        fix = ("Check that the loss is finite before scaling (torch.isfinite(loss)); if it is, "
               "lower GradScaler(init_scale=...) (each skip halves the scale: the first steps "
               "of float16 training may all skip, so observe more steps), or train under "
               "torch.autocast(dtype=torch.bfloat16) without a scaler.")
        return message, fix
    taken = sorted(int(i) for i in s.loc[nonfinite & ~skip, "step"].unique())
    listed = ", ".join(map(str, taken[:6])) + (" ..." if len(taken) > 6 else "")
    others = s.loc[nonfinite & skip, "step"].nunique()
    message = (f"{subject(label, group)} received a gradient holding NaN or Inf on step(s) "
               f"{listed}, which its optimizer took"
               + (f" (the {others} step(s) its optimizer skipped for one are not counted)"
                  if others else "") + ".")
    fix = ("Find the first op producing it with torch.autograd.set_detect_anomaly(True); check "
           "the loss scale, log/sqrt/division of near-zero values, and the learning rate. "
           "Under a GradScaler, step through scaler.step(optimizer): it skips such steps.")
    return message, fix
