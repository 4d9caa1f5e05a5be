"""A target's spec, 'package.module:function' or 'path/to/file.py:function', checked without
importing torch or the target: a typo on the command line is one line at once, not after the
seconds that importing torch takes (docs/cli.md, "Command line")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ...core.errors import TargetError


def split_spec(spec) -> tuple[str, str]:
    """(module or file, function name), or a TargetError naming the expected form."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise TargetError(f"target {spec!r} is not of the form 'package.module:function' "
                          "or 'path/to/file.py:function'")
    where, name = spec.split(":")
    return where, name


def no_module(dotted: str) -> TargetError:
    """The one sentence for a target module that is not there (here and at the import)."""
    return TargetError(f"no module named {dotted!r} (is it installed, or on PYTHONPATH?)")


def no_file(path: str) -> TargetError:
    """The one sentence for a target file that is not there (here and at the import)."""
    return TargetError(f"no such file: {path}")


def check_findable(spec) -> None:
    """The spec's form, its file, and its top-level package, as importing it would find them
    (`find_spec` of a top-level name imports nothing). The import itself still decides."""
    where, _ = split_spec(spec)
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise no_file(where)
        return
    top = where.split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return  # let the import say what is wrong
    if found is None:
        raise no_module(where)
