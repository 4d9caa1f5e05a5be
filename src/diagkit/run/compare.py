"""`diagkit compare CKPT_A CKPT_B` and the comparison notebook: measure two checkpoints against
each other (`diagkit.measure.checkpoint_diff`), judge the differences, build a `Comparison`.

A tensor that is bitwise identical in two saves taken some steps apart was not trained between
them: the orphan of the first seed (`mem_tokens`, in no optimizer group) shows up here as plainly
as in a diagnosis, from the checkpoints alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.files import write_json_atomic, write_text_atomic
from ..core.result import Comparison
from ..core.shipped import shipped
from ..judge.comparison import comparison_findings
from ..measure.checkpoint_diff import diff_checkpoints
from . import contract


def compare_checkpoints(path_a, path_b, trust: bool = False) -> Comparison:
    """Compare two checkpoints tensor by tensor (A the earlier save, B the later one).

    Each may be a PyTorch file (a bare state dict or one nested under model, state_dict, ...;
    loaded with weights_only unless `trust`) or a `.safetensors` file. Names that differ only
    by the DDP prefix `module.` are aligned (A's spelling is kept). Bad input raises
    DiagkitError with a one-line reason.
    """
    table, summary = diff_checkpoints(path_a, path_b, trust)
    findings = comparison_findings(table, summary, _same_file(path_a, path_b))
    return Comparison(str(path_a), str(path_b), table, findings, summary)


def _same_file(path_a, path_b) -> bool:
    try:
        return os.path.samefile(path_a, path_b)
    except OSError:  # pragma: no cover
        return False


def write_outputs(cmp: Comparison, out_dir: str | None) -> list[str]:
    """comparison.csv (every tensor) and findings.json (summary + findings), each atomically."""
    if not out_dir:
        return []
    folder = Path(out_dir)
    table = cmp.table.copy()
    for col in ("shape_a", "shape_b"):
        table[col] = table[col].map(lambda s: "" if s is None else " ".join(map(str, s)))
    write_text_atomic(folder / "comparison.csv", table.to_csv(index=False), newline="")
    write_json_atomic(folder / "findings.json", {
        "summary": cmp.summary, "findings": [f.to_dict() for f in cmp.findings],
        "worst": cmp.worst()})
    return ["comparison.csv", "findings.json"]


# ------------------------------------------------------------------ the notebook's contract
def validate(values: dict) -> dict:
    """Check names and types against the comparison notebook's parameters; fill defaults
    (what `diagkit compare --out` checks before it runs the notebook)."""
    return contract.validate(values, contract.COMPARE)


def check_parameters(namespace: dict) -> dict:
    """Called by the notebook right after its parameters: an unknown name papermill injected,
    or a wrong type, is an error. Relative checkpoint paths not found from the working folder
    are looked up in the repository (where the demo checkpoints live)."""
    settings = contract.check_parameters(namespace, contract.COMPARE)
    for name in ("checkpoint_a", "checkpoint_b"):
        settings[name] = _resolve_path(settings[name])
    return settings


def _resolve_path(path: str) -> str:
    """`path` as given if it exists from here (or is absolute); else the shipped demo file of
    that name when there is one (`data/meta_memory_step2.pt`, the notebook's default)."""
    if not path or Path(path).is_absolute() or Path(path).exists():
        return path
    parts = Path(path).parts
    candidate = shipped("data").joinpath(*parts[1:]) if parts[0] == "data" else None
    return str(candidate) if candidate is not None and candidate.is_file() else path


def run(settings: dict) -> Comparison:
    """What the notebook's comparing cell does."""
    return compare_checkpoints(settings["checkpoint_a"], settings["checkpoint_b"],
                               trust=settings["trust_checkpoint"])
