"""Verdicts about change: frozen tensors that move, trained ones that do not, and their gradients.

Each rule is followed by the explanation of its findings (see `diagkit.judge.verdict`)."""

from __future__ import annotations

from .verdict import has_elements, in_optimizer, per_tensor, verdict
from .wording import subject


@verdict("frozen_in_optimizer", "warning",
         ('An optimizer holds it although `requires_grad` is False (at the last step): '
          'momentum or weight decay can still move it, and its state costs memory.'))
def frozen_in_optimizer(params, steps):
    return in_optimizer(params) & ~params["requires_grad"].astype(bool)


@frozen_in_optimizer.explains
def _explain_frozen_in_optimizer(label, group, steps):
    message = (f"{subject(label, group)} is held by an optimizer although requires_grad is False: "
               "momentum or weight decay can still move it, and its state costs memory.")
    fix = ("Build the optimizer from trainable tensors only: "
           "torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], ...)")
    return message, fix


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
    fix = ("When freezing, also remove it from the optimizer, or zero_grad(set_to_none=True) so "
           "the optimizer skips it; check in-place writes to parameters.")
    return message, fix


@verdict("stalled", "error",
         ('It requires grad, an optimizer holds it, it gets gradients — and its value never'
          ' changes (a learning rate of 0, an optimizer that never steps).'),
         needs="values")
def stalled(params, steps):
    used = per_tensor(params, steps, steps["used"].astype(bool))
    changed = per_tensor(params, steps, steps["changed"].astype(bool))
    return (params["requires_grad"].astype(bool) & in_optimizer(params)
            & (used > 0) & (changed == 0) & has_elements(params))


@stalled.explains
def _explain_stalled(label, group, steps):
    lrs = sorted(set(group["lr"].dropna().tolist()))
    if lrs and all(lr == 0 for lr in lrs):
        why, fix = "its group's learning rate is 0", "Give its param group a learning rate > 0."
    else:
        why = "the optimizer step leaves it unchanged"
        fix = ("Check its group's lr, gradient clipping to zero, an optimizer that never "
               "steps, or updates too small for its dtype.")
    message = (f"{subject(label, group)} requires grad, is held by an optimizer and receives "
               f"gradients, yet its value never changed: {why}.")
    return message, fix


@verdict("zero_gradient", "warning",
         ('It gets gradients, every one exactly zero: it cannot influence the loss.'),
         needs="values")
def zero_gradient(params, steps):
    used = steps["used"].astype(bool)
    nonzero = used & ~(steps["grad_norm"] == 0)
    return ((per_tensor(params, steps, used) > 0) & (per_tensor(params, steps, nonzero) == 0)
            & has_elements(params))


@zero_gradient.explains
def _explain_zero_gradient(label, group, steps):
    message = (f"{subject(label, group)} receives gradients, but every one is exactly zero: "
               "it is used, yet cannot influence the loss (multiplied by zero, masked, or "
               "behind a saturated activation).")
    fix = "Check the forward around it for a zero factor, a mask, or a .detach()-like cut."
    return message, fix


@verdict("nonfinite_grad", "error",
         ('A gradient held NaN or Inf.'),
         needs="values")
def nonfinite_grad(params, steps):
    return per_tensor(params, steps, steps["nonfinite"].astype(bool)) > 0


@nonfinite_grad.explains
def _explain_nonfinite_grad(label, group, steps):
    message = f"{subject(label, group)} received a gradient holding NaN or Inf."
    fix = ("Find the first op producing it with torch.autograd.set_detect_anomaly(True); check "
           "the loss scale, log/sqrt/division of near-zero values, and the learning rate.")
    return message, fix
