"""What a tracker needs to know of the run it sends to (`trackers.choose.open_sinks`)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable


def _log(line: str) -> None:
    logging.getLogger("diagkit").warning(line)


@dataclasses.dataclass
class Context:
    """`out`: the watch's folder (TensorBoard writes under it standalone). `step_offset`: the
    tracker's step of diagkit's step `s` is `s + step_offset` (a framework's global step counts
    the steps done: +1). `framework`: "transformers", "lightning" or None. `objects`: what the
    framework hands over (the HF `trainer`, Lightning's `loggers`). `say`: one line for the user
    (the framework's logger, else the "diagkit" logger)."""

    out: Path | None = None
    step_offset: int = 0
    framework: str | None = None
    objects: dict = dataclasses.field(default_factory=dict)
    say: Callable[[str], None] = _log
