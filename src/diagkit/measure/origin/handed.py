"""Where an optimizer handed to a framework's constructor was built, read from the user's call.

The HF `Trainer(..., optimizers=(optimizer, scheduler))` gets an optimizer diagkit did not see
built (the callback exists only from that call on). Its lines are found as `watch_sources`
finds a watched optimizer's: the user's statement is parsed (`ast`) and the argument followed,
but only as far as it can be followed exactly: a name assigned in the calling function, a call
of an optimizer class (looked up in the caller's namespace, never called), or a call of a
user's function with a single `return`. The class found must be the optimizer's own class;
else the record shows the argument itself, labelled "handed to". The records are those of
`measure.origin.provenance` (JSON-able dicts), plus `lever` (the keyword) and `lever_at` (file:line,
or "cell [n], line k" in a notebook). `listed_group_lines`: a group's own element of the list a
framework's construction built (the HF Trainer's `create_optimizer`).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import linecache
import os
import types

import torch

from ...core.format import place
from .cells import cell_number
from .provenance import class_name, code_file, user_site
from .user_code import (assignment, from_call, installed, lines_of, outer_call, parse,
                        statement)

_DEPTH = 3  # names and functions followed from the argument to the optimizer's class call


def handed_sources(frame, optimizer, keyword: str, element: int = 0) -> list[dict]:
    """The records of `optimizer`'s groups, from the user's call at `frame` (the caller of
    the framework's constructor) that passed it as `keyword=` (its `element`-th item when a
    tuple). [] when that call is not user code or cannot be read."""
    site = user_site(frame)
    if site is None or installed(site["file"]):
        return []
    with contextlib.suppress(Exception):  # an extra: the trainer never fails for want of it
        file = site["file"]
        tree, stmt, func = statement(file, site["line"])
        scope = func or tree
        kw = next(k for n in ast.walk(stmt) if isinstance(n, ast.Call)
                  for k in n.keywords if k.arg == keyword)
        value = _handed_item(kw.value, scope, stmt.lineno, element)
        lever = {"lever": keyword, "lever_at": place(file, kw.value.lineno, cell_number(file)),
                 "function": site["function"], "callers": site["callers"],
                 **({"cells": site["cells"]} if "cells" in site else {})}
        built = _follow(value, file, scope, stmt.lineno, _namespace(frame, file), _DEPTH)
        if built is not None and type(optimizer) is not built[3]:
            built = None  # the class read is not the optimizer's own: show the argument only
        handed = {**lines_of(file, kw, "handed"), "call_line": stmt.lineno}
        return [{"optimizer": 0, "group": j, "class": class_name(optimizer),
                 **(from_call(*built[:2], built[2], j, "call") if built else handed), **lever}
                for j in range(len(optimizer.param_groups))]
    return []


def _handed_item(node, scope, before: int, element: int):
    """The optimizer's expression in the argument: `(opt, sched)` or a name bound to one."""
    if isinstance(node, ast.Name):
        made = assignment(scope, node, before)
        node = made.value if isinstance(made, ast.Assign) else node
    if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) > element:
        return node.elts[element]
    raise ValueError("not a tuple of (optimizer, scheduler)")


def _namespace(frame, file: str) -> dict:
    """What names mean where the call was made: the user's frame at `file` (locals first)."""
    while frame is not None and code_file(frame) != file:
        frame = frame.f_back
    return {} if frame is None else {**frame.f_globals, **frame.f_locals}


def _follow(node, file: str, scope, before: int, names: dict, depth: int):
    """(file, scope, the optimizer class's call node, the class) that built `node`, or None."""
    if depth == 0 or node is None:
        return None
    if isinstance(node, ast.Name):
        made = assignment(scope, node, before)
        if not isinstance(made, ast.Assign):
            return None
        return _follow(made.value, file, scope, made.lineno, names, depth - 1)
    if not isinstance(node, ast.Call):
        return None
    called = _resolve(node.func, names)
    if isinstance(called, type) and issubclass(called, torch.optim.Optimizer):
        return file, scope, node, called
    if isinstance(called, types.FunctionType):
        return _returned(called, depth - 1)
    return None


def _resolve(node, names: dict):
    """The object a callee expression names (`AdamW`, `torch.optim.AdamW`), looked up without
    running anything: attributes only of modules. None when it cannot be told."""
    if isinstance(node, ast.Name):
        return names.get(node.id, getattr(builtins, node.id, None))
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        if isinstance(base, types.ModuleType):
            return getattr(base, node.attr, None)
    return None


def _returned(function, depth: int):
    """What a user's function with one `return <expression>` built (followed as above)."""
    file = os.path.abspath(function.__code__.co_filename)
    if installed(file) or not linecache.getlines(file):
        return None
    tree = parse("".join(linecache.getlines(file)))
    first = function.__code__.co_firstlineno
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name == function.__name__
            and min([n.lineno] + [d.lineno for d in n.decorator_list]) == first]
    if len(defs) != 1:
        return None
    returns = [n for n in _own_nodes(defs[0]) if isinstance(n, ast.Return)]
    if len(returns) != 1 or returns[0].value is None:
        return None
    names = {**vars(builtins), **function.__globals__}
    return _follow(returns[0].value, file, defs[0], returns[0].lineno + 1, names, depth)


def _own_nodes(func):
    """The nodes of a function's body, not of the functions and lambdas nested in it."""
    todo = list(func.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                 ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def listed_group_lines(file: str, call_line: int, group: int, groups: int) -> dict | None:
    """Group `group`'s element of the first literal list of `groups` groups
    (`[{"params": ...}, ...]`) assigned, in the function of the call at `call_line`, to the
    name that call passes. For a library's construction whose groups were checked to be that
    list's (the HF Trainer's), where the last assignment before the call (what `_from_call`
    shows) may be a branch that did not run. None when there is no such list."""
    tree, stmt, func = statement(file, call_line)
    call = outer_call(stmt)
    name = call.args[0] if call is not None and call.args else None
    if func is None or not isinstance(name, ast.Name):
        return None
    lists = sorted((n for n in ast.walk(func) if isinstance(n, ast.Assign)
                    and n.lineno < call_line and isinstance(n.value, ast.List)
                    and any(isinstance(t, ast.Name) and t.id == name.id for t in n.targets)
                    and all(isinstance(e, ast.Dict) for e in n.value.elts)),
                   key=lambda n: n.lineno)
    if not lists or len(lists[0].value.elts) != groups:
        return None
    return {**lines_of(file, lists[0].value.elts[group], "trainer"), "call_line": call_line}
