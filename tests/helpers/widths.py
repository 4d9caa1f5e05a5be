"""What the width tests measure in a laid-out page (the report in Chromium, the notebook in
JupyterLab): code that cannot be read without a sideways scroll, and numbers split from
their units. Each is a JavaScript function of a root element returning a list of problems."""

from browser import split_text_js

# Code (a <pre> or <code>, or a box holding code) wider than the box it is shown in: it is cut
# off, or readable only by scrolling sideways (issue 37: 106 px scroll boxes holding 240-600
# px of code); inline code running past the edge of its cell or paragraph; a table cell whose
# text runs out of it (a column too narrow for its words). Elements not laid out
# (display:none, a closed <details>) have no width: skipped.
CLIPPED_CODE = r"""((root) => {
  const out = [];
  const seen = new Set();
  for (const td of root.querySelectorAll('td')) {
    if (td.clientWidth && td.scrollWidth > td.clientWidth + 1)
      out.push(`td: ${td.clientWidth} px holding ${td.scrollWidth} px: `
               + td.textContent.slice(0, 60));
  }
  for (const code of root.querySelectorAll('code')) {
    const box = code.parentElement.closest('td, th, p, li, div, pre');
    const r = code.getBoundingClientRect(), b = box && box.getBoundingClientRect();
    if (b && r.width && b.width && r.right > b.right + 1)
      out.push(`code past the edge of its ${box.tagName.toLowerCase()} by `
               + `${Math.round(r.right - b.right)} px: ${code.textContent.slice(0, 60)}`);
  }
  for (const el of root.querySelectorAll('pre, code')) {
    for (let box = el; box && box !== root.parentElement; box = box.parentElement) {
      if (seen.has(box) || box.clientWidth === 0) continue;
      const cs = getComputedStyle(box);
      const clips = box === el || /auto|scroll|hidden|clip/.test(cs.overflowX);
      if (clips && box.scrollWidth > box.clientWidth + 1) {
        seen.add(box);
        out.push(`${box.tagName.toLowerCase()}.${box.className}: ${box.clientWidth} px `
                 + `showing ${box.scrollWidth} px: ${el.textContent.slice(0, 60)}`);
      }
      if (box.tagName === 'TD' || box.classList.contains('jp-OutputArea-output')) break;
    }
  }
  return out;
})"""

# A number and its unit ('8.0 KiB', '3 steps', '2 tensors') on two lines.
SPLIT_UNITS = split_text_js(None, "pre, script, style",
                            r"/\d[\d.,]*[ \u00a0](?:B|KiB|MiB|GiB|tensors?|steps?)\b/g")
