"""What `diagkit check` prints and writes (`--json`, `--save`), with or without `--try-fix`,
and the one line for an output that could not be written in mid-run."""

from __future__ import annotations

from ..core.errors import DiagkitError
from ..core.format import one_line


def check_outputs(args, diag) -> dict[str, str]:
    """What `check` prints and writes, for a whole run or one its timeout ended. Each output
    is written on its own: one that fails in mid-run (its folder removed or replaced, a full
    disk) is returned, `{"--save DIR": why}`, and the others are still written, since
    docs/cli.md, "Command line", promises `--json` the run as it is."""
    from ..core.files import write_json_atomic
    from ..present.text import render_findings
    print(render_findings(diag))
    unwritten = {}
    for option, write in (("json", lambda path: write_json_atomic(path, diag.to_json_dict())),
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
