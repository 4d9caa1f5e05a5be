"""What a target printed while diagkit ran it in a notebook, kept for the end of the report.

A framework's chatter ("Seed set to 0") used to land in the run cell, above the verdict
banner. Here it is collected and shown last, folded (`present.sections.printed_html`). The
streams stand in for sys.stdout / sys.stderr only while the target runs: a logging handler
the target created meanwhile keeps the stand-in, which then writes through to the real stream,
so nothing printed later goes missing.
"""

from __future__ import annotations

import contextlib
import io
import sys


class _StandIn(io.TextIOBase):
    """Collects into `buffer` while `active`, else writes through to `real`."""

    def __init__(self, real, buffer: io.StringIO):
        self.real, self.buffer, self.active = real, buffer, True

    def write(self, text: str) -> int:
        return (self.buffer if self.active else self.real).write(text)

    def flush(self) -> None:
        if not self.active:
            self.real.flush()

    @property
    def encoding(self):
        return getattr(self.real, "encoding", "utf-8")


@contextlib.contextmanager
def collected():
    """Collect Python-level stdout and stderr; yields the buffer (read it after the block)."""
    buffer = io.StringIO()
    out, err = _StandIn(sys.stdout, buffer), _StandIn(sys.stderr, buffer)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield buffer
    finally:
        out.active = err.active = False
