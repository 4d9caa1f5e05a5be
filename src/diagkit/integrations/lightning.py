"""`diagkit.watch` on a Lightning `Trainer.fit`, as one callback (pip install diagkit[lightning]).

    import lightning.pytorch as L
    from diagkit.integrations.lightning import DiagkitCallback
    trainer = L.Trainer(max_steps=100, callbacks=[DiagkitCallback(steps=20, out="diag/")])
    trainer.fit(module, loader)     # diag/ holds the diagnosis; diagkit.load("diag/")

Lightning ships twice, as `lightning` (`lightning.pytorch`) and as `pytorch_lightning`, each with
its own `Callback` class, and a callback should subclass the one of the package its Trainer
comes from. So there are two classes, each in a module named like the package: this one
subclasses `lightning.pytorch.Callback` (`pytorch_lightning.Callback` when only that is
installed); `diagkit.integrations.pytorch_lightning.DiagkitCallback` subclasses
`pytorch_lightning.Callback`. Each imports only its own package; a callback handed to the other
package's Trainer still works (Lightning duck-types callbacks) and warns. How it attaches:
`diagkit.integrations._lightning`.
"""

from __future__ import annotations

import importlib.util

from ._lightning import callback_class

if importlib.util.find_spec("lightning") is None \
        and importlib.util.find_spec("pytorch_lightning") is not None:
    DiagkitCallback = callback_class("pytorch_lightning", __name__, "pytorch-lightning")
else:
    DiagkitCallback = callback_class("lightning.pytorch", __name__, "diagkit[lightning]")
