"""Errors a user can act on. The CLI turns each into one line on stderr and exit code 2."""


class DiagkitError(Exception):
    """Bad usage or bad input: the message names what is wrong and what was expected."""


class TargetError(DiagkitError):
    """A target spec, its arguments, or what its function returned is not usable."""
