"""`DiagkitCallback` for a Trainer of the `pytorch_lightning` package (Lightning under its older
name; its `Callback` is a class of its own). Use and reasons: `diagkit.integrations.lightning`.

    import pytorch_lightning as pl
    from diagkit.integrations.pytorch_lightning import DiagkitCallback
"""

from __future__ import annotations

from ._lightning import callback_class

DiagkitCallback = callback_class("pytorch_lightning", __name__, "pytorch-lightning")
