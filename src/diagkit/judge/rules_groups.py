"""Verdicts about optimizer groups: membership by identity, and weight decay where it hurts.

Each rule is followed by the explanation of its findings (see `diagkit.judge.verdict`)."""

from __future__ import annotations

from ..core.fixtext import compose
from ..core.schema import parse_former
from . import fix_code
from .verdict import in_optimizer, rg_used_counts, verdict
from .wording import roots, subject


@verdict("decay_on_norm_or_bias", "info",
         ('Weight decay > 0 on a bias (name ends in `bias`) or on a weight of a '
          'normalization module (class name contains `Norm`).'), membership=True)
def decay_on_norm_or_bias(params, steps):
    is_bias = params["name"].str.endswith("bias")
    is_norm = params["module_type"].fillna("").str.contains("Norm", regex=False)
    return (params["weight_decay"].fillna(0) > 0) & (is_bias | is_norm)


@decay_on_norm_or_bias.explains
def _explain_decay(label, group, steps):
    message = (f"{subject(label, group)} is a bias or a normalization weight in a group with "
               "weight_decay > 0; decaying these usually hurts.")
    build = ("build the groups that way where you build the optimizer (as minGPT's "
             "configure_optimizers does): the tensors of two or more dimensions in a group "
             "with weight decay, the others (p.dim() < 2) in one with weight_decay=0.0.")
    moved = fix_code.to_no_decay(label, group)
    if moved is None:
        return message, build[:1].upper() + build[1:]
    return message, compose(("Move it to a group without weight decay:", moved),
                            (f"Or {build}", None))


@verdict("in_multiple_optimizers", "error",
         ('More than one optimizer holds it: it is stepped twice per step.'), membership=True)
def in_multiple_optimizers(params, steps):
    return params["n_optimizers"] > 1


@in_multiple_optimizers.explains
def _explain_multiple(label, group, steps):
    pairs = sorted({p for m in group["memberships"] for p in m})
    message = (f"{subject(label, group)} is held by more than one optimizer ({pairs}): it is "
               "stepped twice per training step.")
    first = min(int(o) for o, _ in pairs)
    later = [o for o in fix_code.holders(group) if o != first]
    return message, compose(
        (f"Give each tensor to exactly one optimizer: take it out of the others (keeping it in "
         f"{roots(group).optimizer(first)}):", fix_code.drop_from(label, group, later)),
        ("Where you build them, assert it as minGPT does.", None))


@verdict("not_in_model", "warning",
         ('An optimizer holds it but the model does not (a stale head, a tensor passed as a'
          " forward argument): `model.zero_grad()`, `state_dict()` and DDP's gradient sync "
          'all miss it.'), membership=True)
def not_in_model(params, steps):
    return in_optimizer(params) & ~params["in_model"].astype(bool)


@not_in_model.explains
def _explain_not_in_model(label, group, steps):
    message = (f"{subject(label, group)} is held by an optimizer but is not a parameter of the "
               "model: model.zero_grad(), state_dict() and DDP's gradient sync all miss it.")
    fix = ("Register it on a module (self.x = nn.Parameter(...)) and build the optimizer from "
           "model.parameters(); drop stale heads from the optimizer. If the model's own "
           "parameters were replaced after the optimizer was built (fully_shard, "
           "get_peft_model, to_empty), build the optimizer after that.")
    if all(parse_former(n) for n in group["name"]):  # left the model during a whole run
        fix = compose(("Drop them from the optimizer, which then holds only the model's own "
                       "tensors, and forget their state:", fix_code.drop_stale(group)),
                      ("Or build the optimizer again from the model's parameters after you "
                       "replace a part of it.", None))
    reachable = sorted({_registration(n, rebuild=False) for n in group["name"]
                        if not n.startswith("<")})
    if reachable:  # modules kept in a plain list or dict: the registration they call for
        fix = compose(*reachable, ("The optimizers that hold them need no change: registered, "
                                   "they are the same tensors, now the model's.", None))
    if "device" in group and (group["device"] == "meta").all():  # the big-model init bug
        message += (" They are on the meta device, with no values: the optimizer was built "
                    "before the model was materialised (`to_empty()`, `load_state_dict(..., "
                    "assign=True)`), which gave the model new tensors that no optimizer holds.")
        fix = ("Build the optimizer after materialising: model.to_empty(device=...) (or "
               "load_state_dict(..., assign=True)) first, then "
               "torch.optim.AdamW(model.parameters(), ...).")
    return message, fix


@verdict("unregistered", "error",
         ('A **persistent** tensor (alive across steps, not made during the step) that '
          'requires grad and receives gradients through the loss, but is neither a parameter '
          'of the model nor held by any optimizer (a module kept in a plain list, a plain '
          'tensor made with `requires_grad=True`): invisible to `.parameters()`, '
          '`state_dict()`, the optimizer and DDP, so nothing ever trains or saves it. An '
          'activation made a leaf inside the forward (`enable_input_require_grads()` under '
          'gradient checkpointing, an adversarial input) is never `unregistered`.'))
def unregistered(params, steps):
    used_while_rg = rg_used_counts(params, steps)[1]
    return (used_while_rg > 0) & ~in_optimizer(params) & ~params["in_model"].astype(bool)


@unregistered.explains
def _explain_unregistered(label, group, steps):
    message = (f"{subject(label, group)} requires grad and receives gradients, but it is not a "
               "parameter of the model and no optimizer holds it: model.parameters(), "
               "state_dict(), the optimizer and DDP never see it, so it stays at its initial "
               "value and is never saved.")
    fixes = sorted({_registration(n) for n in group["name"]})
    buffer = ("If it should not train, register it as a buffer instead "
              "(self.register_buffer(name, tensor.detach()), in place of the plain attribute).",
              None)
    return message, compose(*fixes, buffer)


def _registration(name: str, rebuild: bool = True) -> tuple[str, str | None]:
    """(words, code) of the registration a tensor's path calls for, in its module's
    `__init__`: a plain list or dict of modules, a list of tensors, a plain tensor attribute,
    or one that could not be named (words only). `rebuild`: then rebuild the optimizer."""
    if name.startswith("<"):
        return ("Find the tensor (shape and dtype in its name) and register it on the module "
                "that uses it: self.x = nn.Parameter(x).", None)
    head, _, rest = name.partition("[")
    owner, _, attr = head.rpartition(".")
    where = f" (on {owner})" if owner else ""
    then = ", then rebuild the optimizer" if rebuild else ""
    if not rest:
        return (f"Register it in the module's __init__{where}, after it is made{then}:",
                f"self.{attr} = nn.Parameter(self.{attr})")
    module_inside = "." in rest.partition("]")[2]  # `cells[0].weight`: a module in the list
    if rest.startswith(("'", '"')):
        kind = "nn.ModuleDict" if module_inside else "nn.ParameterDict"
    else:
        kind = "nn.ModuleList" if module_inside else "nn.ParameterList"
    return (f"Hold them in {kind}, in the module's __init__{where}, after they are "
            f"made{then}:", f"self.{attr} = {kind}(self.{attr})")
