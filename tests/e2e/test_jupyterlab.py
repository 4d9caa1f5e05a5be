"""The notebook's explorer in a real JupyterLab, driven in a real headless Chromium over CDP.

A private `jupyter lab` (loopback, a token, temporary notebook, config, data and runtime
folders: nothing of the user's is read or written) opens a copy of notebooks/diagnose.ipynb
and runs it on its defaults. Then every explorer control is changed as a user would (clicks,
typing, Enter), and after each change: the plot and the table redrew, every control is inside
the explorer, fully visible and on top where it would be clicked, and the browser logged no
error. Screenshots of each state go to the test's tmp folder.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from browser import SPLIT_PIECES, chromium
from cdp import Browser
from jupyter import (CELL_ERRORS, EXPLORER_SHOWN, KERNEL_IDLE, NOTEBOOK_PANEL, RUN_ALL, SAVE,
                     SNAPSHOT, JupyterLab, Page)

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed "
                                "(Debian: apt-get install chromium); this test drives it")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "diagnose.ipynb"
MEM = "module.metamodel.model.mem_tokens"


# ---------------------------------------------------------------------- the test
def test_explorer_in_jupyterlab(tmp_path):
    """Open and run the notebook on its defaults (the meta_memory demo), change every control,
    reload the page and change one again; nothing may be hidden, cut, covered or logged."""
    notebooks, home, shots = (tmp_path / d for d in ("notebooks", "jupyter", "screenshots"))
    for folder in (notebooks, home, shots):
        folder.mkdir()
    shutil.copy(NOTEBOOK, notebooks / NOTEBOOK.name)
    with JupyterLab(notebooks, home) as lab, Browser(1400, 900) as browser:
        page = Page(browser, shots)
        browser.goto(lab.url(f"lab/tree/{NOTEBOOK.name}"))
        browser.wait_for(KERNEL_IDLE, timeout=180, what="the notebook opens, its kernel idle")
        browser.evaluate(RUN_ALL, timeout=60)
        browser.wait_for(EXPLORER_SHOWN, timeout=300, what="the explorer shows its plot")
        browser.wait_for(KERNEL_IDLE, timeout=120, what="every cell ran")
        assert browser.evaluate(CELL_ERRORS) == []
        page.check("opened")
        assert "20 of 20 tensors match" in browser.evaluate(SNAPSHOT)["status"]
        # the findings, wiring and explorer tables at 1400 px: no number or identifier split
        assert browser.evaluate(f"{SPLIT_PIECES}(document.querySelector('.jp-Notebook'))") \
            == []

        page.change("verdict-orphan", lambda: page.pick("verdicts", "orphan ("), "1 of 20")
        page.change("verdict-all", lambda: page.pick("verdicts", "orphan (", ctrl=True),
                    "20 of 20")
        page.change("module-prefix", lambda: page.type_into("module", "module.hypernet"),
                    "4 of 20")
        page.change("module-cleared", lambda: page.type_into("module", ""), "20 of 20")
        page.change("name-regex", lambda: page.type_into("regex", r"lm_head\.", enter=True),
                    "2 of 20")
        page.change("name-cleared", lambda: page.type_into("regex", "", enter=True),
                    "20 of 20")
        # a native drop-down opens a popup: keys choose in it (grad_norm -> delta_norm, where
        # the orphan's zeros sit on the log axis' floor: see the screenshot)
        page.change("metric", lambda: (browser.click(*page.centre(page.control("metric"))),
                                       browser.press("ArrowDown"), browser.press("ArrowDown"),
                                       browser.press("Enter")))
        assert ">delta_norm</th>" in browser.evaluate(SNAPSHOT)["table"]
        # the scale changes the plot only: the table shows no scale, so it stays as it is
        page.change("log-scale", lambda: browser.click(*page.centre(page.control("log"))),
                    table=False)
        assert browser.evaluate(f"{page.control('log')}.checked") is False
        page.change("tensor-one", lambda: page.pick("tensors", "module.lm_head.bias"))
        assert page.picked() == ["module.lm_head.bias"]
        page.change("tensor-two", lambda: page.pick("tensors", MEM, ctrl=True))
        assert page.picked() == [MEM, "module.lm_head.bias"]
        assert "<b>module.<wbr>lm_head.<wbr>bias</b>" in browser.evaluate(SNAPSHOT)["table"]

        assert browser.evaluate(SAVE, timeout=60)
        browser.evaluate("window.diagkitOldPage = true")
        browser.reload()
        browser.wait_for(f"!window.diagkitOldPage && {EXPLORER_SHOWN}", timeout=180,
                         what="the explorer is back after the reload")
        browser.wait_for(KERNEL_IDLE, timeout=120, what="the kernel is idle after reload")
        page.check("reloaded")
        page.change("reloaded-module", lambda: page.type_into("module", "module.lm_head"),
                    "2 of 20")
        page.change("reloaded-verdict", lambda: page.pick("verdicts", "orphan ("), "0 of 20")
    assert page.problems == [], "\n".join(page.problems)


def test_a_copied_notebook_opens_unmodified(tmp_path):
    """`diagkit notebooks DIR` copies: opened in JupyterLab (its kernel started, nothing run),
    the notebook is not marked modified; JupyterLab wrote the kernel's language_info into the
    shipped notebook as it opened it, so it showed as modified at once."""
    from diagkit.run.shipped_notebooks import copy_notebooks
    notebooks, home = tmp_path / "notebooks", tmp_path / "jupyter"
    home.mkdir()
    copy_notebooks(notebooks)
    with JupyterLab(notebooks, home) as lab, Browser(1280, 900) as browser:
        for name in ("diagnose.ipynb", "compare_checkpoints.ipynb"):
            browser.goto(lab.url(f"lab/tree/{name}"))
            browser.wait_for(KERNEL_IDLE, timeout=180, what=f"{name} opens, its kernel idle")
            deadline = time.monotonic() + 3  # the kernel's info arrives just after it is idle
            while time.monotonic() < deadline:
                assert browser.evaluate(f"{NOTEBOOK_PANEL}.model.dirty") is False, name
                time.sleep(0.3)
            browser.evaluate("window.jupyterapp.commands.execute('application:close-all')")
