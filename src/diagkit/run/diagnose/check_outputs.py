"""What `diagkit check` prints and writes (`--json`, `--save`), with or without `--try-fix`,
and the one line for an output that could not be written in mid-run."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from ...core.errors import DiagkitError
from ...core.format import one_line

# Where `--json -` writes: standard output as it was before the run moved it aside
# (`stdout_for_json`); None while it is not moved.
_MOVED = {"fd": None}


def check_outputs(args, diag) -> dict[str, str]:
    """What `check` prints and writes, for a whole run or one its timeout ended. Each output
    is written on its own: one that fails in mid-run (its folder removed or replaced, a full
    disk) is returned, `{"--save DIR": why}`, and the others are still written, since
    docs/cli.md, "Command line", promises `--json` the run as it is."""
    from ...present.text import render_findings
    print(render_findings(diag), file=sys.stderr if json_on_stdout(args) else sys.stdout,
          flush=True)
    unwritten = {}
    for option, write in (("json", lambda path: _write_json(path, diag.to_json_dict())),
                          ("save", diag.save)):
        path = getattr(args, option, None)
        if path:
            try:
                write(path)
            except (OSError, DiagkitError) as exc:
                unwritten[f"--{option} {path}"] = _why(exc)
    return unwritten


def unwritten_line(args, unwritten: dict[str, str]) -> str:
    """One line: which outputs could not be written and why, and what was kept."""
    kept = ["the findings above"] + [f"--{o} {getattr(args, o)}" for o in ("json", "save")
                                     if getattr(args, o, None)
                                     and f"--{o} {getattr(args, o)}" not in unwritten]
    failed = "; ".join(f"cannot write {what}: {why}" for what, why in unwritten.items())
    return f"{failed} (written: {', '.join(kept)})"


def _why(exc: BaseException) -> str:
    """An OSError as its reason and the path it concerns; diagkit's own line as it is."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return one_line(exc)


def json_on_stdout(args) -> bool:
    """Whether `--json` is standard output (`-`, `/dev/stdout`): then it holds the JSON alone."""
    from ...core.paths import file_target
    path = getattr(args, "json", None)
    if not path:
        return False
    try:
        return file_target(Path(path), f"--json {path}") == ("stream", 1)
    except DiagkitError:
        return False


@contextlib.contextmanager
def stdout_for_json(args):
    """With `--json -`, standard output carries one JSON object and nothing else (docs/cli.md,
    "Command line"): while the target runs, what would reach it (the target's prints, the
    ranks' output, a library's C code) goes to standard error instead."""
    if not json_on_stdout(args):
        yield
        return
    sys.stdout.flush()
    _MOVED["fd"] = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(_MOVED["fd"], 1)
        os.close(_MOVED["fd"])
        _MOVED["fd"] = None


def _write_json(path, payload) -> None:
    """`--json`'s file; standard output as it was before the run, where `stdout_for_json`
    moved it aside (a run its timeout ended is written from inside it)."""
    from ...core.files import json_text, write_json_atomic
    if _MOVED["fd"] is None:
        write_json_atomic(path, payload)
        return
    with os.fdopen(os.dup(_MOVED["fd"]), "w", encoding="utf-8") as out:
        out.write(json_text(payload) + "\n")
