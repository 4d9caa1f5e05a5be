"""TensorBoard (`report_to="tensorboard"`; docs/integrations.md, "Trackers").

TensorBoard has no open run to find: diagkit writes with a `SummaryWriter`, either the one it is
given (a user's, or a framework's, written into and flushed, never closed) or its own, opened
in a log dir and closed at the end: the framework's (`context.objects["tensorboard_dir"]`: HF's
`args.logging_dir`, Lightning's `logger.log_dir`), else `runs/diagkit` beside the watch's `out`
folder (in the working directory without one): where torch's own `SummaryWriter()` writes
(`runs/<time>_<host>`), so `tensorboard --logdir runs` shows both. Never inside `out`: a save
replaces that folder whole, and refuses one holding files it did not write.
So `active()` is False: "all" never starts writing event files because tensorboard is installed.

What lands: the series `diagkit/errors` and `diagkit/warnings` (scalars, one point per observed
step); at the end the counts at the last step and the text `diagkit/status`; the findings table
as Markdown text `diagkit/findings`; each alert as text `diagkit/alerts` (TensorBoard has no
alerts); the saved diagnosis's folder as text `diagkit/artifacts` (TensorBoard keeps no files).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ...present import tracked
from .sink import Sink

# The writer classes a framework may hand over: torch's, or tensorboardX's (what HF and Lightning
# fall back to without tensorboard); asked only when already imported.
_WRITER_MODULES = ("torch.utils.tensorboard", "tensorboardX")


def owns(obj) -> bool:
    """Whether `obj` is a TensorBoard `SummaryWriter` (torch's or tensorboardX's)."""
    for name in _WRITER_MODULES:
        module = sys.modules.get(name)
        writer = getattr(module, "SummaryWriter", None)
        if writer is not None and isinstance(obj, writer):
            return True
    return False


def active() -> bool:
    """Never: TensorBoard has no run that is open, only writers diagkit is given or opens
    (so "all" leaves it out; name it, or pass a `SummaryWriter`)."""
    return False


def open(context, given=None) -> "TensorBoardSink":
    """A sink writing into `given` (a `SummaryWriter`), or into a writer of its own in the
    framework's log dir or `runs/diagkit` (`own_dir`)."""
    if given is not None:
        return TensorBoardSink(given, own=False)
    from torch.utils.tensorboard import SummaryWriter  # only here: tensorboard is optional
    return TensorBoardSink(SummaryWriter(log_dir=str(own_dir(context))), own=True)


def own_dir(context) -> Path:
    """The framework's log dir, else `runs/diagkit` beside `out` (else in the working
    directory)."""
    given = context.objects.get("tensorboard_dir")
    if given is not None:
        return Path(given)
    base = Path(context.out).parent if context.out is not None else Path(".")
    return base / "runs" / "diagkit"


class TensorBoardSink(Sink):
    """Scalars and text in one writer; texts are written at the last step seen, so they sit
    beside the series they sum up."""

    name = "tensorboard"

    def __init__(self, writer, own: bool):
        self.writer, self.own = writer, own
        self.last_step = 0

    def scalars(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.last_step = max(self.last_step, step)

    def summary(self, values: dict) -> None:
        for key, value in values.items():
            if key == tracked.STATUS:
                self.writer.add_text(key, str(value), self.last_step)
            else:
                self.writer.add_scalar(key, value, self.last_step)

    def table(self, rows: list[list]) -> None:
        self.writer.add_text(tracked.TABLE_KEY, tracked.findings_markdown(rows), self.last_step)

    def alert(self, title: str, text: str, level: str, step: int | None = None) -> None:
        self.writer.add_text("diagkit/alerts", f"**{title}** ({level}): {text}",
                             self.last_step if step is None else step)

    def artifacts(self, folder: Path) -> None:
        self.writer.add_text("diagkit/artifacts", f"saved diagnosis: {folder}", self.last_step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        """Close the writer diagkit opened; a given one stays open (flushed)."""
        if self.own:
            self.writer.close()
        else:
            self.writer.flush()
