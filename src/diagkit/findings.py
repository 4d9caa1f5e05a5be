"""From verdicts to what a person reads: findings with a concrete fix, and run-level advice.

One finding per verdict per module subtree: tensors sharing a verdict are reported under the
highest module whose every tensor has it ("decoder: 12 tensors, 1.2 MB"), so a dead branch is one
line, not a hundred. Pure functions of the tables; nothing here measures.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pandas as pd

from .schema import SEVERITY_RANK
from .summary import collapse_ranks
from .verdicts import VERDICTS


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    params: tuple[str, ...]
    message: str
    fix: str
    module: str = ""
    count: int = 0
    bytes: int = 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["params"] = list(self.params)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        return cls(**{**d, "params": tuple(d.get("params", ()))})


# ------------------------------------------------------------------ findings
def build_findings(params: pd.DataFrame, steps: pd.DataFrame,
                   check_errors=(), failure=None) -> list[Finding]:
    findings: list[Finding] = []
    if failure is not None:
        findings.append(Finding(
            "step_failed", "error", (),
            f"your training step raised at step {failure.step}: {failure.error}. "
            + (f"The {failure.step} step(s) before it are kept and judged below."
               if failure.step else "No step completed, so no tensor could be judged."),
            "Fix the error in the step (full traceback in diag.failure.traceback), then rerun."))
    for code, error in check_errors:
        findings.append(Finding(
            "check_failed", "error", (),
            f"the check for '{code}' crashed ({error}); its verdict is missing from this run.",
            "Report this as a diagkit bug, with the traceback of diagkit.verdicts.judge."))
    verdicts = params["verdicts"]
    steps = collapse_ranks(steps)
    for code, v in VERDICTS.items():
        flagged = verdicts.map(lambda vs, c=code: c in vs).to_numpy(dtype=bool)
        if not flagged.any():
            continue
        for label, rows, whole in subtrees(params, flagged):
            group = params.iloc[rows].copy()
            group.attrs["whole"] = whole
            message, fix = _EXPLAIN.get(code, _explain_generic)(code, label, group, steps)
            findings.append(Finding(code, v.severity, tuple(group["name"]), message, fix,
                                    module=label, count=len(group),
                                    bytes=int(group["bytes"].sum())))
    return sort_findings(findings)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Worst first, then the biggest."""
    return sorted(findings, key=lambda f: (-SEVERITY_RANK[f.severity], -f.bytes, f.code, f.module))


def _ancestors(module: str) -> list[str]:
    parts = module.split(".") if module else []
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


MAX_GROUPS = 6  # past this many groups for one verdict, coarsen to broader subtrees


def subtrees(params: pd.DataFrame, flagged: np.ndarray) -> list[tuple[str, list[int], bool]]:
    """Group flagged rows under the highest module whose whole subtree is flagged.

    Returns (label, rows, whole). Scattered hits (every bias, say) would give one group per
    module; beyond MAX_GROUPS they are gathered under their broadest common subtrees instead,
    and such a group is marked partial (whole=False).
    """
    total, hit = Counter(), Counter()
    for module, in_model, is_hit in zip(params["module"], params["in_model"], flagged):
        if in_model:
            for anc in _ancestors(module):
                total[anc] += 1
                hit[anc] += int(is_hit)
    keys: dict[int, str] = {}
    for i in np.flatnonzero(flagged):
        row = params.iloc[i]
        if not row["in_model"]:
            keys[int(i)] = row["name"]
            continue
        whole = next((a for a in _ancestors(row["module"]) if hit[a] == total[a]), None)
        keys[int(i)] = whole if whole is not None else row["name"]
    if len(set(keys.values())) > MAX_GROUPS:
        keys = _coarsen(keys, params)
    groups: dict[str, list[int]] = {}
    for i, key in keys.items():
        groups.setdefault(key, []).append(i)
    return [(key, rows, len(rows) == 1 or (key in total and hit[key] == total[key]))
            for key, rows in groups.items()]


def _coarsen(keys: dict[int, str], params: pd.DataFrame) -> dict[int, str]:
    """The deepest module level at which the groups number at most MAX_GROUPS."""
    in_model = params["in_model"].to_numpy()
    depth = max(len(k.split(".")) for k in keys.values())
    for d in range(depth, 0, -1):
        trial = {i: (".".join(k.split(".")[:d]) if in_model[i] else k) for i, k in keys.items()}
        if len(set(trial.values())) <= MAX_GROUPS:
            return trial
    return {i: ("" if in_model[i] else k) for i, k in keys.items()}


# ------------------------------------------------------------------ wording
def accessor(name: str, root: str = "model") -> str:
    """`layers.0.weight` -> `model.layers[0].weight`: code the user can paste."""
    if not name:
        return root
    out = root
    for part in name.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if part.isidentifier()
                                                   else f".get_submodule({part!r})")
    return out


def subject(label: str, group: pd.DataFrame) -> str:
    size = human_bytes(int(group["bytes"].sum()))
    if len(group) == 1:
        return f"`{group['name'].iloc[0]}` ({size})"
    where = f"`{label}`" if label else "the whole model"
    if not group.attrs.get("whole", True):
        where = f"{len(group)} tensors in {where}" if label else f"{len(group)} tensors"
        return f"{where} ({size}; e.g. `{group['name'].iloc[0]}`)"
    return f"{where} ({len(group)} tensors, {size})"


def _iter_expr(label: str, group: pd.DataFrame) -> str:
    """Something to loop over in a fix: the module's .parameters() when a subtree is whole."""
    if len(group) > 1 and label and group["in_model"].all() and group.attrs.get("whole", True):
        return f"{accessor(label)}.parameters()"
    return _params_expr(label, group)


def _params_expr(label: str, group: pd.DataFrame) -> str:
    if len(group) == 1:
        return f"[{accessor(group['name'].iloc[0])}]"
    if label and group["in_model"].all() and group.attrs.get("whole", True):
        return f"list({accessor(label)}.parameters())"
    return "[" + ", ".join(accessor(n) for n in group["name"]) + "]"


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _trend(steps: pd.DataFrame, names, column: str) -> str:
    s = steps[steps["name"].isin(set(names))]
    if s.empty:
        return ""
    per_step = s.groupby("step")[column].apply(lambda x: float(np.sqrt(np.nansum(x ** 2))))
    if len(per_step) < 2:
        return f"{per_step.iloc[0]:.3g}"
    return f"{per_step.iloc[0]:.3g} → {per_step.iloc[-1]:.3g} over {len(per_step)} steps"


def _explain_orphan(code, label, group, steps):
    names = list(group["name"])
    trend = _trend(steps, names, "grad_total_norm")
    message = (f"{subject(label, group)} requires grad and receives gradients, but no optimizer "
               f"holds it: it is never trained"
               + (f", and its .grad norm goes {trend} because optimizer.zero_grad() never "
                  "clears it" if trend else "") + ".")
    expr = _params_expr(label, group)
    fix = f'optimizer.add_param_group({{"params": {expr}}})'
    prefixed = [n for n in names if n.startswith("module.")]
    if prefixed:
        top = ".".join(prefixed[0].split(".")[:2])
        message += (f" Its name carries the DDP wrapper prefix `module.`: a filter on names such "
                    f"as `not n.startswith(\"{top}\")` excludes it (the first seed's bug).")
        fix = (f'Include it explicitly, by identity: {fix}  — or, if it should stay fixed, '
               f'freeze it: for p in {_iter_expr(label, group)}: p.requires_grad_(False)')
    else:
        fix = (f"Add it to an optimizer: {fix}  — or, if it should stay fixed, freeze it: "
               f"for p in {_iter_expr(label, group)}: p.requires_grad_(False)")
    return message, fix


def _explain_unused(code, label, group, steps):
    whole_module = (label and len(group) > 1 and group["in_model"].all()
                    and group.attrs.get("whole", True))
    message = (f"{subject(label, group)} requires grad but never receives a gradient: the forward "
               "never uses it. Under DDP this forces find_unused_parameters=True, and it is dead "
               "weight in the optimizer and every checkpoint.")
    drop = (f"  — or drop the submodule before building the optimizer: del {accessor(label)}"
            if whole_module else "")
    fix = (f"Freeze it: for p in {_iter_expr(label, group)}: p.requires_grad_(False){drop}; "
           "then wrap with DDP(model, find_unused_parameters=False).")
    return message, fix


def _explain_intermittent(code, label, group, steps):
    s = steps[steps["name"].isin(set(group["name"])) & steps["requires_grad"].astype(bool)]
    used_at = sorted(s.loc[s["used"].astype(bool), "step"].unique().tolist())
    message = (f"{subject(label, group)} receives gradients on some steps only "
               f"(steps {used_at}): the forward takes a data-dependent branch.")
    fix = ("Keep DDP(find_unused_parameters=True) (static_graph is not possible), or make the "
           "branch contribute every step, e.g. loss = loss + 0.0 * sum(p.sum() for p in "
           f"{_params_expr(label, group)}).")
    return message, fix


def _explain_grad_not_cleared(code, label, group, steps):
    trend = _trend(steps, group["name"], "grad_total_norm")
    message = (f"{subject(label, group)}: each step's gradient lands on the .grad left by the "
               f"previous step, so gradients accumulate across steps"
               + (f" (.grad norm {trend})" if trend else "") + ".")
    fix = ("Make something zero it every step: put it in the optimizer (its zero_grad clears "
           "it), or call model.zero_grad(set_to_none=True) instead of optimizer.zero_grad().")
    return message, fix


def _explain_frozen_in_optimizer(code, label, group, steps):
    message = (f"{subject(label, group)} is held by an optimizer although requires_grad is False: "
               "momentum or weight decay can still move it, and its state costs memory.")
    fix = ("Build the optimizer from trainable tensors only: "
           "torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], ...)")
    return message, fix


def _explain_frozen_but_changing(code, label, group, steps):
    message = (f"{subject(label, group)} changed on a step on which it did not require grad: "
               "something still updates it (momentum or weight decay of an optimizer that holds "
               "it, or an in-place write).")
    fix = ("When freezing, also remove it from the optimizer, or zero_grad(set_to_none=True) so "
           "the optimizer skips it; check in-place writes to parameters.")
    return message, fix


def _explain_stalled(code, label, group, steps):
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


def _explain_zero_gradient(code, label, group, steps):
    message = (f"{subject(label, group)} receives gradients, but every one is exactly zero: "
               "it is used, yet cannot influence the loss (multiplied by zero, masked, or "
               "behind a saturated activation).")
    fix = "Check the forward around it for a zero factor, a mask, or a .detach()-like cut."
    return message, fix


def _explain_nonfinite_grad(code, label, group, steps):
    message = f"{subject(label, group)} received a gradient holding NaN or Inf."
    fix = ("Find the first op producing it with torch.autograd.set_detect_anomaly(True); check "
           "the loss scale, log/sqrt/division of near-zero values, and the learning rate.")
    return message, fix


def _explain_decay(code, label, group, steps):
    message = (f"{subject(label, group)} is a bias or a normalization weight in a group with "
               "weight_decay > 0; decaying these usually hurts.")
    fix = ("Split the groups by identity (as minGPT's configure_optimizers does): "
           "decay = [p for n, p in model.named_parameters() if p.dim() >= 2]; "
           "no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]; "
           'AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, '
           '"weight_decay": 0.0}])')
    return message, fix


def _explain_multiple(code, label, group, steps):
    pairs = sorted({p for m in group["memberships"] for p in m})
    message = (f"{subject(label, group)} is held by more than one optimizer ({pairs}): it is "
               "stepped twice per training step.")
    fix = "Give each tensor to exactly one optimizer; assert it as minGPT does when building them."
    return message, fix


def _explain_not_in_model(code, label, group, steps):
    message = (f"{subject(label, group)} is held by an optimizer but is not a parameter of the "
               "model: model.zero_grad(), state_dict() and DDP's gradient sync all miss it.")
    fix = ("Register it on a module (self.x = nn.Parameter(...)) and build the optimizer from "
           "model.parameters(); drop stale heads from the optimizer.")
    return message, fix


def _explain_generic(code, label, group, steps):
    return f"{subject(label, group)}: {VERDICTS[code].meaning}.", "See the README's verdict table."


_EXPLAIN = {
    "orphan": _explain_orphan,
    "unused": _explain_unused,
    "intermittent": _explain_intermittent,
    "grad_not_cleared": _explain_grad_not_cleared,
    "frozen_in_optimizer": _explain_frozen_in_optimizer,
    "frozen_but_changing": _explain_frozen_but_changing,
    "stalled": _explain_stalled,
    "zero_gradient": _explain_zero_gradient,
    "nonfinite_grad": _explain_nonfinite_grad,
    "decay_on_norm_or_bias": _explain_decay,
    "in_multiple_optimizers": _explain_multiple,
    "not_in_model": _explain_not_in_model,
}


# ------------------------------------------------------------------ advice
def build_advice(params: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """The right DDP flags for this model as observed, each with its evidence."""
    model = params[params["in_model"].astype(bool)]
    names = set(model["name"])
    s = steps[steps["name"].isin(names)]
    if "rank" in s.columns:  # every (rank, step) is one observation of what DDP will see
        s = s.assign(step=s["rank"].astype(str) + ":" + s["step"].astype(str))
        steps_word = "rank-steps"
    else:
        steps_word = "steps"
    rg = s[s["requires_grad"].astype(bool)]
    n_steps = int(s["step"].nunique()) if len(s) else 0
    rg_count = rg.groupby("name").size()
    used_count = rg[rg["used"].astype(bool)].groupby("name").size()
    used_count = used_count.reindex(rg_count.index, fill_value=0)
    never = sorted(rg_count.index[used_count == 0], key=list(model["name"]).index)
    sometimes = sorted(rg_count.index[(used_count > 0) & (used_count < rg_count)],
                       key=list(model["name"]).index)
    dead_bytes = int(model.loc[model["name"].isin(never), "bytes"].sum())
    need = bool(never or sometimes)

    if n_steps == 0:
        fup_evidence = "no step completed, so nothing was observed"
    elif not need:
        fup_evidence = (f"every tensor that requires grad received a gradient on every one of "
                        f"the {n_steps} observed {steps_word}")
    else:
        parts = []
        if never:
            parts.append(f"{len(never)} tensor(s) requiring grad never received a gradient "
                         f"({human_bytes(dead_bytes)} of dead weight)")
        if sometimes:
            parts.append(f"{len(sometimes)} tensor(s) received gradients on some steps only")
        fup_evidence = "; ".join(parts) + f" over {n_steps} {steps_word}"
    if never and not sometimes:
        recommendation = ("freeze or drop the never-used tensors (see the 'unused' findings), "
                          "then use find_unused_parameters=False")
    elif sometimes:
        recommendation = ("keep find_unused_parameters=True while the forward's branches are "
                          "data-dependent")
    else:
        recommendation = "use find_unused_parameters=False"

    static, static_evidence = _static_graph(rg if len(s) else s, s, n_steps, steps_word)
    return {
        "find_unused_parameters": {
            "value": need,
            "evidence": fup_evidence,
            "unused": never,
            "intermittent": sometimes,
            "unused_bytes": dead_bytes,
            "after_fix": bool(sometimes),
            "recommendation": recommendation,
        },
        "static_graph": {"value": static, "evidence": static_evidence},
        "steps": n_steps,
    }


def _static_graph(rg: pd.DataFrame, s: pd.DataFrame, n_steps: int,
                  steps_word: str = "steps") -> tuple[bool, str]:
    if n_steps == 0:
        return False, "no step completed"
    rg_sets = s[s["requires_grad"].astype(bool)].groupby("step")["name"].apply(frozenset)
    used_sets = rg[rg["used"].astype(bool)].groupby("step")["name"].apply(frozenset)
    used_sets = used_sets.reindex(s["step"].unique()).apply(
        lambda x: x if isinstance(x, frozenset) else frozenset())
    if rg_sets.nunique() > 1:
        return False, "the set of tensors requiring grad changed between steps"
    if used_sets.nunique() > 1:
        return False, "the set of tensors receiving gradients changed between steps"
    if n_steps == 1:
        return True, "one step observed: nothing contradicts a static graph (observe more steps)"
    return True, f"the same tensors received gradients on all {n_steps} observed {steps_word}"


def worst_severity(findings: list[Finding]) -> str | None:
    if not findings:
        return None
    return max((f.severity for f in findings), key=SEVERITY_RANK.__getitem__)

