"""The live view in a real JupyterLab, driven in a real headless Chromium over CDP: a cell
trains a model under `diagkit.watch` (the block of docs/workbook.md), and while the cell runs
the panel's step count and its findings change in the page; at the end the panel is the
explorer, led by the findings and their fixes, every control visible, and the browser logged no
error. Then the user's part: the orphan's fix is copied from the explorer, pasted into a new
cell and run, and the same loop watched again comes out clean."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat
import pytest

from browser import chromium
from cdp import Browser
from doc_blocks import DOCS, snippet
from models import two_heads_cell
from jupyter import (CELL_ERRORS, KERNEL_IDLE, NOTEBOOK_PANEL, START_ALL, JupyterLab, Page,
                     wait)

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed "
                                "(Debian: apt-get install chromium); this test drives it")

# The training cell is the live view's block of docs/workbook.md, as a user would paste it.
TRAIN = snippet(DOCS / "workbook.md", "diagkit.watch(", section="## The live view")
STEPS = int(re.search(r"steps=(\d+)", TRAIN).group(1))
# The loader takes its time: the first batch 1.5 s (the panel as it starts: no step, no
# finding), then 0.25 s each, so that the panel updates several times while the cell runs.
SETUP = two_heads_cell(STEPS, wait="time.sleep(1.5 if i == 0 else 0.25)")
END = 'print("ended:", w.done, w.live.join(60))'
# The same loop again, on a fresh loader, once the pasted fix has run.
AGAIN = (f"loader = batches({STEPS} + 10)\n{TRAIN}\n"
         'print("again:", w.done, w.live.join(60), [f.code for f in w.diagnosis.findings])')

# Whether the training cell runs now: its prompt reads [*] from when it is queued until its
# reply (the kernel's busy/idle status also flips for the widgets' own messages meanwhile);
# the cell after it, which waits for the explorer, runs until "ended:" is printed.
TRAINING = f"""(() => {{ const w = {NOTEBOOK_PANEL};
  const cells = w ? w.content.widgets.slice(1) : [];
  return cells.some(c => c.promptNode && c.promptNode.textContent.includes('*')); }})()"""
OUTPUTS = ("Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
           ".map(e => e.textContent).join(' ')")
# The panel as the page shows it, and whether each of its parts is on screen and unclipped.
LIVE = """(() => {
  const panel = document.querySelector('.diagkit-live');
  if (!panel) return null;
  const text = (c) => { const e = panel.querySelector('.diagkit-live-' + c);
                        return e ? e.textContent : null; };
  const area = panel.closest('.jp-OutputArea-output').getBoundingClientRect();
  const hidden = [];
  for (const part of ['status', 'findings', 'plot']) {
    const e = panel.querySelector('.diagkit-live-' + part);
    if (!e) continue;
    const r = e.getBoundingClientRect();
    if (r.width < 8 || r.height < 8 || r.left < area.left - 0.5 || r.right > area.right + 0.5)
      hidden.push(`${part}: ${Math.round(r.width)}x${Math.round(r.height)} at ${r.left}`);
  }
  return {status: text('status'), findings: text('findings'), hidden: hidden,
          explorer: !!panel.querySelector('.diagkit-explorer .diagkit-explorer-plot')};
})()"""


# The explorer's findings, as the page shows them: each finding's text and its code blocks, and
# every code block that does not fit its box (a user would have to scroll sideways).
FINDINGS = """(() => {
  const ex = document.querySelector('.diagkit-explorer');
  if (!ex) return null;
  const rows = Array.from(ex.querySelectorAll('.diagkit-finding'));
  const clipped = Array.from(ex.querySelectorAll('.diagkit-fix-code'))
    .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().width < 40)
    .map(e => `${e.textContent.slice(0, 60)}: ${e.clientWidth} of ${e.scrollWidth} px`);
  return {rows: rows.map(r => ({text: r.textContent,
                                code: Array.from(r.querySelectorAll('.diagkit-fix-code'))
                                        .map(e => e.textContent)})),
          clipped: clipped};
})()"""
# A new cell below the last one, its editor focused: where the user pastes.
NEW_CELL = f"""(() => {{ const w = {NOTEBOOK_PANEL};
  w.content.activeCellIndex = w.content.widgets.length - 1;
  w.content.mode = 'command';
  return window.jupyterapp.commands.execute('notebook:insert-cell-below').then(() => {{
    w.content.activeCell.editor.focus(); return w.content.widgets.length; }}); }})()"""
RUN_ACTIVE = f"""(() => {{ const w = {NOTEBOOK_PANEL};
  return [w.content.activeCell.model.sharedModel.getSource(),
          window.jupyterapp.commands.execute('notebook:run-cell') && true]; }})()"""


def _paste_and_run(browser, text: str) -> str:
    """A new cell, `text` pasted into its editor (one input event, as a paste), then run; the
    cell's source as the editor holds it."""
    browser.evaluate(NEW_CELL)
    browser.type_text(text)
    source, _ = browser.evaluate(RUN_ACTIVE)
    return source


def _notebook(folder: Path) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (SETUP, TRAIN, END)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, folder / "live.ipynb")
    return "live.ipynb"


def _watch_running(browser, shots: Path, timeout: float = 240) -> list[dict]:
    """Every state of the panel seen while the training cell ran, until it ended."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = browser.evaluate(TRAINING)
        if not running and "ended:" in browser.evaluate(OUTPUTS):
            return seen
        state = browser.evaluate(LIVE) if running else None
        if state and (not seen or state != seen[-1]):
            seen.append(state)
            if "orphan" in (state["findings"] or "") and not (shots / "live.png").exists():
                browser.evaluate("document.querySelector('.diagkit-live').scrollIntoView()")
                browser.screenshot(shots / "live.png")
        time.sleep(0.2)
    browser.screenshot(shots / "timed-out.png")
    raise AssertionError(f"the cell did not end in {timeout} s; seen: {json.dumps(seen)[:2000]}")


def test_the_live_view_follows_a_training_cell_then_becomes_the_explorer(tmp_path):
    notebooks, home, shots = (tmp_path / d for d in ("notebooks", "jupyter", "screenshots"))
    for folder in (notebooks, home, shots):
        folder.mkdir()
    name = _notebook(notebooks)
    with JupyterLab(notebooks, home) as lab, Browser(1400, 900) as browser:
        page = Page(browser, shots)
        browser.goto(lab.url(f"lab/tree/{name}"))
        browser.wait_for(KERNEL_IDLE, timeout=180, what="the notebook opens, its kernel idle")
        browser.evaluate(START_ALL)
        seen = _watch_running(browser, shots)
        browser.screenshot(shots / "ended.png")

        counts = [int(m.group(1)) for s in seen
                  if (m := re.search(rf"(\d+) of {STEPS} steps observed", s["status"] or ""))]
        # the panel moves while the loop runs: at least 5 step counts short of the end
        assert len({c for c in counts if c < STEPS}) >= 5, f"the step count did not move: {seen}"
        assert counts == sorted(counts), counts
        findings = [s["findings"] for s in seen if s["findings"] is not None]
        first_orphan = next(i for i, f in enumerate(findings) if "orphan" in f)
        assert any("No findings so far" in f for f in findings[:first_orphan]), findings
        assert "head2" in findings[first_orphan]
        assert not any(s["explorer"] for s in seen[:first_orphan + 1])
        assert [h for s in seen for h in s["hidden"]] == []

        end = browser.evaluate(LIVE)
        assert end["explorer"], "the panel did not become the explorer"
        assert browser.evaluate(CELL_ERRORS) == []
        assert "ended: True True" in browser.evaluate(OUTPUTS)
        page.check("explorer")   # every control inside, visible, on top; no browser error
        assert "head2.weight" in browser.evaluate(
            "document.querySelector('.diagkit-explorer-table').textContent")

        # the explorer leads with the findings; the orphan's fix is code, whole at both widths
        for width in (968, 1400):
            browser.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                         deviceScaleFactor=1, mobile=False)
            browser.pump(0.5)
            found = browser.evaluate(FINDINGS)
            assert found["clipped"] == [], (width, found["clipped"])
        browser.screenshot(shots / "findings-1400.png")
        orphan = next(r for r in found["rows"] if "orphan" in r["text"])
        assert "head2" in orphan["text"] and orphan["code"], found

        # the user copies the fix into a new cell and runs it, then watches the loop again
        assert _paste_and_run(browser, orphan["code"][0]) == orphan["code"][0]
        browser.wait_for(KERNEL_IDLE, timeout=60, what="the pasted fix ran")
        _paste_and_run(browser, AGAIN)
        wait(lambda: "again:" in browser.evaluate(OUTPUTS), 240, "the second watch did not end",
             lab)
        browser.screenshot(shots / "again.png")
        assert browser.evaluate(CELL_ERRORS) == []
        assert "again: True True []" in browser.evaluate(OUTPUTS)
    assert page.problems == [], "\n".join(page.problems)
