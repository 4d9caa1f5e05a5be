"""Keys typed in the explorer stay in the explorer, in JupyterLab 4 (docs/workbook.md, "The
explorer").

JupyterLab reads every key press before the page's own controls do (its shortcut manager
listens on the document in the capture phase), so an arrow key in the explorer's tensor list
moved the notebook to another cell and `b` inserted a cell: the open ipywidgets issue 3912.
JupyterLab skips its shortcuts for a key pressed in an element that carries the attribute
`data-lm-suppress-shortcuts` (Lumino's CommandRegistry checks the element the key was pressed
in, then its parents), and ipywidgets sets no attribute on its controls. So a small script
sets it, just before JupyterLab looks, on the element of the explorer the key was pressed in:
for a plain key (an arrow, a letter, Space, Tab, Enter), which belongs to the control; not for
a key held with Ctrl, Alt or Meta, so that Ctrl+S still saves the notebook.

The script reaches the page as an `application/javascript` output in a hidden Output widget:
JupyterLab runs it, since a widget's outputs are trusted, each time the widget is drawn (a
reload of the page too); it adds its one listener once per page. Anywhere else (a rendered
report, a front end that runs no script) nothing happens and the explorer works as before.
"""

from __future__ import annotations

import ipywidgets as widgets

# The classes of the widgets whose keys are theirs (explorer.py adds them).
SCOPE = ".diagkit-explorer, .diagkit-reloadable"
ATTRIBUTE = "data-lm-suppress-shortcuts"

SCRIPT = """(() => {
  // diagkit (present/explorer_keys.py): a plain key pressed in the explorer is the control's,
  // not a notebook command. Runs on window, in the capture phase: before JupyterLab's handler.
  const flag = '__diagkitExplorerKeys1';
  if (window[flag]) return;
  window[flag] = true;
  window.addEventListener('keydown', (event) => {
    const el = event.target;
    if (!(el instanceof Element) || !el.closest(%(scope)r)) return;
    if (event.ctrlKey || event.altKey || event.metaKey) el.removeAttribute(%(attribute)r);
    else el.setAttribute(%(attribute)r, 'true');
  }, true);
})();""" % {"scope": SCOPE, "attribute": ATTRIBUTE}


def keys_widget() -> widgets.Output:
    """A hidden Output widget whose one output is the script: put it among the explorer's
    children, so that the script runs wherever the explorer is drawn."""
    out = widgets.Output(layout=widgets.Layout(display="none"))
    out.add_class("diagkit-explorer-keys")
    out.outputs = ({"output_type": "display_data", "metadata": {},
                    "data": {"application/javascript": SCRIPT, "text/plain": ""}},)
    return out
