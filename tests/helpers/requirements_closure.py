"""What a requirement pulls, read offline from the installed packages' own metadata
(`Requires-Dist`, markers evaluated for this Python and each extra asked for): pyproject.toml's
`project` table and the closure of a list of requirements (tests/test_core_dependencies.py,
tests/e2e/test_core_wheel.py)."""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def requires(name: str, extra: str) -> list[str]:
    """The requirements of `name` (with `extra`, or "" for the base) that apply here: diagkit's
    from pyproject.toml (this tree, not an older install), the others' from their metadata."""
    if name == "diagkit":
        p = project()
        return list(p["dependencies"] if not extra else p["optional-dependencies"][extra])
    lines = metadata.distribution(name).requires or []
    env = {"extra": extra}
    return [line for line in lines if (r := Requirement(line)).marker is None
            or r.marker.evaluate(env)]


def closure(requirements) -> set[str]:
    """Every distribution that `requirements` pull, through each one's own requirements."""
    seen: set[tuple[str, str]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonical(req.name)
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for line in requires(name, extra):
                r = Requirement(line)
                r.marker = None  # evaluated by `requires`, for the extra it belongs to
                todo.append(r)
    return {name for name, _ in seen}
