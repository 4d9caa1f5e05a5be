"""Where the HF `Trainer`'s optimizer came from, as the callback saw it before training.

Two ways, told apart by identity at `on_train_begin`:

- handed in as `Trainer(..., optimizers=(optimizer, scheduler))`: it is `trainer.optimizer` at
  `on_init_end`, and the Trainer builds none (its `create_optimizer` returns it). The user's
  call is read for the lines that built it (`measure.origin.handed`).
- built by the Trainer's own `create_optimizer` (transformers' trainer.py), inside `train()`:
  two groups, decay and no decay (the names `get_decay_parameter_names` picks), of the
  parameters of the model it is given (`trainer.model`) that require grad at that moment.
  Whether the groups were exactly that is checked as the call returns (an `optim` such as
  GaLore, LOMO or Muon groups them its own way).

Each time, which of the model's tensors did not require grad then (`frozen_then`) and which
were not yet among its parameters (`absent_then`) is noted, by identity, and named at
`on_train_begin` as the watch names them. The records carry it to the orphan's wording
(`judge.levers`); `judge.sources` keeps on a finding only its own tensors' names.
"""

from __future__ import annotations

import contextlib
import linecache
import os

from ..measure.origin.handed import handed_sources, listed_group_lines
from ..measure.origin.provenance import class_name
from ..measure.origin.user_code import installed


class Snapshot:
    """A model's parameters at one moment: which tensors (held, so that their ids stay
    theirs until `facts`) and which of them did not require grad."""

    def __init__(self, model):
        self.params = list(model.parameters())
        self.frozen = {id(p) for p in self.params if not p.requires_grad}

    def facts(self, model) -> dict:
        """The names, in `model` now, of the tensors frozen then and of those absent then."""
        present = {id(p) for p in self.params}
        named = list(model.named_parameters())
        return {"frozen_then": [n for n, p in named if id(p) in self.frozen],
                "absent_then": [n for n, p in named if id(p) not in present]}


def inner(optimizer):
    """The torch optimizer under accelerate's `AcceleratedOptimizer`."""
    return getattr(optimizer, "optimizer", optimizer)


class OptimizerOrigin:
    """What the callback noted of the Trainer's optimizer: `note_handed` at `on_init_end`,
    `note_built` as `create_optimizer` returns, `records` at `on_train_begin`."""

    def __init__(self):
        self.handed = None  # (optimizer, its records, Snapshot at Trainer(...))
        self.built = None   # (optimizer, Snapshot at create_optimizer, rule held, the setting
        #                     that chose how: TrainingArguments.optim, optimizer_cls_and_kwargs)

    def note_handed(self, trainer, caller) -> None:
        """The optimizer passed as `optimizers=` (if any): the user's lines from `caller`, the
        frame that called `Trainer(...)`, read now (no frame is kept)."""
        opt = trainer.optimizer
        if opt is not None:
            with contextlib.suppress(Exception):  # an extra: never into the Trainer's init
                self.handed = (opt, handed_sources(caller, inner(opt), "optimizers"),
                               Snapshot(trainer.model))

    def note_built(self, trainer, args, kwargs) -> None:
        """After the Trainer's `create_optimizer(model=None)`: whether its groups are its rule's
        (every tensor of the model that requires grad, none else), and the model's state."""
        model = kwargs.get("model", args[0] if args else None)
        model = trainer.model if model is None else model
        opt = inner(trainer.optimizer)
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        rule = held == {id(p) for p in model.parameters() if p.requires_grad}
        optim = getattr(trainer.args, "optim", "")
        chosen = ("Trainer(optimizer_cls_and_kwargs=...)"
                  if getattr(trainer, "optimizer_cls_and_kwargs", None) is not None
                  else f'TrainingArguments(optim="{getattr(optim, "value", optim)}")')
        self.built = (opt, Snapshot(model), rule, chosen)

    def records(self, recorded: list, optimizer, model) -> list:
        """The records of `optimizer`'s groups: the handed one's, the Trainer's own
        construction's with its rule and lever, or else what was recorded, as it is (also
        when reading them fails: never into the training loop)."""
        handed, built, self.handed, self.built = self.handed, self.built, None, None
        try:
            return self._records(recorded, inner(optimizer), model, handed, built)
        except Exception:
            return recorded

    @staticmethod
    def _records(recorded, opt, model, handed, built) -> list:
        """`records` for the torch optimizer `opt`: what was noted counts only for the very
        optimizer it was noted of (by identity; DeepSpeed, say, replaces it)."""
        if handed is not None and opt is inner(handed[0]):
            facts = handed[2].facts(model)
            return [{**r, **facts} for r in handed[1] or _bare(opt)]
        if built is None or opt is not built[0] or not recorded or not all(
                installed(r.get("file", "")) for r in recorded):
            return recorded
        _, snapshot, rule, chosen = built
        if any(_overridden(r) for r in recorded):  # noted as the override returned, not the
            return [_trainer_record(r, 0, None, chosen, {}) for r in recorded]  # Trainer's
        facts = snapshot.facts(model)
        groups = len(opt.param_groups)
        return [_trainer_record(r, groups, rule, chosen, facts) for r in recorded]


def _bare(opt) -> list[dict]:
    """Records of a handed optimizer whose construction could not be read: the lever alone."""
    return [{"optimizer": 0, "group": j, "class": class_name(opt), "file": "", "line": None,
             "lines": [], "how": "handed", "lever": "optimizers", "lever_at": ""}
            for j in range(len(opt.param_groups))]


def _overridden(record: dict) -> bool:
    """The Trainer's `create_optimizer` ran inside a user's override (`super()`)."""
    return any(function == "create_optimizer" and not installed(file)
               for function, file, _ in record.get("callers") or ())


def _trainer_record(record: dict, groups: int, rule, chosen: str, facts: dict) -> dict:
    """A group the Trainer's `create_optimizer` built: its rule's element of the groups'
    list when the rule was seen to hold, else only the call's line (the recorded search for
    the name passed may land on a branch that did not run). `rule` None: not checked."""
    line = record.get("call_line", record["line"])
    shown = {"line": line, "lines": [linecache.getline(record["file"], line).strip()]}
    if rule:
        with contextlib.suppress(Exception):  # no source to read: the call's line
            shown = listed_group_lines(record["file"], line, record["group"], groups) or shown
    return {**record, **shown, "how": "trainer", "lever": "trainer",
            "lever_at": f"{os.path.basename(record['file'])}:{line}", "rule": rule,
            "chosen_by": chosen, **facts}
