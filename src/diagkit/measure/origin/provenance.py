"""Where the user's code built each optimizer and each of its param groups.

`record_optimizer_sources()` patches `torch.optim.Optimizer.__init__` and `add_param_group` for
the duration of a target's build only (always restored, even when the build raises). Each group
added is noted with the user's frame: the innermost frame outside torch and diagkit (diagkit's
demos count as user code). The lines kept are the group's own construction: the group's
element of the list passed (`{"params": [...], ...}`), or, when a name is passed, the statement
in the same function that assigned that name (found with `ast`), else the call's statement.

`watch_sources(frame, n)`: for `diagkit.watch`, where the optimizers already exist, the same
search started from the caller's `watch(...)` statement (the optimizer argument's name is
resolved to its assignment in the caller's function, or in a notebook in the cells run
before). The records are plain JSON-able dicts: {"optimizer", "group", "class", "file", "line",
"lines", "how"}, "cell" (the number of the notebook cell `file` is: `measure.origin.cells`; "cells" maps
each cell file a record names to its number), and from a recording "function" (the user's
function that built the group: a framework's hook such as Lightning's `configure_optimizers`
names the user's lever).
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import os
import sys

import torch

from .cells import cell_number
from .user_code import (assignment, cell_of, from_call, installed, lines_of, outer_call,
                        parse, statement)

_TORCH = os.path.dirname(torch.__file__) + os.sep
_DIAGKIT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_DEMOS = os.path.join(_DIAGKIT, "demos") + os.sep


class _Recorder:
    """The groups added while recording: (optimizer, group index, the user's file and line).
    Optimizers are held only while the build lasts (the recorder goes with it)."""

    def __init__(self):
        self.added: list[tuple[object, int, dict]] = []


_active: list[_Recorder] = []


@contextlib.contextmanager
def record_optimizer_sources():
    """Note the user's frame of every param group added meanwhile; yields the recorder, which
    `sources_for(recorder, optimizers)` turns into the records of the optimizers returned."""
    recorder = _Recorder()
    base = torch.optim.Optimizer
    orig_init, orig_add = base.__init__, base.add_param_group

    def note(opt, index: int, frame) -> None:
        if _active:
            with contextlib.suppress(Exception):  # provenance is an extra: never break a build
                site = user_site(frame)
                if site is not None:
                    _active[-1].added.append((opt, index, site))

    def add_param_group(self, param_group):
        note(self, len(getattr(self, "param_groups", ())), sys._getframe(1))
        return orig_add(self, param_group)

    def __init__(self, *args, **kwargs):  # noqa: N807 - the patched constructor
        """A subclass whose own add_param_group skips the base's: its groups get the
        constructor's line."""
        result = orig_init(self, *args, **kwargs)
        seen = {j for opt, j, _ in (_active[-1].added if _active else ()) if opt is self}
        for j in range(len(getattr(self, "param_groups", ()))):
            if j not in seen:
                note(self, j, sys._getframe(1))
        return result

    base.__init__, base.add_param_group = __init__, add_param_group
    _active.append(recorder)
    try:
        yield recorder
    finally:
        _active.remove(recorder)
        base.__init__, base.add_param_group = orig_init, orig_add


def class_name(opt) -> str:
    """The optimizer's class as the user built it: ZeRO's, not diagkit's view of it."""
    return getattr(opt, "class_name", type(opt).__name__)


def sources_for(recorder: _Recorder, optimizers) -> list[dict]:
    """The records of the groups of `optimizers` (by identity, in the order diagkit numbers
    them), the latest note of each group winning."""
    found: dict[tuple[int, int], dict] = {}
    for opt, group, site in recorder.added:
        for i, mine in enumerate(optimizers):
            if mine is opt:
                found[(i, group)] = {"optimizer": i, "group": group,
                                     "class": class_name(opt), **_group_lines(site, group),
                                     "function": site.get("function", ""),
                                     "callers": site.get("callers", []),
                                     **({"cells": site["cells"]} if "cells" in site else {})}
    return [found[k] for k in sorted(found)]


def watch_sources(frame, optimizers) -> list[dict]:
    """For `watch`: each group's construction, found from the caller's `watch(model, opt)`
    statement (`frame`: the frame that called watch) by the optimizer argument's name, its
    assignment in the caller's function; that statement itself when the name is not assigned
    there. [] when the caller is not user code (an integration's callback: no user line)."""
    site = user_site(frame, walk=False)
    records: list[dict] = []
    with contextlib.suppress(Exception):  # an extra: a watch never fails for want of it
        tree, stmt, func = statement(site["file"], site["line"])
        call = outer_call(stmt)
        arg = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "optimizer_or_list"), None)
        for i, opt in enumerate(optimizers):
            node = arg.elts[i] if isinstance(arg, (ast.List, ast.Tuple)) else arg
            file, scope = site["file"], func or tree
            built = assignment(scope, node, stmt.lineno)
            if built is None and func is None:  # a notebook: built in an earlier cell?
                file, scope, built = _earlier_cell(file, node) or (file, scope, None)
            for j in range(len(opt.param_groups)):
                rec = {"optimizer": i, "group": j, "class": class_name(opt)}
                rec.update(from_call(file, scope, built, j, "watch")
                           if built is not None and outer_call(built) is not None
                           else lines_of(site["file"], stmt, "watch_call"))
                records.append(rec)
    return records


def _earlier_cell(file: str, node):
    """(file, tree, statement): the last assignment of the name `node` in the notebook cells
    run before the cell `file` (latest first), or None (not a cell, or not found). IPython
    keeps each cell's source in linecache under the cell's own file name."""
    number = cell_number(file)
    if number is None or not isinstance(node, ast.Name):
        return None
    earlier = sorted(((n, f) for f in list(linecache.cache) if f != file
                      for n in [cell_number(f)] if n is not None and n < number), reverse=True)
    for _, cell in earlier[:100]:
        with contextlib.suppress(SyntaxError, ValueError):
            tree = parse("".join(linecache.getlines(cell)))
            made = assignment(tree, node, sys.maxsize)
            if made is not None:
                return cell, tree, made
    return None


def user_site(frame, walk: bool = True) -> dict | None:
    """The innermost frame outside torch and diagkit (diagkit's demos count as user code, also
    when installed): its file and current line (`walk=False`: `frame` itself, or None)."""
    while frame is not None:
        file = code_file(frame)
        ours = file.startswith(_DIAGKIT) and not file.startswith(_DEMOS)
        if not (file.startswith(_TORCH) or ours or _not_source(file)):
            callers = _user_callers(frame.f_back)
            cells = {f: n for f in {file, *(c[1] for c in callers)}
                     for n in [cell_number(f)] if n is not None}
            return {"file": file, "line": frame.f_lineno, "function": frame.f_code.co_name,
                    "callers": callers, **({"cells": cells} if cells else {})}
        frame = frame.f_back if walk else None
    return None


def code_file(frame) -> str:
    """The frame's file, absolute; an IPython cell keeps the name it was compiled under (a
    terminal shell's `<ipython-input-3-…>`: its source is in linecache under that name), and
    any other `<…>` name (an exec'd string) stays one too (`_not_source`)."""
    file = frame.f_code.co_filename
    return file if file.startswith("<") else os.path.abspath(file)


def _not_source(file: str) -> bool:
    """A `<…>` name with no source to read (an exec'd string), unlike an IPython cell's."""
    return file.startswith("<") and cell_number(file) is None


def _user_callers(frame, most: int = 6) -> list[list]:
    """[function, file, line] of the user's frames that called the site's, outward until the
    first one of an installed package (a framework that called the user's hook) or torch.
    diagkit's own frames (a callback's stand-in for the hook it records) are passed over."""
    found = []
    while frame is not None and len(found) < most:
        file = code_file(frame)
        if file.startswith(_TORCH) or _not_source(file) or installed(file):
            break
        if not file.startswith(_DIAGKIT) or file.startswith(_DEMOS):
            found.append([frame.f_code.co_name, file, frame.f_lineno])
        frame = frame.f_back
    return found


def _group_lines(site: dict, group: int) -> dict:
    """The lines that built group `group`, from the call at `site`; the call's line alone when
    its source cannot be parsed."""
    try:
        tree, stmt, func = statement(site["file"], site["line"])
        return from_call(site["file"], func or tree, stmt, group, "call")
    except Exception:  # no source (an exec'd string, an edited file): the bare location
        text = linecache.getline(site["file"], site["line"]).strip()
        return {"file": site["file"], "line": site["line"], "lines": [text] if text else [],
                "how": "call", **cell_of(site["file"])}


