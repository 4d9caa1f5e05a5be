"""What `pip install diagkit` pulls (README, "Install"; issue: an install that fits a training
image): at most 25 packages beside torch's own, and nothing of the notebook side.

Offline and deterministic: the closure of pyproject.toml's requirements is walked through the
installed packages' own metadata (`Requires-Dist`, markers evaluated for this Python and each
extra asked for), so it counts what pip would install here, without a resolver or the network.
`benchmarks/install_size.py` measures the same with pip's resolver against the index.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
CORE_LIMIT = 25  # packages beside torch's own, diagkit itself included
# The notebook side: none of these may be reached from the core.
NOTEBOOK_SIDE = {"matplotlib", "ipywidgets", "papermill", "nbconvert", "nbformat", "ipykernel",
                 "jupyterlab", "jupyter-server", "jupyter-client", "ipython", "notebook",
                 "terminado"}
TRACKERS = {"wandb", "tensorboard", "mlflow-skinny", "trackio"}


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def requires(name: str, extra: str) -> list[str]:
    """The requirements of `name` (with `extra`, or "" for the base) that apply here: diagkit's
    from pyproject.toml (this tree, not an older install), the others' from their metadata."""
    if name == "diagkit":
        p = project()
        return list(p["dependencies"] if not extra else p["optional-dependencies"][extra])
    lines = metadata.distribution(name).requires or []
    env = {"extra": extra}
    return [line for line in lines if (r := Requirement(line)).marker is None
            or r.marker.evaluate(env)]


def closure(requirements) -> set[str]:
    """Every distribution that `requirements` pull, through each one's own requirements."""
    seen: set[tuple[str, str]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonical(req.name)
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for line in requires(name, extra):
                r = Requirement(line)
                r.marker = None  # evaluated by `requires`, for the extra it belongs to
                todo.append(r)
    return {name for name, _ in seen}


def test_the_core_pulls_at_most_25_packages_beside_torch_and_no_notebook():
    core = closure(project()["dependencies"]) | {"diagkit"}
    torch_own = closure(["torch"])
    added = sorted(core - torch_own)
    assert "torch" in core and len(added) <= CORE_LIMIT, added
    assert not core & (NOTEBOOK_SIDE | TRACKERS), sorted(core & (NOTEBOOK_SIDE | TRACKERS))


def test_the_extras_hold_the_notebook_side_and_dev_holds_them_all():
    """`make test` and `make demo` install `[dev]`: it still sets up everything."""
    workbook = closure(["diagkit[workbook]"])
    assert {"matplotlib", "ipywidgets", "papermill", "nbconvert", "jupyterlab"} <= workbook
    assert TRACKERS <= closure(["diagkit[trackers]"])
    dev = closure(["diagkit[dev]"])
    assert (workbook | TRACKERS | {"transformers", "lightning", "peft", "deepspeed",
                                   "pytest"}) <= dev
