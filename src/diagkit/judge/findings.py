"""From verdicts to what a person reads: one finding per verdict per module subtree.

Tensors sharing a verdict are reported under the highest module whose every tensor has it
("decoder: 12 tensors, 1.2 MB"), so a dead branch is one line, not a hundred. Pure functions of
the tables; nothing here measures.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from ..core import severity
from ..core.format import human_bytes
from ..core.result import Finding, StepFailure
from ..core.schema import parse_former
from ..measure.tables.aggregate import fold_ranks
from .sources import finding_sources
from .verdict import RUN_VERDICTS
from .verdicts import VERDICTS
from ..core.fixtext import compose
from .wording import Roots, accessor, subject

_DDP_REDUCTION_ERROR = "Expected to have finished reduction"  # DDP's refusal of unused tensors


class FindingContext:
    """What an explanation may read beside its group and the folded steps (as
    `group.attrs["context"]`): the steps as each rank observed them (`by_rank`), the wrappers
    the model was given in (`wrappers`, None when not known), DDP's facts (`ddp`, see
    `measure.engines.ddp_facts`) and the user's names for the model and the optimizers (`names`,
    `meta["names"]` of a watch: `judge.wording.roots`; None: `model`, `optimizer`), and the
    whole params table (`params`: which groups fit an orphan, `judge.homes`). Shared, never
    copied: pandas deep-copies a frame's attrs on every operation."""

    def __init__(self, by_rank: pd.DataFrame, wrappers=None, ddp=None, names=None,
                 params: pd.DataFrame | None = None):
        self.by_rank, self.wrappers, self.ddp = by_rank, wrappers, ddp or {}
        self.names = names if isinstance(names, dict) else {}
        self.params = params

    def __deepcopy__(self, memo):
        return self


def build_findings(params: pd.DataFrame, steps: pd.DataFrame, check_errors=(),
                   failure: StepFailure | None = None, extra=(), sources=(),
                   context: dict | None = None) -> list[Finding]:
    """Every finding of a run: DDP's own refusal of unused tensors first, then worst first the
    step that failed, the rules that crashed, one per verdict per subtree, and `extra` (a
    checkpoint's). `sources`: where each optimizer group was built (`judge.sources`);
    `context`: `wrappers`, `ddp` and `names` for `FindingContext`."""
    findings = _failure_findings(failure, check_errors)
    verdicts = params["verdicts"]
    shared = FindingContext(steps, **(context or {}), params=params)
    steps = fold_ranks(steps)
    run_level = params.attrs.get(RUN_VERDICTS, ())
    for code, v in VERDICTS.items():
        if v.run_level:  # the run's: one finding, over every tensor
            flagged = np.full(len(params), code in run_level)
        else:
            flagged = verdicts.map(lambda vs, c=code: c in vs).to_numpy(dtype=bool)
        if not flagged.any():
            continue
        explain = v.explain or _explain_generic(v)
        groups = ([("", list(range(len(params))), True)] if v.run_level
                  else subtrees(params, flagged))
        for label, rows, whole in groups:
            group = params.iloc[rows].copy()
            group.attrs["whole"] = whole
            group.attrs["context"] = shared
            source = finding_sources(code, group, params, sources)
            group.attrs["sources"] = source  # where the groups were built: the user's lever
            message, fix = explain(label, group, steps)
            findings.append(Finding(code, v.severity, tuple(group["name"]), message, fix,
                                    module=label, count=len(group),
                                    bytes=int(group["bytes"].sum()), source=source))
    # DDP's refusal is why the run stopped: it leads, before the sorted rest.
    return (_ddp_findings(params, failure, Roots(shared.names))
            + sort_findings(findings + list(extra)))


def _failure_findings(failure: StepFailure | None, check_errors=()) -> list[Finding]:
    """The user's step that raised, and the rules that crashed: errors of the run itself."""
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
            "Report this as a diagkit bug, with the traceback of diagkit.judge.verdicts.judge."))
    return findings


def _ddp_findings(params: pd.DataFrame, failure: StepFailure | None,
                  roots: Roots) -> list[Finding]:
    """DDP(find_unused_parameters=False) stopping the run, as a finding naming the tensors it
    refused (those the verdicts call unused or intermittent); `roots`: the code's names."""
    if failure is None or _DDP_REDUCTION_ERROR not in failure.error:
        return []
    unused = unused_tensors(params)
    names = unused["unused"] + unused["intermittent"]
    size = human_bytes(unused["unused_bytes"])
    listed = ", ".join(f"`{n}`" for n in names[:8]) + (
        f" and {len(names) - 8} more" if len(names) > 8 else "")
    return [Finding(
        "ddp_unused_parameters", "error", tuple(names),
        f"DistributedDataParallel(find_unused_parameters=False) stopped the run at step "
        f"{failure.step}: {len(names)} tensor(s) requiring grad got no gradient"
        + (f": {listed} ({size})" if names else "") + ".",
        compose(("Freeze those tensors (or drop them) before the model is wrapped in DDP:",
                 f"for p in [{', '.join(accessor(n, roots.model) for n in names)}]: "
                 "p.requires_grad_(False)" if names else None),
                ("Or, if the forward really skips them on some steps, wrap it in "
                 "DDP(model, find_unused_parameters=True).", None)),
        module="", count=len(names), bytes=unused["unused_bytes"])]


def unused_tensors(params: pd.DataFrame) -> dict:
    """The model's tensors DDP would miss, from their verdicts: `unused` (never a gradient),
    `intermittent` (on some steps, or some ranks, only) and the bytes of the unused ones."""
    model = params[params["in_model"].astype(bool)]
    verdicts = model["verdicts"]
    never = verdicts.map(lambda vs: "unused" in vs)
    sometimes = verdicts.map(lambda vs: "intermittent" in vs or "rank_dependent_use" in vs) \
        & ~never
    return {"unused": list(model.loc[never, "name"]),
            "intermittent": list(model.loc[sometimes, "name"]),
            "unused_bytes": int(model.loc[never, "bytes"].sum())}


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Worst first, then the biggest."""
    return sorted(findings, key=lambda f: (-severity.rank(f.severity), -f.bytes, f.code,
                                           f.module))


def _explain_generic(v):
    """For a verdict registered without an explanation: its meaning, and where to read more."""
    def explain(label, group, steps):
        return f"{subject(label, group)}: {v.meaning}", "See the README's verdict table."
    return explain


def _ancestors(module: str) -> list[str]:
    parts = module.split(".") if module else []
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


MAX_GROUPS = 6  # past this many groups for one verdict, coarsen to broader subtrees


def subtrees(params: pd.DataFrame, flagged: np.ndarray) -> list[tuple[str, list[int], bool]]:
    """Group flagged rows under the highest module whose whole subtree is flagged.

    Returns (label, rows, whole). Sibling groups, the same module or tensor repeated in each
    layer (`layers.0.q_proj.lora_A`, `layers.1.v_proj.lora_A`), are one group labelled by
    their pattern (`layers.*.*.lora_A`, see `_siblings`). Scattered hits (every bias, say)
    would still give one group per module; beyond MAX_GROUPS they are gathered under their
    broadest common subtrees instead. A group that is no module's whole subtree is marked
    partial (whole=False): its fix lists its tensors.
    """
    total, hit = Counter(), Counter()
    for module, in_model, is_hit in zip(params["module"], params["in_model"], flagged):
        if in_model:
            for anc in _ancestors(module):
                total[anc] += 1
                hit[anc] += int(is_hit)
    keys: dict[int, str] = {}
    # Columns read once, not a row Series per tensor: a 70B model flags a thousand tensors.
    # memberships only for a tensor outside the model (a comparison's tables have none).
    modules, names, in_model = (params[c].tolist() for c in ("module", "name", "in_model"))
    for i in np.flatnonzero(flagged).tolist():
        if not in_model[i]:
            keys[i] = _outside_key(names[i], params["memberships"].iat[i])
            continue
        whole = next((a for a in _ancestors(modules[i]) if hit[a] == total[a]), None)
        keys[i] = whole if whole is not None else names[i]
    keys = _siblings(keys, in_model)
    if len(set(keys.values())) > MAX_GROUPS:
        keys = _coarsen(keys, params)
    groups: dict[str, list[int]] = {}
    for i, key in keys.items():
        groups.setdefault(key, []).append(i)
    return [(key, rows, len(rows) == 1 or (key in total and hit[key] == total[key]))
            for key, rows in groups.items()]


def _siblings(keys: dict[int, str], in_model: list) -> dict[int, str]:
    """Merge the model's groups whose labels have as many parts and the same last one (the
    same module, or tensor, in each layer: `layers.0.self_attn.q_proj.lora_A` and
    `layers.1.self_attn.v_proj.lora_A`) into one, labelled by their pattern, `*` where they
    differ (`layers.*.self_attn.*.lora_A`): one finding for one cause repeated, not one per
    layer. The merged group is the tensors of every module the pattern matches that are
    flagged, so it is reported as partial."""
    alike: dict[tuple[int, str], set[str]] = {}
    for i, key in keys.items():
        if in_model[i] and key:
            parts = key.split(".")
            alike.setdefault((len(parts), parts[-1]), set()).add(key)
    pattern = {}
    for labels in alike.values():
        if len(labels) > 1:
            columns = zip(*(label.split(".") for label in sorted(labels)))
            merged = ".".join(c[0] if len(set(c)) == 1 else "*" for c in columns)
            pattern.update((label, merged) for label in labels)
    return {i: pattern.get(key, key) if in_model[i] else key for i, key in keys.items()}


def _outside_key(name: str, pairs) -> str:
    """A tensor outside the model is reported with the others of its optimizer group (an
    optimizer built before `fully_shard` or a wrapper replaced the model's tensors holds all
    of the old ones: one finding, not one per tensor). An unregistered tensor goes with the
    others of its plain attribute (`cells[0].weight` and `cells[1].bias` under `cells`), and
    so does one an optimizer holds that is reachable from such an attribute (layers kept in a
    plain list, each with its own optimizer: one finding about `layers`)."""
    if not name.startswith("<"):  # named by the attribute that holds it: that names it best
        return name.partition("[")[0]
    former = parse_former(name)
    if former:  # a tensor a whole run saw replaced: its module as it was, and when
        return f"<{former[0].rpartition('.')[0] or former[0]}, {former[1]}>"
    if pairs:
        return f"<optimizer {pairs[0][0]} group {pairs[0][1]}>"
    return name


def _coarsen(keys: dict[int, str], params: pd.DataFrame) -> dict[int, str]:
    """The deepest module level at which the groups number at most MAX_GROUPS."""
    in_model = params["in_model"].to_numpy()
    depth = max(len(k.split(".")) for k in keys.values())
    for d in range(depth, 0, -1):
        trial = {i: (".".join(k.split(".")[:d]) if in_model[i] else k) for i, k in keys.items()}
        if len(set(trial.values())) <= MAX_GROUPS:
            return trial
    return {i: ("" if in_model[i] else k) for i, k in keys.items()}
