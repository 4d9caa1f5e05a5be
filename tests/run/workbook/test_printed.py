"""What a target prints while the notebook runs it is kept, shown last and folded, never above
the verdict banner; streams it captured write through once the run is over."""

from __future__ import annotations

import io
import logging
import sys

from diagkit.present.sections import printed_html
from diagkit.run.workbook.printed import collected
from diagkit.run.workbook.report import write_report

CHATTY = '''
import logging, sys
import torch
from torch import nn

def build():
    print("Seed set to 0", file=sys.stderr)
    log = logging.getLogger("chatty.framework")
    log.addHandler(logging.StreamHandler())  # bound to sys.stderr as it is now
    log.warning("GPU available: False")
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                batch_fn=lambda i: torch.ones(4, 3), loss_fn=lambda m, b: m(b).pow(2).mean())
'''


def test_collected_then_written_through(monkeypatch):
    real = io.StringIO()
    monkeypatch.setattr(sys, "stderr", real)
    log = logging.getLogger("diagkit.test.printed")
    with collected() as printed:
        print("during", file=sys.stderr)
        handler = logging.StreamHandler()  # made inside: holds the stand-in
        log.addHandler(handler)
    try:
        log.warning("after")
    finally:
        log.removeHandler(handler)
    assert printed.getvalue() == "during\n"
    assert real.getvalue() == "after\n"  # not lost in the buffer


def test_printed_html_folds_and_escapes():
    assert printed_html("") == ""
    out = printed_html("a <b>\n" * 300, most=200)
    assert out.startswith('<details class="diagkit-printed">') and "&lt;b&gt;" in out
    assert "300 lines (the last 200 of 300)" in out and out.count("a &lt;b&gt;") == 200


def test_the_report_shows_printed_lines_last_and_folded(tmp_path):
    (tmp_path / "chatty.py").write_text(CHATTY)
    result = write_report(tmp_path / "rep", {"chatty": {
        "target": f"{tmp_path / 'chatty.py'}:build", "steps": 2}}, title="chatty")
    assert result.error is None
    page = result.html.read_text(encoding="utf-8")
    banner, folded = page.index("diagkit-banner"), page.index('<details class="diagkit-printed">')
    assert banner < folded
    assert page.count("Seed set to 0") == 1 and page.index("Seed set to 0") > folded
    assert page.index("GPU available: False") > folded
