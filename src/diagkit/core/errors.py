"""Errors a user can act on. The CLI turns each into one line on stderr and exit code 2; in a
notebook (IPython, papermill, the HTML report) each shows as that same one line too."""

from .format import one_line


class DiagkitError(Exception):
    """Bad usage or bad input: the message names what is wrong and what was expected."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback (it asks the exception first): the
        message, not 30 lines through diagkit's own frames that hide it below the fold. Other
        exceptions, a bug in diagkit among them, keep their traceback (docs/workbook.md, "The
        workbook")."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {one_line(self)}"]


class TargetError(DiagkitError):
    """A target spec, its arguments, or what its function returned is not usable."""
