"""diagkit: find mis-wired parameters in PyTorch training.

    diag = diagkit.diagnose(model, optimizer, batch_fn=..., loss_fn=..., steps=5)
    diag.params, diag.steps, diag.findings, diag.advice

Importing diagkit has no side effects.
"""

from .api import diagnose
from .diagnosis import Diagnosis, load
from .errors import DiagkitError
from .findings import Finding
from .target import Setup, load_target
from .verdicts import VERDICTS

__version__ = "0.1.0"

__all__ = ["diagnose", "load_target", "Setup", "Diagnosis", "Finding", "load", "VERDICTS",
           "DiagkitError", "__version__"]
