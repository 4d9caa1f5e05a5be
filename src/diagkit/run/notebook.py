"""The calls the diagnosis notebook's cells make: check its parameters, run the diagnosis,
write its data files, show a figure, and the explorer. The same `notebooks/diagnose.ipynb` runs
in JupyterLab, headless under papermill, and behind `diagkit report`.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..core.files import write_json_atomic
from . import contract


def check_parameters(namespace: dict) -> dict:
    """The notebook's parameters, checked against its parameters cell (`diagkit.run.contract`)."""
    return contract.check_parameters(namespace, contract.DIAGNOSE)


def validate(values: dict) -> dict:
    """Parameters for a run of the diagnosis notebook, checked and completed with defaults."""
    return contract.validate(values, contract.DIAGNOSE)


def run(settings: dict):
    """Load the target (and checkpoint) and diagnose it: what the notebook's run cell does."""
    from .api import run_target  # torch only when a run starts: `diagkit report` validates first
    return run_target(settings["target"], settings["target_args"], steps=settings["steps"],
                      checkpoint=settings["checkpoint"] or None,
                      trust_checkpoint=settings["trust_checkpoint"], nproc=settings["nproc"],
                      timeout=settings["timeout"], delta=settings["delta"],
                      every=settings["every"])


def show(fig):
    """Display a matplotlib Figure as an embedded PNG (no pyplot, no GUI backend)."""
    from IPython.display import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return Image(data=buf.getvalue(), format="png")


def write_outputs(diag, out_dir: str | None) -> list[str]:
    """The report's data files. The caller (diagkit report) makes the folder atomic."""
    if not out_dir:
        return []
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    params = diag.params.copy()
    for col in ("aliases", "shape", "verdicts"):
        params[col] = params[col].map(lambda t: " ".join(map(str, t)))
    params["memberships"] = params["memberships"].map(
        lambda pairs: " ".join(f"{a}.{b}" for a, b in pairs))
    params.to_csv(folder / "params.csv", index=False)
    diag.steps.to_csv(folder / "steps.csv", index=False)
    write_json_atomic(folder / "findings.json", {
        "findings": [f.to_dict() for f in diag.findings], "advice": diag.advice,
        "failure": None if diag.failure is None else {
            "step": diag.failure.step, "error": diag.failure.error},
        "worst": diag.worst(), "meta": diag.meta})
    return ["params.csv", "steps.csv", "findings.json"]


def explorer(diag, enabled: bool = True):
    """The interactive explorer, or nothing in a rendered report (widgets need a live kernel)."""
    if not enabled:
        return None
    from ..present.explorer import explore
    return explore(diag)
