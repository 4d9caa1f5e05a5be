"""What a comparison of two checkpoints means: unchanged tensors, ones only in one file,
another shape or dtype; grouped per module subtree as a diagnosis groups its verdicts."""

from __future__ import annotations

import pandas as pd

from ..core.format import fmt_shape, human_bytes
from ..core.result import Finding
from .findings import sort_findings, subtrees
from .wording import subject


# Leaf names of the tensors ordinary layers own; anything else was added by hand (memory or
# prompt tokens, LoRA factors, a class token), which is often exactly what was meant to train.
_LAYER_LEAVES = {"weight", "bias", "running_mean", "running_var", "num_batches_tracked",
                "in_proj_weight", "in_proj_bias", "weight_g", "weight_v", "weight_orig"}


def _groups(table: pd.DataFrame, universe: pd.Series, flagged: pd.Series):
    """(label, rows) per module subtree, as a diagnosis groups a verdict (findings.subtrees);
    `universe` is the set of tensors a subtree must be whole within."""
    frame = table[universe].reset_index(drop=True).assign(in_model=True)
    hits = flagged[universe].to_numpy(dtype=bool)
    if not hits.any():
        return
    for label, rows, whole in subtrees(frame, hits):
        group = frame.iloc[rows].copy()
        group.attrs["whole"] = whole
        yield label, group


def _names(names, most: int = 4) -> str:
    names = list(names)
    shown = ", ".join(f"`{n}`" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def comparison_findings(table: pd.DataFrame, s: dict, same_file: bool) -> list[Finding]:
    """The findings of a comparison (`table`: one row per tensor name, `s`: its summary), worst
    first. Each kind has its own helper; they are gathered here so the sort sees them all."""
    status = table["status"]
    both = table["in_a"] & table["in_b"]
    comparable = status.isin(["changed", "unchanged"])
    findings = _unchanged(table, s, same_file, comparable)
    findings += _one_side(table, s)
    findings += _shape_mismatch(table, both)
    findings += _dtype_mismatch(table, both, comparable)
    return sort_findings(findings)


def _finding(code: str, severity: str, label: str, group: pd.DataFrame, message: str,
             fix: str) -> Finding:
    """A finding about the tensors of one subtree, with their count and total size."""
    return Finding(code, severity, tuple(group["name"]), message, fix, module=label,
                   count=len(group), bytes=int(group["bytes"].sum()))


def _unchanged(table: pd.DataFrame, s: dict, same_file: bool,
               comparable: pd.Series) -> list[Finding]:
    """Bitwise identical tensors: one `nothing_changed` when nothing changed at all (then the
    saves, not the tensors, are the problem), else an `unchanged` warning per subtree."""
    status = table["status"]
    if s["unchanged"] and not s["changed"]:
        group = table[status == "unchanged"]
        message = (f"all {len(group)} tensors present in both checkpoints with the same shape "
                   f"({human_bytes(int(group['bytes'].sum()))}) are bitwise identical: nothing "
                   "changed between these saves"
                   + (" (A and B are the same file)." if same_file else "."))
        fix = ("If training ran between the two saves, check that optimizer.step() is reached "
               "and that the second save happens after it, from the live model (not a copy "
               "taken earlier).")
        return [Finding("nothing_changed", "info", (), message, fix, module="",
                        count=len(group), bytes=int(group["bytes"].sum()))]
    if not s["unchanged"]:
        return []
    return [_finding("unchanged", "warning", label, group, _unchanged_message(label, group, s),
                     _unchanged_fix(label, group))
            for label, group in _groups(table, comparable, status == "unchanged")]


def _unchanged_message(label: str, group: pd.DataFrame, s: dict) -> str:
    """What an unchanged subtree means, naming the hand-added tensors in it: those are the
    ones most often meant to train, so they must not hide in a count."""
    extras = [n for n in group["name"] if n.rsplit(".", 1)[-1] not in _LAYER_LEAVES]
    message = (f"{subject(label, group)} is bitwise identical in both checkpoints, while "
               f"{s['changed']} other tensor{'s' if s['changed'] != 1 else ''} changed: "
               "nothing trained it between these saves.")
    if extras:
        message += (f" Not a layer's weight or bias (added by hand, often meant to "
                    f"train): {_names(extras)}.")
    return message


def _unchanged_fix(label: str, group: pd.DataFrame) -> str:
    """How to make an unchanged subtree train; a DDP-prefixed name points at a name filter."""
    fix = ("Frozen on purpose (a pretrained backbone, buffers)? Then nothing to do. If "
           "it should learn: it must require grad and be held by an optimizer, by "
           "identity — `diagkit check TARGET` reports it as orphan or stalled.")
    if label.startswith("module.") or group["name"].iloc[0].startswith("module."):
        fix += (" Its name carries the DDP prefix `module.`: a parameter filter on names "
                "(e.g. `not n.startswith(\"module.…\")`) is a common cause.")
    return fix


def _one_side(table: pd.DataFrame, s: dict) -> list[Finding]:
    """Tensors in one file only, per subtree: `only_in_a` (removed or renamed), then
    `only_in_b` (added or renamed)."""
    status = table["status"]
    findings = []
    for code, side, other, verb in (("only_in_a", "A", "B", "removed or renamed"),
                                    ("only_in_b", "B", "A", "added or renamed")):
        universe = table[f"in_{side.lower()}"]
        for label, group in _groups(table, universe, status == code):
            message = (f"{subject(label, group)} is only in {side} (`{s[f'path_{side.lower()}']}`),"
                       f" not in {other}: {verb} between the saves.")
            fix = ("If it was renamed, map the old names to the new ones before "
                   "load_state_dict; if the change is intended, load with strict=False and "
                   f"check the {'unexpected' if side == 'A' else 'missing'} keys it reports.")
            findings.append(_finding(code, "info", label, group, message, fix))
    return findings


def _shape_mismatch(table: pd.DataFrame, both: pd.Series) -> list[Finding]:
    """Tensors in both files with another shape, per subtree: load_state_dict fails on them."""
    findings = []
    for label, group in _groups(table, both, table["status"] == "shape_mismatch"):
        shapes = "; ".join(f"`{n}` {fmt_shape(a)} in A, {fmt_shape(b)} in B" for n, a, b in
                           group[["name", "shape_a", "shape_b"]].head(3).itertuples(index=False))
        message = (f"{subject(label, group)} has another shape in each checkpoint ({shapes}"
                   f"{'; …' if len(group) > 3 else ''}): the model changed between the saves.")
        fix = ("load_state_dict fails on these names: build the model with the configuration "
               "the checkpoint was saved with, or skip or resize these tensors explicitly.")
        findings.append(_finding("shape_mismatch", "warning", label, group, message, fix))
    return findings


def _dtype_mismatch(table: pd.DataFrame, both: pd.Series,
                    comparable: pd.Series) -> list[Finding]:
    """Comparable tensors stored with another dtype, per subtree: compared by value, since a
    cast alone would make every one of them look changed bitwise."""
    findings = []
    dtype_differs = comparable & (table["dtype_a"] != table["dtype_b"])
    for label, group in _groups(table, both, dtype_differs):
        first = group.iloc[0]
        message = (f"{subject(label, group)} is stored as {first['dtype_a']} in A and "
                   f"{first['dtype_b']} in B: compared by value, not bitwise.")
        fix = "Nothing to do if the cast is intended (e.g. a half-precision export)."
        findings.append(_finding("dtype_mismatch", "info", label, group, message, fix))
    return findings
