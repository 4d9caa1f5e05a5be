"""How text reads in the HTML views (the notebook, the report, a `Diagnosis` in JupyterLab):
prose that quotes `code`, numbers that keep their units, and a finding's fix as words and code
blocks (`diagkit.core.fixtext`).

Everything here escapes what it is given: names and source lines are user data.
"""

from __future__ import annotations

import html
import re

from ..core import fixtext

NBSP = "\u00a0"

# A number and its unit, and a step and its number: one non-breaking space between them, so a
# narrow cell never puts "8.0" at the end of one line and "KiB" at the start of the next.
_UNIT = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|tensors?|steps?|ranks?|ms)\b")
_STEP = re.compile(r"\b(steps?|ranks?) (\d)")
_BACKTICKS = re.compile(r"`([^`]+)`")
# In code, a line may break after a dot between two names (never inside a number or a name).
_NAME_DOT = re.compile(r"(?<=[\w\])])\.(?=[A-Za-z_])")


def keep_units(text: str) -> str:
    """'8.0 KiB' -> '8.0\u00a0KiB', '3 steps' and 'step 3' likewise; anything else as it is.
    Safe on escaped HTML (it only touches a space between a digit and a word)."""
    return _STEP.sub(rf"\1{NBSP}\2", _UNIT.sub(rf"\1{NBSP}\2", str(text)))


def prose(text: str) -> str:
    """Escape, keep units with their numbers, and show `quoted names` as code."""
    return _BACKTICKS.sub(r"<code>\1</code>", keep_units(html.escape(str(text))))


# Code wraps inside its own box at any width (never a sideways scroll bar: issue 37's 106 px
# boxes holding 600 px of code): between words, after a dot between two names, inside a name
# only when one is wider than the box (JupyterLab's own `word-break:break-all` for an output's
# <pre> broke names anywhere). A copied block is the text as written, whatever the wrapping.
CODE_STYLE = ("margin:2px 0 6px;padding:4px 6px;white-space:pre-wrap;word-break:normal;"
              "overflow-wrap:anywhere;"
              "background:var(--jp-layout-color2, #f3f3f3);border-radius:3px;"
              "font-family:var(--jp-code-font-family, monospace);font-size:0.95em")

# A copy button works where the page runs script (JupyterLab, a notebook's own HTML); the
# offline report forbids script, so it gets none (`copy=False`). Without a clipboard (a page
# served over plain http from another host) the code is selected for Ctrl+C instead.
_COPY = ("const p=this.previousElementSibling;const t=p.textContent;"
         "(navigator.clipboard ? navigator.clipboard.writeText(t) : Promise.reject())"
         ".then(()=>{this.textContent='copied'},"
         "()=>{getSelection().selectAllChildren(p);this.textContent='selected: Ctrl+C'})")


def code_block(code: str, copy: bool = False, kind: str = "diagkit-code") -> str:
    """One block of code to paste: a <pre> that wraps, with a copy button beside it. `kind`:
    its classes (a fix's code also carries `diagkit-fix-code`)."""
    body = _NAME_DOT.sub(".<wbr>", html.escape(code))
    if not copy:
        return f'<pre class="{kind}" style="{CODE_STYLE}">{body}</pre>'
    return (f'<div class="diagkit-code-row" style="display:flex;align-items:flex-start;gap:6px">'
            f'<pre class="{kind}" style="flex:1;min-width:0;{CODE_STYLE}">{body}</pre>'
            f'<button type="button" class="diagkit-copy" title="copy this code" '
            f'style="flex:none;margin-top:2px" onclick="{_COPY}">copy</button></div>')


def fix_html(fix: str, copy: bool = False) -> str:
    """A fix as it reads (`fixtext.parts`): each line of words as prose, each block of code
    as a wrapping <pre> of classes `diagkit-code diagkit-fix-code` (with a copy button when
    `copy`). An older save's one-line fix, or a comparison's fix that quotes `code`, is
    words."""
    out = []
    for kind, text in fixtext.parts(fix):
        if kind == "code":
            out.append(code_block(text, copy, kind="diagkit-code diagkit-fix-code"))
        else:
            out.append(f'<p class="diagkit-fix-words" style="margin:2px 0">{prose(text)}</p>')
    return "".join(out)
