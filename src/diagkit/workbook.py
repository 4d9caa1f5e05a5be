"""The notebook's side of the contract: its parameters, their checks, and the calls its cells make.

The same `notebooks/diagnose.ipynb` runs in JupyterLab, headless under papermill, and behind
`diagkit report`. Its `parameters` cell holds exactly the names of `PARAMETERS` (a test keeps
them in step); papermill only warns about a parameter the notebook does not declare, so
`check_parameters` turns that into an error, naming the known ones.
"""

from __future__ import annotations

import ast
import io
from pathlib import Path

from .errors import DiagkitError

# name -> (accepted types, default, what it means). The notebook's parameters cell mirrors this.
PARAMETERS: dict[str, tuple[tuple[type, ...], object, str]] = {
    "target": ((str,), "diagkit.demos:meta_memory",
               '"package.module:function" or "path/to/file.py:function"'),
    "target_args": ((dict,), {}, "keyword arguments for the target function"),
    "checkpoint": ((str, type(None)), "", "checkpoint to load into the model first (\"\": none)"),
    "trust_checkpoint": ((bool,), False, "allow a checkpoint that needs arbitrary unpickling"),
    "steps": ((int,), 5, "training steps to observe"),
    "delta": ((str,), "exact",
              "change measured \"exact\", \"sampled\" (bounded memory) or \"off\""),
    "every": ((int,), 1, "observe every k-th step only (long runs)"),
    "nproc": ((int,), 1, "processes of a torch.distributed job (1: this process)"),
    "timeout": ((int,), 120, "seconds before a distributed run is ended (nproc > 1)"),
    "out_dir": ((str, type(None)), "", "folder for params.csv, steps.csv, findings.json "
                                       "(\"\": none)"),
    "interactive": ((bool,), True, "show the ipywidgets explorer (False in rendered reports)"),
}

_INJECTED_HEADER = "# Parameters"  # papermill's injected cell starts with this comment


def validate(values: dict, contract: dict | None = None) -> dict:
    """Check names and types against a notebook's contract (default: diagnose.ipynb's);
    return the full set of parameters with defaults filled in."""
    parameters = PARAMETERS if contract is None else contract
    unknown = sorted(set(values) - set(parameters))
    if unknown:
        raise DiagkitError(f"unknown notebook parameter(s) {', '.join(map(repr, unknown))}; "
                           f"known: {', '.join(parameters)}")
    out = {}
    for name, (types, default, _) in parameters.items():
        value = values.get(name, default)
        if isinstance(value, bool) and bool not in types:
            ok = False
        else:
            ok = isinstance(value, types)
        if not ok:
            expected = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise DiagkitError(f"notebook parameter {name!r} must be {expected}, "
                               f"got {type(value).__name__} {value!r}")
        out[name] = value
    for name in ("steps", "every", "nproc", "timeout"):
        if name in out and out[name] < 1:
            raise DiagkitError(f"notebook parameter {name!r} must be >= 1, got {out[name]}")
    if "delta" in out:
        from .delta import MODES
        if out["delta"] not in MODES:
            raise DiagkitError(f"notebook parameter 'delta' must be one of {', '.join(MODES)}, "
                               f"got {out['delta']!r}")
    return out


def check_parameters(namespace: dict, contract: dict | None = None) -> dict:
    """Called by a notebook right after its parameters: reject names papermill injected but
    the notebook does not declare, and wrong types, before any work starts."""
    parameters = PARAMETERS if contract is None else contract
    injected: dict = {}
    for source in namespace.get("In", []) or []:
        if isinstance(source, str) and source.startswith(_INJECTED_HEADER):
            injected.update(_assigned_names(source))
    unknown = sorted(set(injected) - set(parameters))
    if unknown:
        raise DiagkitError(f"unknown notebook parameter(s) {', '.join(map(repr, unknown))}; "
                           f"known: {', '.join(parameters)}")
    return validate({name: namespace[name] for name in parameters if name in namespace},
                    parameters)


def _assigned_names(source: str) -> dict:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {t.id: None for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def run(settings: dict):
    """Load the target (and checkpoint) and diagnose it: what the notebook's run cell does."""
    from .api import run_target
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
    from .diagnosis import write_json_atomic
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
    from .explorer import explore
    return explore(diag)
