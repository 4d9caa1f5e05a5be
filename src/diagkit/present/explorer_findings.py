"""The findings on top of the explorer (docs/workbook.md, "The explorer"): each finding's
severity, verdict, where, its message and its fix, and a button that picks its tensors.

The fix is shown in its form (`core.fixtext`, drawn by `present.html_text` as every HTML view
draws it): the words as text, the code to paste as code on lines of its own with a copy
button, wrapped inside the output area's width, never cut and never in a box to scroll
sideways. Picking a finding (`pick`) plots its tensors and sets the filters to them, so
that the picker and the table show them too. Presents only; never measures.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from ..core import fixtext
from ..core.format import dotted_breaks, human_bytes
from .html_text import fix_html, prose
from .sections import severity_chip
from .source import source_html

MOST_FINDINGS = 12   # findings listed; the rest are counted (print(diagnosis) lists them all)

# Text in an ipywidgets HTML box has the controls' line height (28 px): prose reads closer.
_TEXT = "<div style='line-height:1.45'>{}</div>"
# Code in this box (a fix's blocks, `present.html_text`; the lines that built a group,
# `present.source`) wraps inside the box, never cut nor scrolled sideways; JupyterLab's own
# `word-break:break-all` for an output's <pre> is undone (a name broke at any letter).
_CODE_STYLE = ("<style>.diagkit-explorer-findings pre{white-space:pre-wrap !important;"
               "word-break:normal !important;overflow-wrap:anywhere;"
               "overflow-x:visible !important}</style>")


def title_html(f) -> str:
    """'[error] orphan in head2.weight · 2 tensors, 8.0 KiB · from step 3': numbers kept whole
    with their units, a module name wrapping at its dots only."""
    esc = html.escape
    where = (f" in <span class='diagkit-finding-where'>{dotted_breaks(esc(f.module))}</span>"
             if f.module else "")
    facts = []
    if f.count:
        facts.append(_whole(f"{f.count:,} tensor{'s' * (f.count != 1)}"
                            + (f", {human_bytes(int(f.bytes))}" if f.bytes else "")))
    facts += [_whole(w) for w in _when(f)]
    return _TEXT.format(severity_chip(f.severity, esc(f.severity)) + f" <b>{esc(f.code)}</b>"
                        + where + "".join(f" · {w}" for w in facts))


def body_html(f) -> str:
    """The message, then the fix (`present.html_text.fix_html`: words as text, each block of
    code as code with a copy button), then where its optimizer's groups were built (folded:
    the fix comes first)."""
    out = [f"<div class='diagkit-finding-message'>{prose(f.message)}</div>"]
    if fixtext.parts(f.fix):
        out.append(f"<div class='diagkit-fix'><b>fix:</b>{fix_html(f.fix, copy=True)}</div>")
    source = source_html(getattr(f, "source", ()))
    if source:
        out.append("<details class='diagkit-finding-source'><summary>where its optimizer "
                   f"groups were built</summary>{source}</details>")
    return _TEXT.format("".join(out))


def pick(state, f) -> list[str]:
    """Point the explorer at finding `f`: its tensors plotted; the filters set to its verdict
    (when every one of its tensors carries it) and to its module (when every one lies in it),
    the name filter cleared, so that the picker and the table show them. Returns the tensors
    picked (none when the diagnosis holds none of them: the state is left as it was)."""
    names = [n for n in f.params if state.verdicts_of(n)]
    if not names:
        return []
    modules = [state.module_of(n) for n in names]
    inside = bool(f.module) and all(m == f.module or m.startswith(f.module + ".")
                                    for m in modules)
    state.name_regex = ""
    state.verdicts = {f.code} if all(f.code in state.verdicts_of(n) for n in names) else ()
    state.module_prefix = f.module if inside else ""
    state.selected = names
    state.picked_finding = f
    return names


class FindingsBox(widgets.VBox):
    """The findings, worst first: per finding its title, a button that picks its tensors
    (`on_pick(finding)`), and its message and fix. `buttons`: one per finding shown."""

    def __init__(self, findings, on_pick, **kwargs):
        super().__init__(layout=widgets.Layout(width="auto"), **kwargs)
        self.add_class("diagkit-explorer-findings")
        shown = list(findings)[:MOST_FINDINGS]
        self.buttons = []
        rows = [widgets.HTML(value=_heading(findings), layout=widgets.Layout(width="auto"))]
        for i, f in enumerate(shown):
            rows.append(self._row(i, f, on_pick))
        self.children = rows

    def _row(self, i: int, f, on_pick) -> widgets.VBox:
        tensors = len(f.params)
        button = widgets.Button(
            description=f"plot its {tensors} tensor{'s' * (tensors != 1)}" if tensors
            else "no tensor to plot", disabled=not tensors,
            tooltip="plot this finding's tensors and filter the table to them",
            layout=widgets.Layout(width="auto", flex="0 0 auto"))
        button.add_class("diagkit-finding-pick")
        button.on_click(lambda _b, f=f: on_pick(f))
        self.buttons.append(button)
        title = widgets.HTML(value=title_html(f), layout=widgets.Layout(width="auto",
                                                                          flex="1 1 0%"))
        head = widgets.HBox([title, button], layout=widgets.Layout(
            width="auto", flex_flow="row wrap", align_items="center"))
        body = widgets.HTML(value=body_html(f), layout=widgets.Layout(width="auto"))
        row = widgets.VBox([head, body], layout=widgets.Layout(
            width="auto", margin="0 0 6px 0", padding="0 0 4px 0",
            border_bottom="1px solid var(--jp-border-color2, #ddd)"))
        row.add_class("diagkit-finding")
        return row


def _heading(findings) -> str:
    n = len(findings)
    if not n:
        return _TEXT.format("<b>No findings</b>: every tensor is ok.")
    more = (f" (the first {MOST_FINDINGS} here; <code>print(diagnosis)</code> lists all)"
            if n > MOST_FINDINGS else "")
    return _CODE_STYLE + _TEXT.format(f"<b>{n} finding{'s' * (n != 1)}</b>, worst first{more}:")


def _when(f) -> list[str]:
    """When a whole-run watch saw it hold: 'from step 3', 'steps 3 to 9 (ended)'."""
    if f.since is None:
        return []
    if f.ended is not None:
        return [f"steps {f.since} to {f.until} (ended at step {f.ended})"]
    return [f"from step {f.since}"]


def _whole(text: str) -> str:
    """Text that never wraps inside (a number and its unit stay together)."""
    return f"<span style='white-space:nowrap'>{html.escape(text)}</span>"
