"""The user's own names for the model and the optimizers, read from their `watch(...)` call.

A fix is code to paste where the user trains (README, "Reading a finding"): it must say `opt`
when the loop's optimizer is `opt`, and `model2` when the watched model is `model2`, not a
`model` that may be another one in the same notebook. The caller's statement is parsed
(`ast`, as `provenance.watch_sources` parses it) and only a simple expression is kept: a name,
an attribute, a subscript by a constant (`m`, `self.model`, `opts[0]`); anything else (a call,
an operator) gives no name, and the fix says `model` / `optimizer`. Nothing is evaluated.

The result is JSON-able, `meta["names"]`: {"model": expression, or {key: expression} for a dict
of modules; "optimizers": [expression or None, one per watched optimizer]}. A wrapper the
watch saw through is spelled out (`ddp.module`), since the tensors are named inside it.
"""

from __future__ import annotations

import ast
import contextlib

import torch

from .provenance import statement, user_site

# The attributes a module wrapper keeps its module in (DDP, DataParallel, DeepSpeed: `module`;
# torch.compile: `_orig_mod`), followed by identity to the module that was watched.
_INNER = ("module", "_orig_mod")


def simple_expression(text) -> bool:
    """Whether `text` is a name, an attribute or a subscript by a constant, nested (code that
    reads a variable and runs nothing)."""
    if not isinstance(text, str) or not text or len(text) > 200:
        return False
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    return _simple(node)


def _simple(node) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript) and not (
                isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, (int, str))):
            return False
        node = node.value
    return isinstance(node, ast.Name)


def watch_names(frame, model, inner, optimizers: int) -> dict:
    """`meta["names"]` from the caller's `watch(...)` statement (`frame`: the frame that called
    watch; `model`: what it was handed, `inner`: the module watched under any wrappers;
    `optimizers`: how many were watched). {} when the statement cannot be read."""
    site = user_site(frame, walk=False) if frame is not None else None
    with contextlib.suppress(Exception):  # an extra: a watch never fails for want of it
        _, stmt, _ = statement(site["file"], site["line"])
        call = _watch_call(stmt)
        names = {"model": _model(_argument(call, 0, "model"), model, inner),
                 "optimizers": _optimizers(_argument(call, 1, "optimizer_or_list"), optimizers)}
        return {k: v for k, v in names.items() if v}
    return {}


def _watch_call(stmt) -> ast.Call:
    """The `watch(...)` call in the statement (`diagkit.watch`, `watch`), else its only call."""
    calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call)]
    named = [c for c in calls if getattr(c.func, "attr", getattr(c.func, "id", None)) == "watch"]
    if len(named) == 1:
        return named[0]
    if len(calls) == 1:
        return calls[0]
    raise ValueError("no single watch(...) call in the statement")


def _argument(call: ast.Call, index: int, keyword: str):
    if len(call.args) > index and not any(isinstance(a, ast.Starred) for a in call.args):
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _model(node, model, inner):
    """The model's expression, down to the watched module; a dict of modules by key."""
    if isinstance(node, ast.Dict) and isinstance(model, dict):
        found = {}
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and key.value in model:
                root = _model(value, model[key.value], inner[key.value])
                if root:
                    found[key.value] = root
        return found or None
    if node is None or not _simple(node):
        return None
    path = _path(model, inner)
    return None if path is None else ast.unparse(node) + path


def _optimizers(node, count: int) -> list | None:
    """One expression per watched optimizer: each item of a literal list, or `opts[i]` of a
    name that holds several."""
    if node is None or count == 0:
        return None
    if isinstance(node, (ast.List, ast.Tuple)):
        if len(node.elts) != count:
            return None
        found = [ast.unparse(e) if _simple(e) else None for e in node.elts]
    elif _simple(node):
        text = ast.unparse(node)
        found = [text] if count == 1 else [f"{text}[{i}]" for i in range(count)]
    else:
        return None
    return found if any(found) else None


def _path(model, inner) -> str | None:
    """The attributes from `model` to `inner` through module wrappers ('' when the same)."""
    path = ""
    for _ in range(4):
        if model is inner:
            return path
        attr = next((a for a in _INNER
                     if isinstance(getattr(model, a, None), torch.nn.Module)), None)
        if attr is None:
            return None
        model, path = getattr(model, attr), f"{path}.{attr}"
    return path if model is inner else None

