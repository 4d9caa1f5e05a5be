"""The lever an orphan's fix names where a framework builds or takes the optimizer.

Read from the finding's source records (`measure.origin.provenance`, and for the HF Trainer
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


from ..core.fixtext import compose
from ..core.format import place
from ..measure.origin.user_code import installed
from . import fix_code
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
        theirs = installed(record.get("file", "")) or "lever" in record  # a Trainer's own
        for function, file, line in ([] if theirs else frames):
            if function in _HOOKS:
                return function, _at(record, file, line)
    return None


def hook_root(hook: str) -> str:
    """What the code of `hook` calls the model, so that a fix pastes where it says: `self`
    inside a LightningModule's `configure_optimizers`, `self.model` inside a Trainer's
    `create_optimizer`."""
    return "self.model" if hook == "create_optimizer" else "self"


def trainer_lever(label: str, group) -> tuple[str, str] | None:
    """(what the message adds, the fix) for an orphan under the HF Trainer's optimizer,
    handed in (`optimizers=`) or built by the Trainer itself; None for any other optimizer.
    Its code names them as a notebook reaches them after training, `trainer.model` and
    `trainer.optimizer` (the callback's names, `integrations.transformers.NAMES`)."""
    records = [r for r in group.attrs.get("sources") or ()
               if r.get("lever") in ("optimizers", "trainer")]
    if not records:
        return None
    joined = fix_code.join(label, group, "trainer.model", "trainer.optimizer") or (
        "Add it to the optimizer:", f'trainer.optimizer.add_param_group({{"params": '
        f'{params_expr(label, group, "trainer.model")}}})')
    freeze = ("Or, if it should stay fixed, freeze it:",
              fix_code.freeze(label, group, "trainer.model"))
    names = list(group["name"])
    seen = {key: sorted({n for r in records for n in r.get(key) or ()} & set(names))
            for key in ("frozen_then", "absent_then")}
    if records[0]["lever"] == "optimizers":
        # words about the user's own code, where the optimizer is built before Trainer(...)
        return _handed(records[0], seen, names, params_expr(label, group, "model"), freeze)
    return _built(records[0], seen, names, joined, freeze,
                  own=params_expr(label, group, hook_root("create_optimizer")))


def _handed(record, seen, names, expr, freeze) -> tuple[str, str]:
    """The optimizer passed as `Trainer(optimizers=(optimizer, scheduler))`."""
    at = f" ({record['lever_at']})" if record.get("lever_at") else ""
    built = (f", built at {_at(record, record['file'], record.get('call_line', record['line']))}"
             if record.get("how") in ("call", "assigned") else "")
    message = (f" The Trainer trains the optimizer it was handed as `Trainer(optimizers=...)`"
               f"{at} and builds none of its own."
               + _seen(seen, names, "Trainer(...) was made", "`trainer.model`"))
    fix = compose(
        (f"Put it in the optimizer you pass as `Trainer(optimizers=(optimizer, scheduler))`"
         f"{at}{built}: include {expr} in its params.", None),
        ("Or leave `optimizers=` out, and the Trainer builds its groups from every parameter "
         "of `trainer.model` that requires grad as train() begins.", None), freeze)
    return message, fix


def _built(record, seen, names, joined, freeze, own: str) -> tuple[str, str]:
    """The optimizer the Trainer's own `create_optimizer` built inside `train()`: by its rule
    (checked as it returned), by the setting that chose otherwise, or inside a user's
    override that called it (where nothing was checked at the Trainer's return; `own`: the
    tensors as that override's code names them)."""
    at = record["lever_at"]
    override = next((_at(record, file, line) for function, file, line
                     in record.get("callers") or () if function == "create_optimizer"), None)
    if record.get("rule") is None and override:
        return (f" The Trainer's own `create_optimizer` ({at}) built the optimizer, called from "
                f"your `create_optimizer` ({override})."), compose(
            (f"Put it in the optimizer your `create_optimizer` ({override}) returns: the "
             "Trainer's, which it calls, takes only parameters of `trainer.model` that "
             "require grad as it runs (unless `optim` groups them its own way). In your "
             "`create_optimizer`, after that call:",
             f'self.optimizer.add_param_group({{"params": {own}}})'), freeze)
    message = f" The optimizer is the Trainer's own: its `create_optimizer` ({at}) built it"
    give = ("Give the Trainer groups that hold it: pass `Trainer(..., optimizers=(optimizer, "
            "None))`{after}, or override `Trainer.create_optimizer`.")
    if not record.get("rule"):
        return (message + " as `train()` began, not by its default rule (every parameter of "
                f"`trainer.model` that requires grad): `{record.get('chosen_by')}` chose "
                "them." + _seen(seen, names, *_THEN)), compose(
            (give.format(after=""), None), freeze)
    return _by_rule(message, seen, names, joined, freeze, give)


def _by_rule(message, seen, names, joined, freeze, give: str) -> tuple[str, str]:
    """The Trainer's own groups, seen to be its rule's: what was seen of the tensors then."""
    message += (" as `train()` began, and never again: the parameters of `trainer.model` "
                "that required grad at that moment, in two groups (weight decay for the names "
                "`get_decay_parameter_names` returns, none for the rest: biases and norms).")
    if not seen["frozen_then"] and not seen["absent_then"]:
        return message + (
            " When they were built, a tensor by this name required grad and went into them: "
            "this one was put in its place afterwards, or the groups were changed."), compose(
            ("Put the new tensor in the optimizer as you put it in the model. "
             + joined[0], joined[1]),
            ("Or put it in place before trainer.train().", None), freeze)
    message += _seen(seen, names, *_THEN)
    if seen["frozen_then"]:
        message += " A tensor unfrozen later does not join them."
    if not seen["frozen_then"]:
        return message, compose(
            ("Attach it to the model before trainer.train().", None),
            (_or(give.format(after=" with an optimizer built after it was attached")), None),
            freeze)
    return message, compose(
        ("Make it trainable before trainer.train().", None),
        ("Or give the Trainer groups that hold it from the start, frozen or not (a torch "
         "optimizer skips a tensor whose .grad is None): pass `Trainer(..., optimizers=("
         "torch.optim.AdamW(model.parameters(), lr=args.learning_rate), None))`, or override "
         "`Trainer.create_optimizer`.", None), freeze)


def _or(words: str) -> str:
    """An alternative after the first: "Or give ..."."""
    return "Or " + words[:1].lower() + words[1:]


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


def _at(record: dict, file: str, line) -> str:
    """"file.py:12", or "cell [3], line 12" for a notebook cell the record names."""
    return place(file, line, (record.get("cells") or {}).get(file))


