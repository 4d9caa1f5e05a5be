"""Where an optimizer group was built (`Finding.source`), for the terminal and for HTML.

One wording for both: "AdamW group 0, built at path/file.py:103" then the lines that built it;
in a notebook "built at cell [3], line 4" (the kernel's file for the cell is temporary).
Source lines are user code, so in HTML every one is escaped.
"""

from __future__ import annotations

import html
import os

from ..core.format import place

_HOW = {"call": "built at", "assigned": "its tensors listed at",
        "watch": "built at (found from the watch(...) call)",
        "watch_call": "built before diagkit.watch(...), handed over at",
        "trainer": "built by the Trainer's create_optimizer at",
        "handed": "handed to Trainer(optimizers=...) at"}


def short_path(file: str) -> str:
    """The path relative to the working folder when it lies inside it, else as recorded."""
    try:
        rel = os.path.relpath(file)
    except ValueError:  # another drive
        return file
    return file if rel.startswith("..") else rel


def source_label(s: dict) -> str:
    """'optimizer 0 group 0 (AdamW), built at src/x.py:103' (no location when none is
    known: an optimizer handed to a Trainer from code diagkit could not read)."""
    words, where = _label_parts(s)
    return f"{words} {where}" if where else words


def _label_parts(s: dict) -> tuple[str, str]:
    head = f"optimizer {s.get('optimizer')} group {s.get('group')} ({s.get('class', '?')})"
    how = _HOW.get(s.get("how"), "built at")
    if not s.get("file", "?"):
        return f"{head}, {how.removesuffix(' at')}", ""
    if isinstance(s.get("cell"), int):  # a notebook cell: its temporary file is gone
        return f"{head}, {how}", place(s.get("file", ""), s.get("line", "?"), s["cell"])
    return f"{head}, {how}", f"{short_path(str(s.get('file', '?')))}:{s.get('line', '?')}"


def path_html(path: str) -> str:
    """A path that wraps only after a '/': each part kept whole (a folder named
    `my-project` was broken at its hyphen in a narrow table), a break allowed after each
    slash (`<wbr>`: the copied text is the path itself)."""
    parts = (f"<span style='white-space:nowrap'>{html.escape(p)}</span>" if p else ""
             for p in path.split("/"))
    return "/<wbr>".join(parts)


def source_text(sources, indent: str) -> list[str]:
    """The terminal lines: the label, then the source lines indented below it."""
    lines = []
    for s in sources or ():
        lines.append(f"{indent}{source_label(s)}:")
        lines += [f"{indent}  | {line}" for line in s.get("lines") or ()]
    return lines


def source_html(sources) -> str:
    """Each group's label and its lines as a code block (escaped); '' without sources. A
    long line wraps in its box (at JupyterLab's 968 px window the box is ~400 px wide): read
    whole, never cut or scrolled sideways."""
    if not sources:
        return ""
    esc = html.escape
    parts = [f'<div class="diagkit-source"><div style="margin-top:4px">{_label_html(s)}'
             f'</div><pre style="margin:2px 0;white-space:pre-wrap;word-break:normal;'
             f'overflow-wrap:anywhere">'
             f'{esc(chr(10).join(s.get("lines") or ()))}</pre></div>' for s in sources]
    return "".join(parts)


def _label_html(s: dict) -> str:
    words, where = _label_parts(s)
    if isinstance(s.get("cell"), int):
        return html.escape(f"{words} {where}")
    return html.escape(words) + (f" {path_html(where)}" if where else "")
