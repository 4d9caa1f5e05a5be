"""Quantities as a person reads them. Here, below the judge, because findings' messages
use them as much as the tables do."""

from __future__ import annotations

import math


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def fmt_number(value) -> str:
    """Three significant digits; an em dash for NaN or anything that is not a number."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return "—"
    return "—" if math.isnan(x) else f"{x:.3g}"


def fmt_shape(shape) -> str:
    """(3, 4) -> '3×4'; () -> 'scalar'; None -> '—'."""
    if shape is None:
        return "—"
    return "×".join(map(str, shape)) if len(shape) else "scalar"


def truncate_left(text: str, width: int) -> str:
    """'…metamodel.model.mem_tokens': keep the end of a long name, where it differs."""
    text = str(text)
    return text if len(text) <= width else "…" + text[-(width - 1):]


def spans(values) -> str:
    """'0–2, 5' for 0, 1, 2, 5."""
    values = sorted(set(int(v) for v in values))
    parts, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}–{values[j]}")
        i = j + 1
    return ", ".join(parts)


def one_line(text) -> str:
    """Any text (an exception's, say) folded to one line."""
    return " ".join(str(text).split())


def brief(exc, limit: int = 200) -> str:
    """An error's text on one line, at most `limit` characters."""
    return one_line(exc)[:limit]


def dotted_breaks(escaped: str) -> str:
    """An HTML-escaped dotted name with a break opportunity after each dot: a long name wraps
    between its parts, never inside one (a table cell is never broken mid-identifier)."""
    return escaped.replace(".", ".<wbr>")


def place(file: str, line, cell: int | None = None) -> str:
    """Where a line is, in words: "cell [3], line 4" in a notebook cell (`cell`: its number,
    as `measure.origin.cells` recorded it), else "file.py:4" (the file's name only). Pure: a saved
    record reads the same anywhere."""
    if cell is not None:
        return f"cell [{cell}], line {line}"
    return f"{str(file).replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}"
