"""diagkit: find mis-wired parameters in PyTorch training.

    w = diagkit.watch(model, optimizer, steps=20)   # inside the user's own training loop
    diag = diagkit.diagnose(model, optimizer, batch_fn=..., loss_fn=..., steps=5)
    diag.params, diag.steps, diag.findings, diag.advice

The package is layered (see the README's "Development" section): `core` (result types, schema,
severity, options), `measure` (the only hooks), `judge` (verdicts, findings, advice),
`present` (text, HTML, figures, explorer) and `run` (targets, the loop, the pipeline, CLI,
notebooks, reports). Importing diagkit has no side effects.
"""

from .core.errors import DiagkitError
from .core.result import Diagnosis, Finding, load
from .core.version import VERSION as __version__
from .judge.verdicts import VERDICTS
from .run.api import diagnose
from .run.target import Setup, load_target
from .run.watch import watch

__all__ = ["watch", "diagnose", "load_target", "Setup", "Diagnosis", "Finding", "load", "VERDICTS",
           "DiagkitError", "__version__"]
