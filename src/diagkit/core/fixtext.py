"""The form of a finding's fix (`Finding.fix`): words and code on lines of their own.

A fix is one or more alternatives. Each is a line of words that ends with a colon, then the
code to paste, indented by four spaces (README, "Reading a finding"):

    Add it to an optimizer:
        optimizer.add_param_group({"params": [model.head.weight]})
    Or, if it should stay fixed, freeze it:
        for p in [model.head.weight]: p.requires_grad_(False)

A fix with nothing to paste is words only. A terminal prints the text as it is; the HTML views
show each code block as code with a copy button, apart from the words (`parts`). A fix saved by
an older diagkit (one line of words with code inside) reads as words.
"""

from __future__ import annotations

INDENT = "    "


def compose(*alternatives: tuple[str, str | None]) -> str:
    """The fix's text from (words, code) pairs, in order of preference; code may be None
    (words only) or hold several lines."""
    lines = []
    for words, code in alternatives:
        lines.append(words)
        if code:
            lines += [INDENT + c for c in code.splitlines()]
    return "\n".join(lines)


def parts(fix: str) -> list[tuple[str, str]]:
    """[("words", text) | ("code", block)], in order: consecutive indented lines are one block,
    dedented; blank lines are dropped."""
    out: list[tuple[str, str]] = []
    for line in (fix or "").splitlines():
        if not line.strip():
            continue
        kind = "code" if line.startswith(INDENT) else "words"
        text = line[len(INDENT):] if kind == "code" else line.strip()
        if out and out[-1][0] == kind == "code":
            out[-1] = ("code", out[-1][1] + "\n" + text)
        else:
            out.append((kind, text))
    return out


def first_code(fix: str) -> str:
    """The preferred alternative's code ('' when the fix has none): what a user pastes."""
    return next((text for kind, text in parts(fix) if kind == "code"), "")


def first_line(fix: str) -> str:
    """One line that stands for the fix in a log line or a chip: the first code line, else
    the first words."""
    code = first_code(fix)
    if code:
        return code.splitlines()[0]
    return next((text for _, text in parts(fix)), "")
