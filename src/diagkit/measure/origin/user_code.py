"""Reading the user's source for the lines that built an optimizer group: one parse per file
(`parse`), the statement at a line (`statement`), the call in it (`outer_call`), the statement
that assigned a name (`assignment`), a group's own lines (`from_call`, `lines_of`), and whether
a file is an installed package's (`installed`).

Shared by `provenance` (optimizers built in the user's code or `watch(...)` call) and `handed`
(an optimizer handed to a framework's constructor).
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import textwrap

from .cells import cell_number

MAX_LINES = 8  # lines kept per group; a longer construction is cut with "..."


def installed(file: str) -> bool:
    """A file of an installed package (a framework's, not the user's own code)."""
    return any(part in ("site-packages", "dist-packages") for part in file.split(os.sep))


def from_call(file: str, scope, stmt, group: int, how: str) -> dict:
    """Group `group` of the optimizer call in `stmt`: its element of a literal list of groups
    (and the statement that made the list it names), or the statement assigning the name
    passed; else the whole statement."""
    call = outer_call(stmt)
    params = call.args[0] if call is not None and call.args else None
    if params is None and call is not None:
        params = next((k.value for k in call.keywords if k.arg in ("params", "param_group")),
                      None)
    node = None
    if isinstance(params, (ast.List, ast.Tuple)) and params.elts and all(
            isinstance(e, ast.Dict) for e in params.elts):
        node = params.elts[group] if group < len(params.elts) else None
    elif isinstance(params, ast.Dict) or group == 0:
        node = params
    if isinstance(node, ast.Dict):
        value = next((v for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value == "params"), None)
        made = assignment(scope, value, stmt.lineno)
        found = (lines_of(file, made, "assigned", also=node) if made is not None
                 else lines_of(file, node, how))
        return {**found, "call_line": stmt.lineno}
    made = assignment(scope, node, stmt.lineno)
    found = (lines_of(file, made, "assigned", also=stmt) if made is not None
             else lines_of(file, stmt, how))
    return {**found, "call_line": stmt.lineno}


def statement(file: str, line: int):
    """(module tree, innermost statement holding `line`, its enclosing function or None)."""
    tree = parse("".join(linecache.getlines(file)))
    holding = [n for n in ast.walk(tree)
               if isinstance(n, ast.stmt) and n.lineno <= line <= (n.end_lineno or n.lineno)]
    if not holding:
        raise ValueError(f"no statement at {file}:{line}")
    best = min(holding, key=lambda n: (n.end_lineno - n.lineno, -n.lineno))
    funcs = [n for n in holding if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return tree, best, max(funcs, key=lambda n: n.lineno) if funcs else None


@functools.lru_cache(maxsize=16)
def parse(source: str) -> ast.Module:
    """One parse per source file, however many groups it built (the tree is only read)."""
    return ast.parse(source)


def outer_call(stmt):
    """The outermost call of a statement (`opt = AdamW(...)`, `opt.add_param_group(...)`)."""
    value = getattr(stmt, "value", None)
    if isinstance(stmt, ast.Call):
        return stmt
    if isinstance(value, ast.Call):
        return value
    return next((n for n in ast.walk(stmt) if isinstance(n, ast.Call)), None)


def assignment(scope, node, before: int):
    """The last statement in `scope` before line `before` that assigned the name `node` (an
    `ast.Name`), or None."""
    if not isinstance(node, ast.Name):
        return None
    best = None
    for stmt in ast.walk(scope):
        targets = (stmt.targets if isinstance(stmt, ast.Assign) else
                   [stmt.target] if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else [])
        if getattr(stmt, "lineno", 0) < before and any(
                isinstance(t, ast.Name) and t.id == node.id for t in targets):
            if best is None or stmt.lineno > best.lineno:
                best = stmt
    return best


def lines_of(file: str, node, how: str, also=None) -> dict:
    """The node's source lines, dedented, at most MAX_LINES (`also`: a second node shown
    after it, e.g. the group dict or the call that used the assigned name)."""
    lines: list[str] = []
    for span in [node] + ([also] if also is not None else []):
        chunk = "\n".join(linecache.getline(file, n).rstrip("\n")
                          for n in range(span.lineno, (span.end_lineno or span.lineno) + 1))
        lines += textwrap.dedent(chunk).splitlines()
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES - 1] + ["..."]
    return {"file": file, "line": node.lineno, "lines": lines, "how": how, **cell_of(file)}


def cell_of(file: str) -> dict:
    """{"cell": n} when `file` is an IPython cell's (its execution count: the notebook's
    "[n]", kept because the file itself is gone when the kernel ends), else {}."""
    number = cell_number(file)
    return {} if number is None else {"cell": number}
