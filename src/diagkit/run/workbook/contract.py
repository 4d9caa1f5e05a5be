"""The notebooks' side of the contract: each notebook's `parameters` cell *is* its contract.

A parameters cell holds one typed, commented literal per line (`steps: int = 5  # ...`;
`Optional[int]` where None is accepted too, after a `from typing import Optional` line: the
spelling papermill's own reader understands, so `papermill --help-notebook` lists every
parameter and passing one draws no "unknown parameter" warning; `int | None` is not read by
papermill). `parameters()` reads it, so names, types, defaults and help have one home, the
notebook; `validate` checks values against it, and options that the library knows (`steps`,
`delta`, ...) get the library's own check (`diagkit.core.options`). Papermill only warns about
a parameter a notebook does not declare, so `check_parameters` turns that into an error naming
the known ones; so is a name the notebook does not know in the parameters cell itself, as a
user edits it in JupyterLab (`stepz = 3`, or `stepz: int = 3`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import io
import json
import os
import tokenize
from pathlib import Path

from ...core.errors import DiagkitError
from ...core.options import CHECKS, check_option
from ...core.shipped import shipped

DIAGNOSE = "diagnose.ipynb"
COMPARE = "compare_checkpoints.ipynb"
_INJECTED_HEADER = "# Parameters"  # papermill's injected cell starts with this comment
_TYPES = {"str": str, "int": int, "bool": bool, "dict": dict, "float": float, "list": list,
          "None": type(None)}


@dataclasses.dataclass(frozen=True)
class Parameter:
    name: str
    types: tuple[type, ...]
    default: object
    help: str


def notebook_path(name: str = DIAGNOSE) -> Path:
    """A notebook diagkit ships (`diagkit.core.shipped`), or one in $DIAGKIT_NOTEBOOKS."""
    folder = Path(os.environ.get("DIAGKIT_NOTEBOOKS") or shipped("notebooks"))
    path = folder / name
    if not path.is_file():
        raise DiagkitError(f"notebook {path} not found: set DIAGKIT_NOTEBOOKS to a folder "
                           "holding diagkit's notebooks")
    return path


def parameters(notebook: str = DIAGNOSE) -> dict[str, Parameter]:
    """The parameters a notebook declares, in its order."""
    path = notebook_path(notebook)
    return _parse(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _parse(path: str, _mtime: int) -> dict[str, Parameter]:
    cells = [c for c in _cells(path) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise DiagkitError(f"{path} must have exactly one cell tagged 'parameters'")
    source = cells[0].get("source", "")
    return parse_cell(source if isinstance(source, str) else "".join(source), path)


def _cells(path: str) -> list[dict]:
    """A notebook's cells. A version-4 notebook (what diagkit ships and Jupyter writes) is
    read as the JSON it is: every notebook kernel reads its own parameters cell, and nbformat
    brings jsonschema, whose format checkers build their grammars at import (~1.3 CPU s per
    kernel, and per `diagkit compare`). Older notebooks go through nbformat's upgrade."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    if not isinstance(nb, dict) or nb.get("nbformat") != 4:
        import nbformat
        nb = nbformat.read(path, as_version=4)
    return nb.get("cells", [])


def parse_cell(source: str, origin: str = "the parameters cell") -> dict[str, Parameter]:
    """The parameters a parameters cell declares (one `name: type = literal  # help` a line)."""
    declared, untyped = _read_cell(source, origin)
    if untyped:
        raise DiagkitError(f"{origin}: the parameters cell holds only `name: type = literal`")
    return declared


def _read_cell(source: str, origin: str) -> tuple[dict[str, Parameter], list[str]]:
    """A parameters cell's typed parameters, and the names it assigns without a type (`stepz
    = 3`: a line a user edited). Anything but literals assigned to names is refused."""
    comments = {tok.start[0]: tok.string.lstrip("# ").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    out, untyped = {}, []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module == "typing":
            continue  # `from typing import Optional`: what the annotations below need
        if (isinstance(node, ast.Assign) and node.value is not None
                and all(isinstance(t, ast.Name) for t in node.targets)):
            ast.literal_eval(node.value)  # a literal, or ValueError: not a parameters cell
            untyped += [t.id for t in node.targets]
            continue
        if (not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name)
                or node.value is None):
            raise DiagkitError(f"{origin}: the parameters cell holds only `name: type = literal`")
        name = node.target.id
        out[name] = Parameter(name, _annotation_types(node.annotation),
                              ast.literal_eval(node.value), comments.get(node.lineno, ""))
    return out, untyped


@dataclasses.dataclass(frozen=True)
class _RanCell:
    """The parameters cell as the kernel ran it: what it declares, what it assigns untyped."""
    declared: dict[str, Parameter]
    untyped: list[str]


def _from_history(namespace: dict, shipped: dict[str, Parameter] | None) -> _RanCell | None:
    """The parameters cell as the running kernel executed it: the last cell in IPython's input
    history that holds only literals assigned to names, one at least typed (and, when the
    shipped notebook is at hand, one at least of its parameters: a cell of the user's own such
    as `lr: float = 0.1` is not it). Papermill's injected cells are not it either. So a
    notebook checks itself against its own cell, with or without the repository's copy of it
    at hand (an installed wheel, a copied notebook)."""
    for source in reversed(namespace.get("In", []) or []):
        if (not isinstance(source, str) or not source.strip()
                or source.startswith(_INJECTED_HEADER)):
            continue
        try:
            declared, untyped = _read_cell(source, "the parameters cell")
        except (DiagkitError, SyntaxError, ValueError, tokenize.TokenError):
            continue
        if declared and (shipped is None or set(declared) & set(shipped)):
            return _RanCell(declared, untyped)
    return None


def _annotation_types(node: ast.expr) -> tuple[type, ...]:
    """`int` -> (int,); `Optional[str]` (the notebooks' spelling) and `str | None` (a copy
    made by an older diagkit) -> (str, NoneType); `Union[int, str]` -> (int, str)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation_types(node.left) + _annotation_types(node.right)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if node.value.id == "Optional" and len(inner) == 1:
            return _annotation_types(inner[0]) + (type(None),)
        if node.value.id == "Union":
            return tuple(t for part in inner for t in _annotation_types(part))
    if isinstance(node, ast.Constant) and node.value is None:
        return (type(None),)
    key = node.id if isinstance(node, ast.Name) else None
    if key not in _TYPES:
        raise DiagkitError(f"unsupported parameter annotation {ast.unparse(node)!r}")
    return (_TYPES[str(key)],)


def validate(values: dict, notebook: str = DIAGNOSE) -> dict:
    """Check names and types against a notebook's parameters; return all of them, defaults
    filled in (what `diagkit report` checks before it starts a kernel)."""
    return _validate(values, parameters(notebook))


def _validate(values: dict, declared: dict[str, Parameter]) -> dict:
    _refuse_unknown(values, declared)
    out = {}
    for name, p in declared.items():
        value = values.get(name, p.default)
        if (isinstance(value, bool) and bool not in p.types) or not isinstance(value, p.types):
            expected = " or ".join("None" if t is type(None) else t.__name__ for t in p.types)
            raise DiagkitError(f"notebook parameter {name!r} must be {expected}, "
                               f"got {type(value).__name__} {value!r}")
        if name in CHECKS and value is not None:  # None passed the types: it is declared
            check_option(name, value, f"notebook parameter {name!r}")
        out[name] = value
    return out


def check_parameters(namespace: dict, notebook: str = DIAGNOSE) -> dict:
    """Called by a notebook right after its parameters: reject names papermill injected but
    the notebook does not declare, names in the parameters cell itself that the notebook does
    not know (a parameter renamed in JupyterLab: `stepz = 3`), and wrong values, before any
    work starts. The contract is the parameters cell the kernel ran, else the shipped
    notebook's."""
    shipped = _shipped(notebook)
    cell = _from_history(namespace, shipped)
    known = _contract(cell, shipped, notebook)
    _refuse_unknown(dict.fromkeys(injected(namespace)), known)
    if cell is not None:
        _refuse_unknown(dict.fromkeys(cell.untyped), known)
        if shipped is not None:  # a typed line renamed: the notebook's code knows no such name
            _refuse_unknown(cell.declared, shipped)
    return _validate({name: namespace[name] for name in known if name in namespace}, known)


def declared(namespace: dict, notebook: str = DIAGNOSE) -> dict[str, Parameter]:
    """The contract a running notebook answers to: the parameters cell the kernel ran (over
    the shipped notebook's, which fills in a line the cell lacks), else the shipped one's."""
    shipped = _shipped(notebook)
    return _contract(_from_history(namespace, shipped), shipped, notebook)


def _contract(cell: _RanCell | None, shipped: dict[str, Parameter] | None,
              notebook: str) -> dict[str, Parameter]:
    if cell is None:
        return parameters(notebook)  # (not found: one line saying where it looked)
    return {**(shipped or {}), **cell.declared}


def _shipped(notebook: str) -> dict[str, Parameter] | None:
    """The shipped notebook's parameters, or None where it is out of reach."""
    try:
        return parameters(notebook)
    except DiagkitError:
        return None


def injected(namespace: dict) -> set[str]:
    """The names papermill set (its injected `# Parameters` cells in the kernel's history):
    what the caller passed on purpose, as opposed to the cell's defaults."""
    names: set[str] = set()
    for source in namespace.get("In", []) or []:
        if isinstance(source, str) and source.startswith(_INJECTED_HEADER):
            names.update(_assigned_names(source))
    return names


def _refuse_unknown(values: dict, declared: dict) -> None:
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise DiagkitError(f"unknown notebook parameter(s) {', '.join(map(repr, unknown))}; "
                           f"known: {', '.join(declared)}")


def _assigned_names(source: str) -> dict:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {t.id: None for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}
