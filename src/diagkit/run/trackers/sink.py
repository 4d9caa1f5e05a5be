"""The interface every tracker implements (`to_wandb`, `to_tensorboard`, `to_mlflow`,
`to_trackio`). Any method may raise: the sender catches it, says it in one line and stops sending
to that tracker (`trackers.sender`)."""

from __future__ import annotations

from pathlib import Path


class Sink:
    """One tracker run diagkit sends to. `name`: the `report_to` word ("wandb", ...)."""

    name = "sink"

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Numbers at the tracker's step `step` (the series `diagkit/errors`, ...)."""

    def series(self, points: list[tuple[int, dict[str, float]]]) -> None:
        """Several steps' numbers at once (a window judged): `scalars` for each, unless the
        tracker takes them in one call (MLflow's `log_batch`)."""
        for step, values in points:
            self.scalars(values, step)

    def summary(self, values: dict) -> None:
        """The final status: `diagkit/errors`, `diagkit/warnings` (ints), `diagkit/status` (a
        word), in the tracker's summary idiom (`present.tracked.status`)."""

    def table(self, rows: list[list]) -> None:
        """The findings table (`present.tracked.TABLE_COLUMNS`)."""

    def alert(self, title: str, text: str, level: str, step: int | None = None) -> None:
        """A new finding ("error" or "warning") at the tracker's step `step` (None: not
        known), where the tracker has alerts."""

    def artifacts(self, folder: Path) -> None:
        """The saved diagnosis (and its `report/`, with report=True)."""

    def flush(self) -> None:
        """Make what was sent durable (files written)."""

    def close(self) -> None:
        """Close what the sink itself opened; never the user's run."""
