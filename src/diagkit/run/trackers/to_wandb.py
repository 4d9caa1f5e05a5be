"""Weights & Biases: diagkit's status, findings and alerts in the W&B run already open
(docs/integrations.md, "Trackers"). diagkit never calls `wandb.init`: it sends to `wandb.run`
(the user's, or the one HF's `WandbCallback` or Lightning's `WandbLogger` opened) or to the run
object given in `report_to`. Offline mode keeps all of it in the run's `run-*.wandb` file, which
`wandb sync` uploads later."""

from __future__ import annotations

import sys
from pathlib import Path

from ...present import tracked
from .sink import Sink

STEP = "diagkit/step"  # diagkit's own step metric: W&B's `_step` must only grow
ARTIFACT = "diagkit-diagnosis"  # one artifact name per project: each run logs a version of it


def owns(obj) -> bool:
    """A W&B run: `wandb.run`, what `wandb.init` returned, Lightning's `WandbLogger.experiment`."""
    wandb = sys.modules.get("wandb")
    return wandb is not None and isinstance(obj, wandb.Run)


def active() -> bool:
    """A W&B run is open in this process (wandb is never imported for the question)."""
    wandb = sys.modules.get("wandb")
    return wandb is not None and getattr(wandb, "run", None) is not None


def open(context, given=None) -> "WandbSink | None":
    """A sink on `given` (a W&B run) or on `wandb.run`; None and one line when no run is open.
    Its `diagkit/*` series are plotted against `diagkit/step`, not W&B's own `_step`."""
    run = given if given is not None else getattr(sys.modules.get("wandb"), "run", None)
    if run is None:
        context.say("diagkit: report_to 'wandb': no W&B run is open (wandb.init() first, or "
                    "let the framework's W&B logger open it); not sending to it")
        return None
    return WandbSink(run)


class WandbSink(Sink):
    """Sends to one W&B run. A finished run raises W&B's `UsageError` on each call: the sender
    says it once and stops sending."""

    name = "wandb"

    def __init__(self, run):
        self.run = run
        # W&B's `_step` must grow monotonically, and HF's WandbCallback keeps its own
        # (`train/global_step`): diagkit logs its series without `step=`, against a step
        # metric of its own (W&B docs, "Customize log axes").
        run.define_metric(STEP)
        run.define_metric("diagkit/*", step_metric=STEP)
        # By name too: W&B takes the first pattern that matches, and HF's WandbCallback and
        # Lightning's WandbLogger declared "*" against their own step before diagkit's "diagkit/*"
        # (a name beats any pattern)
        for key in (tracked.ERRORS, tracked.WARNINGS):
            run.define_metric(key, step_metric=STEP)

    def scalars(self, values: dict[str, float], step: int) -> None:
        """One history row: the counts at `step` (the tracker's step, in `diagkit/step`)."""
        self.run.log({**values, STEP: step})

    def summary(self, values: dict) -> None:
        """The run's summary: `diagkit/errors`, `diagkit/warnings`, `diagkit/status`."""
        self.run.summary.update(values)

    def table(self, rows: list[list]) -> None:
        """A W&B Table under `diagkit/findings` (its media file is in the run's files)."""
        import wandb
        self.run.log({tracked.TABLE_KEY: wandb.Table(columns=list(tracked.TABLE_COLUMNS),
                                                     data=rows)})

    def alert(self, title: str, text: str, level: str, step: int | None = None) -> None:
        """`run.alert` (W&B's email/Slack alert; offline it waits in the run file for `wandb
        sync`). W&B throttles alerts of one title to one a minute: diagkit's title names the
        verdict and the module, so only the same finding again within a minute is held."""
        import wandb
        levels = wandb.AlertLevel
        self.run.alert(title=title[:63], text=text,
                       level=levels.ERROR if level == "error" else levels.WARN)

    def artifacts(self, folder: Path) -> None:
        """The saved diagnosis (with `report/`) as a version of artifact `diagkit-diagnosis`,
        type `diagkit`."""
        import wandb
        artifact = wandb.Artifact(ARTIFACT, type="diagkit",
                                  description="diagkit's saved diagnosis of this run")
        artifact.add_dir(str(folder))
        self.run.log_artifact(artifact)
