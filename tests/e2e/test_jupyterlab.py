"""The notebook's explorer in a real JupyterLab, driven in a real headless Chromium over CDP.

A private `jupyter lab` (loopback, a token, temporary notebook, config, data and runtime
folders: nothing of the user's is read or written) opens a copy of notebooks/diagnose.ipynb
and runs it on its defaults. The explorer leads with the findings and their fixes; a
finding's button picks its tensors; keys typed in its lists stay there (the notebook's active
cell does not move, `b` inserts no cell). Then every explorer control is changed as a user
would (clicks, typing, Enter), and after each change: the plot and the table redrew, every
control is inside the explorer, fully visible and on top where it would be clicked, no code
and no table fact is cut, and the browser logged no error; at 1400 and 968 px, light and dark.
Screenshots of each state go to the test's tmp folder.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from browser import SPLIT_PIECES, chromium
from cdp import Browser
from jupyter import (CELL_ERRORS, EXPLORER_SHOWN, KERNEL_IDLE, NOTEBOOK_PANEL, NOTEBOOK_STATE,
                     RUN_ALL, SAVE, SNAPSHOT, JupyterLab, Page)

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed "
                                "(Debian: apt-get install chromium); this test drives it")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "diagnose.ipynb"
MEM = "module.metamodel.model.mem_tokens"
HYPER = "module.hypernet.0.weight"       # the option above module.hypernet.0.bias
FINDINGS = """(() => {
  const box = document.querySelector('.diagkit-explorer .diagkit-explorer-findings');
  return {text: box.textContent,
          code: Array.from(box.querySelectorAll('pre.diagkit-fix-code')).map(p => p.textContent),
          first: box.getBoundingClientRect().top <= document.querySelector(
                   '.diagkit-explorer-verdicts').getBoundingClientRect().top};
})()"""
PICK_FIRST = "document.querySelector('.diagkit-explorer .diagkit-finding-pick')"
ALT = "document.querySelector('.diagkit-explorer-plot img').alt"


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
        findings_lead(browser)
        the_fix_copies(browser, page)
        keys_stay_in_the_explorer(browser, page)
        page.change("finding-picked", lambda: browser.click(*page.centre(PICK_FIRST)),
                    "finding picked: orphan")
        assert page.picked() == [MEM] and "1 of 20 tensors match" in \
            browser.evaluate(SNAPSHOT)["status"]
        # the verdict filter off: the picked tensor still plotted, the note gone
        page.change("finding-filter-off", lambda: page.pick("verdicts", "orphan (", ctrl=True),
                    "20 of 20", plot=False)
        assert "finding picked" not in browser.evaluate(SNAPSHOT)["status"]
        page.change("finding-tensor-off", lambda: page.pick("tensors", MEM, ctrl=True),
                    "back to the default selection (1 problem tensor and 5 ok ones)")

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
        # 968 px: the file browser open, the output area about 520 px; then dark
        page.width(968)
        page.check("968")
        assert browser.evaluate(f"{SPLIT_PIECES}(document.querySelector('.diagkit-explorer'))") \
            == []
        page.change("968-verdict-off", lambda: page.pick("verdicts", "orphan (", ctrl=True),
                    "2 of 20")
        assert "lr 0.001" in browser.evaluate(SNAPSHOT)["table"]
        browser.evaluate("document.querySelector('.diagkit-explorer-table').scrollIntoView()")
        browser.screenshot(shots / "968-table.png")
        browser.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', "
                         "{theme: 'JupyterLab Dark'}).then(() => true)")
        browser.wait_for("document.body.dataset.jpThemeLight === 'false' "
                         "&& !document.querySelector('#jupyterlab-splash')", timeout=60,
                         what="the dark theme, its splash screen gone")
        page.check("968-dark")
        page.width(1400)
        page.check("1400-dark")
    assert page.problems == [], "\n".join(page.problems)


def findings_lead(browser) -> None:
    """The findings come first, each with its fix as code (the words apart), the orphan's
    first; the plot says in words what it draws."""
    shown = browser.evaluate(FINDINGS)
    assert shown["first"], "the findings are not above the filters"
    assert shown["text"].index("orphan") < shown["text"].index("grad_not_cleared")
    assert "fix:" in shown["text"] and "2 findings" in shown["text"]
    assert any(MEM.split("module.", 1)[1] in code for code in shown["code"]), shown["code"]
    assert browser.evaluate(ALT).startswith("Plot of grad_norm per step (log scale)")


def keys_stay_in_the_explorer(browser, page) -> None:
    """ArrowDown in the tensors and the verdicts lists moves their selection, and the
    notebook's active cell stays; `b` typed there inserts no cell (ipywidgets issue 3912:
    JupyterLab's shortcuts took both)."""
    page.change("key-pick", lambda: page.pick("tensors", HYPER))
    assert page.picked() == [HYPER]
    before = browser.evaluate(NOTEBOOK_STATE)
    options = browser.evaluate(f"Array.from({page.control('tensors')}.options)"
                               ".map(o => o.text.split('  [')[0])")
    page.key("b")       # the first key pressed in the list (no option starts with a b)
    browser.evaluate("new Promise(r => setTimeout(r, 1000)).then(() => true)")
    assert browser.evaluate(NOTEBOOK_STATE) == before, "a key typed in the explorer ran a " \
        "notebook command"
    page.change("key-arrow-down", lambda: browser.press("ArrowDown"))
    assert page.picked() == [options[options.index(HYPER) + 1]]
    assert browser.evaluate(NOTEBOOK_STATE) == before
    page.change("key-verdict-ok", lambda: page.pick("verdicts", "ok ("), "19 of 20",
                plot=False)    # the picked tensor is ok: still plotted
    page.change("key-arrow-up", lambda: browser.press("ArrowUp"), "1 of 20")
    assert browser.evaluate(f"Array.from({page.control('verdicts')}.selectedOptions)"
                            ".map(o => o.text.replace(/\u00a0/g, ' '))") \
        == ["grad_not_cleared (1)"]
    assert browser.evaluate(NOTEBOOK_STATE) == before
    page.change("key-verdicts-off", lambda: page.pick("verdicts", "grad_not_cleared (",
                                                      ctrl=True), "20 of 20")
    # the metric's list, focused from the keyboard (no popup): ArrowDown is its own too
    browser.evaluate(f"{page.control('metric')}.focus()")
    page.change("key-metric", lambda: browser.press("ArrowDown"))
    assert ">grad_total_norm</th>" in browser.evaluate(SNAPSHOT)["table"]
    page.change("key-metric-back", lambda: browser.press("ArrowUp"))
    assert browser.evaluate(NOTEBOOK_STATE) == before


def the_fix_copies(browser, page) -> None:
    """The first finding's first code block, copied by its button, is the code as written
    (its wrapping is the box's, not the code's)."""
    browser.send("Browser.grantPermissions", permissions=["clipboardReadWrite",
                                                         "clipboardSanitizedWrite"])
    button = "document.querySelector('.diagkit-explorer-findings .diagkit-copy')"
    code = browser.evaluate(f"{button}.previousElementSibling.textContent")
    browser.click(*page.centre(button))
    browser.wait_for(f"{button}.textContent === 'copied'", timeout=30, what="copied")
    assert browser.evaluate("navigator.clipboard.readText()") == code
    assert "mem_tokens" in code, code


def test_a_copied_notebook_opens_unmodified(tmp_path):
    """`diagkit notebooks DIR` copies: opened in JupyterLab (its kernel started, nothing run),
    the notebook is not marked modified; JupyterLab wrote the kernel's language_info into the
    shipped notebook as it opened it, so it showed as modified at once."""
    from diagkit.run.workbook.shipped_notebooks import copy_notebooks
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
