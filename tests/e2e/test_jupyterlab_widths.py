"""The findings and their fixes, readable at every width in real JupyterLab, light and dark.

One private JupyterLab (tests/helpers/jupyter.py), one Chromium page (tests/helpers/cdp.py):
the shipped notebook runs on its defaults, with one cell added at its end that shows `diag`
itself (the `Diagnosis` HTML repr a user gets from `diag` in a cell). Then, in the light and the dark
theme, at a 968 px and a 1400 px window: no code is cut or needs a sideways scroll (issue 37:
`optimizer.add_par…` in the repr and in the notebook's findings table), no number is split
from its unit, the fix's words and code read against their background, and each block of code
has a copy button that copies it. Screenshots of each state go to the test's tmp folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from browser import chromium
from cdp import Browser
from jupyter import CELL_ERRORS, KERNEL_IDLE, RUN_ALL, JupyterLab
from widths import CLIPPED_CODE, SPLIT_UNITS

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed "
                                "(Debian: apt-get install chromium); this test drives it")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "diagnose.ipynb"
REPR_CELL = "diag  # the Diagnosis's own HTML repr"

# The outputs of diagkit's cells (the explorer widget is the explorer's tests' to measure).
OUTPUTS = """[...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
  .filter(o => !o.querySelector('.diagkit-explorer'))"""
REPR = """[...document.querySelectorAll('.jp-Notebook .jp-Cell')].filter(c =>
  (c.querySelector('.jp-InputArea') || {}).textContent.includes('HTML repr')).map(c =>
  c.querySelector('.jp-OutputArea-output .diagkit'))[0]"""

# Every output scrolled into view (JupyterLab lays out only what is near the view), then
# measured; the text of each fix against its background (WCAG contrast, 4.5 for text).
MEASURE = """(() => {
  const clipped = """ + CLIPPED_CODE + """;
  const units = """ + SPLIT_UNITS + """;
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = c => { const [r, g, b] = c.slice(0, 3).map(v => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const background = el => { for (; el; el = el.parentElement) {
      const c = rgb(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c; }
    return rgb(getComputedStyle(document.body).backgroundColor); };
  const out = {clipped: [], units: [], contrast: [], fixes: 0, copies: 0};
  for (const o of """ + OUTPUTS + """) {
    o.scrollIntoView({block: 'start'});
    out.clipped.push(...clipped(o));
    out.units.push(...units(o));
    for (const el of o.querySelectorAll('.diagkit-fix pre, .diagkit-fix-words')) {
      const [a, b] = [lum(rgb(getComputedStyle(el).color)), lum(background(el))];
      const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
      if (ratio < 4.5) out.contrast.push(`${ratio.toFixed(2)}: ${el.textContent.slice(0, 40)}`);
    }
    out.fixes += o.querySelectorAll('.diagkit-fix pre.diagkit-code').length;
    out.copies += o.querySelectorAll('.diagkit-fix button.diagkit-copy').length;
  }
  out.output = Math.round(Math.max(...""" + OUTPUTS + """.map(o => o.clientWidth)));
  return out;
})()"""


def notebook_with_repr(folder: Path) -> Path:
    """The shipped notebook, with one cell more at its end that shows `diag` itself."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = nbformat.v4.new_code_cell(REPR_CELL)
    cell.id = "diag-repr"
    nb.cells.append(cell)
    path = folder / NOTEBOOK.name
    nbformat.write(nb, path)
    return path


def test_findings_and_fixes_are_readable_at_every_width_in_both_themes(tmp_path):
    notebooks, home, shots = (tmp_path / d for d in ("notebooks", "jupyter", "screenshots"))
    for folder in (notebooks, home, shots):
        folder.mkdir()
    path = notebook_with_repr(notebooks)
    problems = []
    with JupyterLab(notebooks, home) as lab, Browser(1400, 900) as browser:
        browser.goto(lab.url(f"lab/tree/{path.name}"))
        browser.wait_for(KERNEL_IDLE, timeout=180, what="the notebook opens, its kernel idle")
        browser.evaluate(RUN_ALL, timeout=60)
        browser.wait_for(f"!!({REPR})", timeout=300, what="the last cell shows the diagnosis")
        browser.wait_for(KERNEL_IDLE, timeout=120, what="every cell ran")
        assert browser.evaluate(CELL_ERRORS) == []
        for theme in ("JupyterLab Light", "JupyterLab Dark"):
            light = theme.endswith("Light")
            browser.evaluate(f"window.jupyterapp.commands.execute('apputils:change-theme', "
                             f"{{theme: {json.dumps(theme)}}}).then(() => true)")
            browser.wait_for(f"document.body.dataset.jpThemeLight === '{str(light).lower()}'",
                             timeout=60, what=f"the {theme} theme")
            for width in (968, 1400):
                browser.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                             deviceScaleFactor=1, mobile=False)
                browser.wait_for(f"window.innerWidth === {width} && document.querySelector("
                                 f"'.jp-Notebook').getBoundingClientRect().right <= {width}",
                                 timeout=30, what=f"the page at {width} px")
                browser.pump(1.0)  # the lumino layout follows the resize
                found = browser.evaluate(MEASURE)
                state = f"{theme}, {width} px (outputs {found['output']} px wide)"
                problems += [f"{state}: cut: {c}" for c in found["clipped"]]
                problems += [f"{state}: unit split: {u}" for u in found["units"]]
                problems += [f"{state}: contrast {c}" for c in found["contrast"]]
                # the findings cell and the repr: each fix's code in blocks, each copyable
                if found["fixes"] < 4 or found["copies"] != found["fixes"]:
                    problems.append(f"{state}: {found['fixes']} code blocks, "
                                    f"{found['copies']} copy buttons")
                for name, js in (("findings", "document.querySelector("
                                  "'.jp-OutputArea-output table.diagkit-findings')"),
                                 ("repr", REPR)):
                    browser.evaluate(f"({js}).scrollIntoView({{block: 'start'}})")
                    browser.screenshot(shots / f"{theme.split()[1].lower()}-{width}-{name}.png")
        copied = copy_first_block(browser)
        assert copied["clipboard"] == copied["code"] != "", copied
    assert problems == [], "\n".join(problems)


def copy_first_block(browser) -> dict:
    """Click the repr's first copy button as a user would; what the clipboard then holds."""
    browser.send("Browser.grantPermissions", permissions=["clipboardReadWrite",
                                                          "clipboardSanitizedWrite"])
    button = f"({REPR}).querySelector('.diagkit-fix button.diagkit-copy')"
    x, y = browser.evaluate(f"""(() => {{ const b = {button};
        b.scrollIntoView({{block: 'center'}}); const r = b.getBoundingClientRect();
        return [(r.left + r.right) / 2, (r.top + r.bottom) / 2]; }})()""")
    browser.click(x, y)
    browser.wait_for(f"{button}.textContent !== 'copy'", timeout=10, what="the button answers")
    return browser.evaluate(f"""navigator.clipboard.readText().then(t => ({{clipboard: t,
        code: {button}.previousElementSibling.textContent, said: {button}.textContent}}))""")
