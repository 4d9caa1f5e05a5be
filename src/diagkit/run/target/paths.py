"""What a relative path a user typed means: one rule for the CLI, both notebooks and reports.

A relative input path (a checkpoint, a saved diagnosis) is looked up, in order:

1. from the folder the user launched from: the CLI's working folder; in a notebook kernel
   (which Jupyter starts in its notebook's folder), the working folder of the process that
   started the kernel: `jupyter lab`, papermill, `diagkit report` (which also passes it in
   $DIAGKIT_LAUNCH_DIR). papermill's `cwd` / `--cwd` moves papermill itself there, so that
   folder is then the launch folder. Where /proc cannot say (not Linux), the shell's $PWD,
   which a kernel inherits unchanged;
2. from the working folder (in JupyterLab: the notebook's own folder);
3. for `data/NAME`, the demo file NAME that diagkit ships (in a clone the repository's
   `data/`, in a wheel the package's copy: `diagkit.core.shipped`).

The first that exists wins; none is a one-line error naming where it looked. A relative output
folder is relative to the launch folder. docs/workbook.md, "Paths".

A path the system cannot look up at all (a symbolic link loop, a name longer than the file
system takes) is one line naming it and why, before anything reads it (`check_lookup`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ...core.errors import DiagkitError
from ...core.paths import lookup
from ...core.shipped import shipped

LAUNCH_ENV = "DIAGKIT_LAUNCH_DIR"


def launch_folder() -> Path:
    """Where the user launched from (see the module docstring), as an absolute folder."""
    candidates = [os.environ.get(LAUNCH_ENV)]
    if _in_kernel():
        parent = _parent_cwd()
        candidates.append(parent if parent is not None else os.environ.get("PWD"))
    for candidate in candidates:
        if candidate and os.path.isabs(candidate) and os.path.isdir(candidate):
            return Path(candidate)
    return Path.cwd()


def _in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (started elsewhere, in its notebook's folder)."""
    app = sys.modules.get("ipykernel.kernelapp")
    return bool(app is not None and app.IPKernelApp.initialized())


def _parent_cwd() -> str | None:
    """The working folder of the process that started this one (Linux), else None."""
    try:
        return os.readlink(f"/proc/{os.getppid()}/cwd")
    except OSError:
        return None


def places(path: str) -> list[Path]:
    """Where a relative input `path` is looked for, in order (duplicates dropped)."""
    given = Path(path)
    if given.is_absolute():
        return [given]
    out = [launch_folder() / given, Path.cwd() / given]
    if given.parts and given.parts[0] == "data" and len(given.parts) > 1:
        out.append(shipped("data").joinpath(*given.parts[1:]))
    unique: list[Path] = []
    for p in out:
        if all(os.path.abspath(p) != os.path.abspath(q) for q in unique):
            unique.append(p)
    return unique


def find_input(path: str, what: str) -> str:
    """The absolute path that relative `path` means; "" stays "" (no input). `what` names
    the input in the error ("checkpoint", "saved diagnosis")."""
    if not path:
        return path
    candidates = places(path)
    for candidate in candidates:
        if candidate.exists():
            return str(candidate.absolute())
    where = ", ".join(str(c.parent) for c in candidates)
    raise DiagkitError(f"{what} {path} not found (looked in {where})")


def output_folder(path: str) -> str:
    """A relative output folder, made absolute from the launch folder; "" stays ""."""
    if not path or Path(path).is_absolute():
        return path
    return str(launch_folder() / path)


def resolve_paths(settings: dict, inputs: dict[str, str]) -> dict:
    """Relative paths as this module defines them, so a notebook opened in JupyterLab
    (its kernel in `notebooks/`) reads `data/x.pt` as the CLI does: each input of `inputs`
    (name -> what it is, for the error) must exist; `out_dir` is from the launch folder."""
    for name, what in inputs.items():
        if settings.get(name):
            settings[name] = find_input(settings[name], what)
    if settings.get("out_dir"):
        settings["out_dir"] = output_folder(settings["out_dir"])
    return settings


def check_lookup(path, label: str) -> None:
    """One line naming `path` (given as `label`: "--from", "target file") and the system's
    reason, when the system cannot look it up: a symbolic link loop, a name too long, a folder
    this process may not search. pathlib cannot say it: `exists()` is False for a loop (so a
    loop was "does not exist") and raises OSError for a name too long (an "internal error").
    A path with nothing there is left to the reader, whose one line says what was expected."""
    lookup(Path(path), f"{label} {path}")
