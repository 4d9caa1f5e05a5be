"""diagkit: find mis-wired parameters in PyTorch training.

    w = diagkit.watch(model, optimizer, steps=20)   # inside the user's own training loop
    diag = diagkit.diagnose(model, optimizer, batch_fn=..., loss_fn=..., steps=5)
    diag.params, diag.steps, diag.findings, diag.advice
    diagkit.explore(diag)                            # the explorer, in a notebook

The package is layered (see docs/development.md, "Layout"): `core` (result types, schema,
severity, options), `measure` (the only hooks), `judge` (verdicts, findings, advice),
`present` (text, HTML, figures, explorer) and `run` (targets, the loop, the pipeline, CLI,
notebooks, reports). Importing diagkit has no side effects, and is cheap: each public name is
imported when it is first used (PEP 562), so `import diagkit` loads neither pandas nor the
rest of the package (benchmarks/README.md, "Import").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .core.errors import DiagkitError
from .core.version import VERSION as __version__

# name -> (module, attribute): where each public name lives, imported on first use.
_LAZY = {
    "watch": (".run.watch.watch", "watch"),
    "explore": (".run.workbook.explore", "explore"),
    "diagnose": (".run.diagnose.api", "diagnose"),
    "load_target": (".run.target.target", "load_target"),
    "Setup": (".run.target.target", "Setup"),
    "Diagnosis": (".core.result", "Diagnosis"),
    "Finding": (".core.result", "Finding"),
    "load": (".core.result", "load"),
    "VERDICTS": (".judge.verdicts", "VERDICTS"),
}

__all__ = ["watch", "explore", "diagnose", "load_target", "Setup", "Diagnosis", "Finding", "load", "VERDICTS",
           "DiagkitError", "__version__"]

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from .core.result import Diagnosis, Finding, load
    from .judge.verdicts import VERDICTS
    from .run.diagnose.api import diagnose
    from .run.workbook.explore import explore
    from .run.target.target import Setup, load_target
    from .run.watch.watch import watch


def __getattr__(name: str):
    """A public name's first use imports its module and keeps the name here."""
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'diagkit' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
