"""`diagkit notebooks DIR`: copy the notebooks diagkit ships into a folder of the user's.

A clone has them in `notebooks/`; an installed wheel carries them inside the package
(`diagkit.core.shipped`), where a user should not edit them. Copying never overwrites: a
notebook of the same name already in DIR may hold the user's edits, so it is an error unless
`force` is given.

Each copy carries the `language_info` this Python's kernel will report: JupyterLab writes the
kernel's into a notebook as it opens it, so a copy without it showed as modified at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ...core.errors import DiagkitError
from ...core.shipped import shipped


def copy_notebooks(dest: str | Path, force: bool = False) -> list[Path]:
    """Copy every shipped notebook into `dest` (created if missing); return the new paths."""
    dest = Path(dest)
    sources = sorted(shipped("notebooks").glob("*.ipynb"))
    if not sources:
        raise DiagkitError(f"no notebooks found in {shipped('notebooks')}: the installation "
                           "is incomplete (reinstall diagkit)")
    if dest.exists() and not dest.is_dir():
        raise DiagkitError(f"{dest} exists and is not a folder")
    clash = [dest / s.name for s in sources if (dest / s.name).exists()]
    if clash and not force:
        raise DiagkitError(f"{', '.join(map(str, clash))} already exist(s): not overwritten "
                           "(--force replaces them)")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        info = kernel_language_info()
        return [_copy(s, dest / s.name, info) for s in sources]
    except OSError as exc:
        raise DiagkitError(f"cannot copy the notebooks into {dest}: {exc.strerror or exc}"
                           ) from None


def _copy(source: Path, target: Path, language_info: dict) -> Path:
    """`source` written to `target` with the kernel's `language_info`."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    nb.setdefault("metadata", {})["language_info"] = language_info
    target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return target


def kernel_language_info() -> dict:
    """The `language_info` this interpreter's IPython kernel reports, asked of a child
    process: importing ipykernel here would replace the `comm` package's factory for the whole
    process (ipywidgets in it would then need a running kernel)."""
    code = ("import json; from ipykernel.ipkernel import IPythonKernel; "
            "print(json.dumps(IPythonKernel.language_info))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, check=True)
        return json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {"name": "python"}  # as shipped: JupyterLab fills in the rest on opening


def command(args) -> int:
    """`diagkit notebooks DIR [--force]`: copy, then print each copy's path (exit 0)."""
    for path in copy_notebooks(args.dir, force=args.force):
        print(path.resolve())
    return 0
