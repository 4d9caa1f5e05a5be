"""A finding's source lines are user code: escaped in HTML (report and notebook), as they are
in the terminal."""

from __future__ import annotations

import re

from diagkit.core.result import Finding
from diagkit.present.sections import findings_table
from diagkit.present.source import source_html, source_text

SOURCE = ({"optimizer": 0, "group": 1, "class": "AdamW", "file": "/x/<evil>&co.py", "line": 7,
           "lines": ['params = [p for n, p in named if "<script>alert(1)</script>" not in n',
                     'opt = AdamW(params) & more'], "how": "assigned"},)


def _finding(source=SOURCE):
    return Finding("orphan", "error", ("w",), "`w` is held by no group", "add it",
                   module="w", count=1, bytes=4, source=source)


def test_source_lines_are_escaped_in_the_findings_table():
    page = findings_table([_finding()])
    assert "<script>" not in page and "<evil>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "AdamW(params) &amp; more" in page
    assert "/x/&lt;evil&gt;&amp;co.py:7" in re.sub(r"<[^>]*>", "", page)  # the path's text


def test_source_html_and_text_show_every_line():
    assert source_html(()) == ""
    text = source_text(SOURCE, "  ")
    assert text[0] == "  optimizer 0 group 1 (AdamW), its tensors listed at /x/<evil>&co.py:7:"
    assert text[1:] == [f"    | {line}" for line in SOURCE[0]["lines"]]


def test_a_finding_without_source_shows_none():
    assert "diagkit-source" not in findings_table([_finding(source=())])
    assert "diagkit-source" in findings_table([_finding()])


def test_finding_round_trips_its_source_and_reads_one_without():
    f = _finding()
    assert Finding.from_dict(f.to_dict()) == f
    old = {k: v for k, v in f.to_dict().items() if k != "source"}
    assert Finding.from_dict(old).source == ()
    hash(f)  # a source (dicts) does not make a finding unhashable
