"""Where a group was built is a path, and a path in a narrow table wraps only after a '/':
a clone in `/tmp/my-clone-of-diagkit/` was cut at a hyphen in the notebook's findings table
(the JupyterLab test's check that no identifier is split failed on such a clone only)."""

from __future__ import annotations

import pytest

from browser import SPLIT_PIECES, chromium
from diagkit.core.result import Finding
from diagkit.present.sections import findings_table

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed")

PATH = "/tmp/my-clone-of-diagkit/src/some-package/the-training-script.py"
SOURCE = ({"optimizer": 0, "group": 0, "class": "AdamW", "file": PATH, "line": 103,
           "lines": ["opt = AdamW(model.parameters())"], "how": "call"},)


@pytest.mark.parametrize("width", [260, 420])
def test_a_path_in_a_narrow_findings_table_wraps_only_after_a_slash(tmp_path, width):
    from cdp import Browser
    finding = Finding("orphan", "error", ("w",), "`w` is held by no group", "add it",
                      module="w", count=1, bytes=4, source=SOURCE)
    page = tmp_path / "page.html"
    page.write_text(f"<html><body style='width:{width}px'>{findings_table([finding])}"
                    "</body></html>", encoding="utf-8")
    with Browser(width + 40, 600) as browser:
        browser.goto(page.as_uri())
        browser.wait_for("document.readyState === 'complete'", timeout=30)
        assert browser.evaluate(f"{SPLIT_PIECES}(document.body)") == []
        label = browser.evaluate("document.querySelector('.diagkit-source div').innerText")
        assert label.replace("\n", "").endswith(f"built at {PATH}:103")  # copies as the path
