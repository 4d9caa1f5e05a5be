"""What `pip install diagkit` pulls (README, "Install"; issue: an install that fits a training
image): at most 25 packages beside torch's own, and nothing of the notebook side.

Offline and deterministic: the closure of pyproject.toml's requirements is walked through the
installed packages' own metadata (`Requires-Dist`, markers evaluated for this Python and each
extra asked for), so it counts what pip would install here, without a resolver or the network.
`benchmarks/install_size.py` measures the same with pip's resolver against the index.
"""

from __future__ import annotations

from requirements_closure import closure, project

CORE_LIMIT = 25  # packages beside torch's own, diagkit itself included
# The notebook side: none of these may be reached from the core.
NOTEBOOK_SIDE = {"matplotlib", "ipywidgets", "papermill", "nbconvert", "nbformat", "ipykernel",
                 "jupyterlab", "jupyter-server", "jupyter-client", "ipython", "notebook",
                 "terminado"}
TRACKERS = {"wandb", "tensorboard", "mlflow-skinny", "trackio"}


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
