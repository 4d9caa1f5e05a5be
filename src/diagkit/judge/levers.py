"""The lever an orphan's fix names where a framework builds or takes the optimizer.

Read from the finding's source records (`measure.provenance`, and for the HF Trainer
`integrations._trainer_optimizer`):

- a hook the user wrote, where the groups were built: Lightning's `configure_optimizers`, an
  HF `create_optimizer` the user overrode (`user_hook`);
- the HF Trainer's `optimizers=` argument, or the Trainer's own `create_optimizer`, with what
  was seen of the orphan's tensors when the optimizer was handed over or built
  (`trainer_lever`).

Every sentence says what diagkit saw, never a cause it did not see (the docs' "Where the
optimizer was built (`Finding.source`)").
"""

from __future__ import annotations

from pathlib import Path

from .wording import params_expr

# The framework hooks in which a user builds the optimizer a trainer then uses.
_HOOKS = ("configure_optimizers", "create_optimizer")
_SHOWN = 3  # names listed where only some of a finding's tensors share a fact
_THEN = ("they were built", "the model they were built from")  # the Trainer's own groups


def user_hook(group) -> tuple[str, str] | None:
    """(the hook, file:line) when the optimizer's groups were built in a framework's hook the
    user wrote, or in a function it called, else None."""
    for record in group.attrs.get("sources") or ():
        frames = [[record.get("function"), record.get("file", ""), record.get("line")],
                  *record.get("callers", [])]
        theirs = _installed(record.get("file", "")) or "lever" in record  # a Trainer's own
        for function, file, line in ([] if theirs else frames):
            if function in _HOOKS:
                return function, f"{Path(file).name}:{line}"
    return None


def hook_root(hook: str) -> str:
    """What the code of `hook` calls the model, so that a fix pastes where it says: `self`
    inside a LightningModule's `configure_optimizers`, `self.model` inside a Trainer's
    `create_optimizer`."""
    return "self.model" if hook == "create_optimizer" else "self"


def trainer_lever(label: str, group, expr: str, freeze: str) -> tuple[str, str] | None:
    """(what the message adds, the fix) for an orphan under the HF Trainer's optimizer,
    handed in (`optimizers=`) or built by the Trainer itself; None for any other optimizer."""
    records = [r for r in group.attrs.get("sources") or ()
               if r.get("lever") in ("optimizers", "trainer")]
    if not records:
        return None
    names = list(group["name"])
    seen = {key: sorted({n for r in records for n in r.get(key) or ()} & set(names))
            for key in ("frozen_then", "absent_then")}
    if records[0]["lever"] == "optimizers":
        return _handed(records[0], seen, names, expr, freeze)
    return _built(records[0], seen, names, expr, freeze,
                  own=params_expr(label, group, hook_root("create_optimizer")))


def _handed(record, seen, names, expr, freeze) -> tuple[str, str]:
    """The optimizer passed as `Trainer(optimizers=(optimizer, scheduler))`."""
    at = f" ({record['lever_at']})" if record.get("lever_at") else ""
    built = (f", built at {Path(record['file']).name}:{record.get('call_line', record['line'])}"
             if record.get("how") in ("call", "assigned") else "")
    message = (f" The Trainer trains the optimizer it was handed as `Trainer(optimizers=...)`"
               f"{at} and builds none of its own."
               + _seen(seen, names, "Trainer(...) was made", "`trainer.model`"))
    fix = (f"Put it in the optimizer you pass as `Trainer(optimizers=(optimizer, scheduler))`"
           f"{at}{built}: include {expr} in its params — or leave `optimizers=` out, and the "
           "Trainer builds its groups from every parameter of `trainer.model` that requires "
           f"grad as train() begins{freeze}")
    return message, fix


def _built(record, seen, names, expr, freeze, own: str) -> tuple[str, str]:
    """The optimizer the Trainer's own `create_optimizer` built inside `train()`: by its rule
    (checked as it returned), by the setting that chose otherwise, or inside a user's
    override that called it (where nothing was checked at the Trainer's return; `own`: the
    tensors as that override's code names them)."""
    at = record["lever_at"]
    override = next((f"{Path(file).name}:{line}" for function, file, line
                     in record.get("callers") or () if function == "create_optimizer"), None)
    if record.get("rule") is None and override:
        return (f" The Trainer's own `create_optimizer` ({at}) built the optimizer, called from "
                f"your `create_optimizer` ({override})."), (
            f"Put it in the optimizer your `create_optimizer` ({override}) returns: the "
            "Trainer's, which it calls, takes only parameters of `trainer.model` that require "
            "grad as it runs (unless `optim` groups them its own way); e.g. after that call: "
            f'self.optimizer.add_param_group({{"params": {own}}}){freeze}')
    message = f" The optimizer is the Trainer's own: its `create_optimizer` ({at}) built it"
    if not record.get("rule"):
        return (message + " as `train()` began, not by its default rule (every parameter of "
                f"`trainer.model` that requires grad): `{record.get('chosen_by')}` chose "
                "them." + _seen(seen, names, *_THEN)), (
            "Give the Trainer groups that hold it: pass `Trainer(..., optimizers=(optimizer, "
            f"None))`, or override `Trainer.create_optimizer`{freeze}")
    return _by_rule(message, seen, names, expr, freeze)


def _by_rule(message, seen, names, expr, freeze) -> tuple[str, str]:
    """The Trainer's own groups, seen to be its rule's: what was seen of the tensors then."""
    message += (" as `train()` began, and never again: the parameters of `trainer.model` "
                "that required grad at that moment, in two groups (weight decay for the names "
                "`get_decay_parameter_names` returns, none for the rest: biases and norms).")
    if not seen["frozen_then"] and not seen["absent_then"]:
        return message + (
            " When they were built, a tensor by this name required grad and went into them: "
            "this one was put in its place afterwards, or the groups were changed."), (
            "Put the new tensor in the optimizer as you put it in the model: "
            f'trainer.optimizer.add_param_group({{"params": {expr}}}) — or put it in place '
            f"before trainer.train(){freeze}")
    message += _seen(seen, names, *_THEN)
    if seen["frozen_then"]:
        message += " A tensor unfrozen later does not join them."
    if not seen["frozen_then"]:
        return message, (
            "Attach it to the model before trainer.train(), or give the Trainer groups that "
            "hold it: pass `Trainer(..., optimizers=(optimizer, None))` with an optimizer built "
            f"after it was attached, or override `Trainer.create_optimizer`{freeze}")
    return message, (
        "Make it trainable before trainer.train(), or give the Trainer groups that hold it "
        "from the start, frozen or not (a torch optimizer skips a tensor whose .grad is None): "
        "pass `Trainer(..., optimizers=(torch.optim.AdamW(model.parameters(), "
        f"lr=args.learning_rate), None))`, or override `Trainer.create_optimizer`{freeze}")


def _seen(seen: dict, names: list, when: str, model: str) -> str:
    """One sentence of what was seen of the finding's tensors `when`; '' if nothing."""
    parts = []
    for key, what in (("frozen_then", "did not require grad"),
                      ("absent_then", f"not a parameter of {model}")):
        found = seen[key]
        if found:
            subject = ("it" if len(names) == 1 else "they") if len(found) == len(names) else (
                ", ".join(f"`{n}`" for n in found[:_SHOWN])
                + (f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""))
            verb = "" if key == "frozen_then" else ("was " if len(found) == 1 else "were ")
            parts.append(f"{subject} {verb}{what}")
    return f" When {when}, {'; '.join(parts)}." if parts else ""


def _installed(file: str) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in Path(file).parts)
