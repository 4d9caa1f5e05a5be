"""What loading a checkpoint means for the run: findings about what did not load, and the
bytes the file spends on tensors the diagnosis found dead."""

from __future__ import annotations

import pandas as pd

from ..core.format import human_bytes
from ..core.result import Finding, LoadReport


def load_findings(report: LoadReport) -> list[Finding]:
    """The load report as findings: what did not load is worth a look before trusting a run."""
    found = []
    if report.mismatched:
        names = tuple(m["name"] for m in report.mismatched)
        found.append(Finding(
            "checkpoint_shape_mismatch", "error", names,
            f"{len(names)} tensor(s) in {report.path} have another shape than the model's and "
            f"were not loaded (e.g. `{names[0]}`: file {report.mismatched[0]['file']}, model "
            f"{report.mismatched[0]['model']}).",
            "Build the model with the configuration the checkpoint was saved with.",
            module="", count=len(names), bytes=0))
    if report.missing:
        # Whole modules absent from the file are new parts (a finetune head): expected.
        loaded_tops = {n.split(".")[0] for n in report.matched} | {
            m["name"].split(".")[0] for m in report.mismatched}
        partial = [n for n in report.missing if n.split(".")[0] in loaded_tops]
        found.append(Finding(
            "checkpoint_missing", "warning" if partial else "info", tuple(report.missing),
            f"{len(report.missing)} tensor(s) of the model are not in {report.path} and keep "
            f"their fresh initialisation (e.g. `{(partial or report.missing)[0]}`)"
            + ("; they sit in modules the file otherwise covers." if partial
               else ", all in modules the file does not cover: new parts, as in a finetune."),
            "Expected for a new head; otherwise check the layout or the `module.` prefix.",
            module="", count=len(report.missing), bytes=0))
    if report.unexpected:
        size = sum(report.file_bytes.get(n, 0) for n in report.unexpected)
        found.append(Finding(
            "checkpoint_unexpected", "info", tuple(report.unexpected),
            f"{len(report.unexpected)} tensor(s) in {report.path} have no place in the model "
            f"({human_bytes(size)}; e.g. `{report.unexpected[0]}`).",
            "Drop them from the checkpoint if they are stale.",
            module="", count=len(report.unexpected), bytes=size))
    opt = report.optimizer
    if opt is not None and not opt["loaded"]:
        found.append(Finding(
            "checkpoint_optimizer_mismatch", "warning", (),
            f"the optimizer state in {report.path} does not fit the current optimizer: "
            f"{opt['why']}.",
            "Build the optimizer's param groups the way they were when the checkpoint was saved.",
            module="", count=0, bytes=0))
    return found


def audit(params: pd.DataFrame, report: LoadReport) -> dict:
    """Bytes the checkpoint spends on tensors the diagnosis found dead: unused (never get a
    gradient), orphan (never trained) or frozen (requires_grad False)."""
    file_bytes = report.file_bytes
    rows = {}
    for name, verdicts, rg in zip(params["name"], params["verdicts"], params["requires_grad"]):
        kind = ("orphan" if "orphan" in verdicts else "unused" if "unused" in verdicts
                else "frozen" if not rg else None)
        if kind and name in file_bytes:
            rows.setdefault(kind, []).append(name)
    total = sum(file_bytes.values())
    out = {"checkpoint_bytes": total, "by_kind": {}}
    for kind, names in rows.items():
        size = sum(file_bytes[n] for n in names)
        out["by_kind"][kind] = {"tensors": len(names), "bytes": size,
                                "share": size / total if total else 0.0, "names": names}
    return out


def audit_finding(result: dict, path: str) -> Finding | None:
    dead = {k: v for k, v in result["by_kind"].items() if k in ("unused", "orphan")}
    if not dead:
        return None
    size = sum(v["bytes"] for v in dead.values())
    names = tuple(n for v in dead.values() for n in v["names"])
    share = size / result["checkpoint_bytes"] if result["checkpoint_bytes"] else 0.0
    detail = ", ".join(f"{v['tensors']} {k} ({human_bytes(v['bytes'])})" for k, v in dead.items())
    return Finding(
        "dead_weight_in_checkpoint", "info", names,
        f"{human_bytes(size)} of {path} ({share:.0%}) belong to tensors this run never trains: "
        f"{detail}. Every checkpoint saved from this model carries them.",
        "Drop or freeze those tensors before training (see the unused/orphan findings); "
        "saved checkpoints then shrink by that much.",
        module="", count=len(names), bytes=size)
