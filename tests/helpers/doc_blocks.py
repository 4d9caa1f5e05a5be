"""The README's and the docs' pages as the tests read them: their fenced code blocks (with the
marker above each Python block), their sections and their headings' ids.

Every Python block carries, on the line above it, `<!-- runs: tests/FILE.py -->` (that test reads
the block from this page and runs it) or `<!-- not run: REASON -->` (docs/development.md,
"The docs"); tests/test_docs.py holds every page to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"^<!-- (?P<kind>runs|not run): (?P<what>.*?) -->$")
HEADING = re.compile(r"^(?P<level>#{1,6}) (?P<title>.+?)\s*$")


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def rel(page: Path) -> str:
    return page.resolve().relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Block:
    page: str        # relative to the repository: "README.md", "docs/watch.md"
    line: int        # of the opening fence, 1-based
    lang: str        # "python", "bash", "text", "" (none)
    body: str
    kind: str | None  # "runs", "not run", or None: no marker above the block
    what: str        # the test file (runs) or the reason (not run)


def blocks(page: Path, lang: str | None = None, section: str | None = None) -> list[Block]:
    """The page's fenced blocks (of one language), in order; within one section if given."""
    text = page.read_text()
    start, end = section_span(text, section) if section else (0, len(text))
    found = []
    for m in FENCE.finditer(text):
        if not start <= m.start() < end or (lang is not None and m["lang"] != lang):
            continue
        line = text.count("\n", 0, m.start()) + 1
        above = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARKER.match(above)
        found.append(Block(rel(page), line, m["lang"], m["body"],
                           mark["kind"] if mark else None, mark["what"].strip() if mark else ""))
    return found


def snippet(page: Path, marker: str, section: str | None = None) -> str:
    """The first Python block of the page (or section) that contains `marker`."""
    return next(b.body for b in blocks(page, "python", section) if marker in b.body)


def prose(text: str) -> str:
    """The text with its fenced blocks blanked out (every offset and line number kept)."""
    return FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def headings(text: str) -> list[tuple[int, str, int]]:
    """(level, title, offset) of every Markdown heading outside fenced blocks."""
    body = prose(text)
    found, offset = [], 0
    for line in body.split("\n"):
        m = HEADING.match(line)
        if m:
            found.append((len(m["level"]), m["title"], offset))
        offset += len(line) + 1
    return found


def section_span(text: str, heading: str) -> tuple[int, int]:
    """Where the section whose heading line is `heading` ("## Title") starts and ends: at the
    next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    title = heading.lstrip("#").strip()
    marks = headings(text)
    for i, (lvl, t, at) in enumerate(marks):
        if lvl == level and t == title:
            end = next((a for lv, _, a in marks[i + 1:] if lv <= level), len(text))
            return at, end
    raise KeyError(f"no heading {heading!r}")


def section(page: Path, heading: str) -> str:
    text = page.read_text()
    start, end = section_span(text, heading)
    return text[start:end]


def _plain(title: str) -> str:
    """A heading's text as rendered: no backticks, no emphasis, link texts only."""
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    return title.replace("`", "").replace("**", "").replace("*", "")


def github_id(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", _plain(title).strip().lower()).replace(" ", "-")


def mkdocs_id(title: str) -> str:
    """The anchor mkdocs gives a heading: Python-Markdown's own `toc` slugify."""
    from markdown.extensions.toc import slugify
    return slugify(_plain(title), "-")


def anchors(page: Path) -> set[str]:
    """The ids that both GitHub and mkdocs give the page's headings: a link to one works in the
    repository's view and in the built docs alike."""
    return {github_id(t) for _, t, _ in headings(page.read_text())
            if github_id(t) == mkdocs_id(t)}
