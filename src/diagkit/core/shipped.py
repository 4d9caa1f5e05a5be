"""Where the files diagkit ships live: the notebooks and the demo data.

In a clone they are the repository's `notebooks/` and `data/`. A wheel carries a copy of both
inside the package (`diagkit/_shipped/`, put there by `setup.py`'s build step), so an installed
diagkit reports and demos as a clone does.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
REPO = PACKAGE.parents[1]


def shipped(folder: str) -> Path:
    """The folder `folder` ("notebooks" or "data"): the wheel's copy, else the repository's."""
    inside = PACKAGE / "_shipped" / folder
    return inside if inside.is_dir() else REPO / folder
