"""The findings on top of the explorer (docs/workbook.md, "The explorer"): each finding's
severity, verdict, where, its message and its fix, and a button that picks its tensors.

The fix is shown in its form (`core.fixtext`): the words as text, the code to paste as code
on lines of its own, wrapped inside the output area's width, never cut and never in a box to
scroll sideways. Picking a finding (`pick`) plots its tensors and sets the filters to them, so
that the picker and the table show them too. Presents only; never measures.
"""

from __future__ import annotations

import html
import re

import ipywidgets as widgets

from ..core import fixtext
from ..core.format import dotted_breaks, human_bytes
from .sections import severity_chip
from .source import source_html

MOST_FINDINGS = 12   # findings listed; the rest are counted (print(diagnosis) lists them all)

# Code wraps at the box's edge (`pre-wrap`: between words, after a dot between two names,
# inside a name only when one is wider than the box; JupyterLab's own `word-break:break-all`
# for an output's <pre> broke names anywhere): copied, it is the code as written. The theme's
# own colours where JupyterLab sets them.
CODE_STYLE = ("white-space:pre-wrap;word-break:normal;overflow-wrap:anywhere;margin:2px 0 4px 0;"
              "padding:4px 8px;border-radius:3px;font-size:12px;line-height:1.4;"
              "font-family:var(--jp-code-font-family,monospace);"
              "background:var(--jp-layout-color2,#f3f3f3);"
              "color:var(--jp-content-font-color1,#111)")
# Text in an ipywidgets HTML box has the controls' line height (28 px): prose reads closer.
_TEXT = "<div style='line-height:1.45'>{}</div>"
# In code, a break may come after a dot between two names (never inside a number).
_NAME_DOT = re.compile(r"(?<=[\w\])])\.(?=[A-Za-z_])")
# A finding's building lines (`present.source`) wrap as the fix does, in this box only.
_SOURCE_STYLE = ("<style>.diagkit-explorer-findings .diagkit-source pre{white-space:pre-wrap"
                 " !important;word-break:normal;overflow-wrap:anywhere;"
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
    """The message, then the fix (words as text, code as code), then where its optimizer's
    groups were built (folded: the fix comes first)."""
    out = [f"<div class='diagkit-finding-message'>{_quoted_code(f.message)}</div>",
           fix_html(f.fix)]
    source = source_html(getattr(f, "source", ()))
    if source:
        out.append("<details class='diagkit-finding-source'><summary>where its optimizer "
                   f"groups were built</summary>{_SOURCE_STYLE}{source}</details>")
    return _TEXT.format("".join(out))


def fix_html(fix: str) -> str:
    """A fix in its form: 'fix:' and each part, words as text, code in its own block."""
    parts = fixtext.parts(fix)
    if not parts:
        return ""
    out = ["<div class='diagkit-fix'><b>fix:</b>"]
    for kind, text in parts:
        if kind == "code":
            code = _NAME_DOT.sub(".<wbr>", html.escape(text))
            out.append(f"<pre class='diagkit-fix-code' style='{CODE_STYLE}'>{code}</pre>")
        else:
            out.append(f"<div class='diagkit-fix-words'>{html.escape(text)}</div>")
    return "".join(out) + "</div>"


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
    return _TEXT.format(f"<b>{n} finding{'s' * (n != 1)}</b>, worst first{more}:")


def _when(f) -> list[str]:
    """When a whole-run watch saw it hold: 'from step 3', 'steps 3 to 9 (ended)'."""
    if f.since is None:
        return []
    if f.ended is not None:
        return [f"steps {f.since} to {f.until} (ended at step {f.ended})"]
    return [f"from step {f.since}"]


def _quoted_code(text: str) -> str:
    """Words, escaped, with what they quote in `backticks` shown as code (a name in a
    message wraps at its dots only)."""
    pieces = html.escape(text).split("`")
    if len(pieces) % 2 == 0:   # an odd number of backticks: not quotes, left as written
        return html.escape(text)
    return "".join(f"<code>{dotted_breaks(p)}</code>" if i % 2 else p
                   for i, p in enumerate(pieces))


def _whole(text: str) -> str:
    """Text that never wraps inside (a number and its unit stay together)."""
    return f"<span style='white-space:nowrap'>{html.escape(text)}</span>"
