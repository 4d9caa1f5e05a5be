"""The explorer of issue 37, checked on the widgets in Python: it leads with the findings and
their fixes (words as text, code as code), a finding's button picks its tensors and says so,
the status line's notes hold for one change only and count what they name, the plot says in
words what it draws, and the script that keeps keys in the explorer rides along. What only a
browser can see (keys, cut code, widths) is tests/e2e/test_jupyterlab.py."""

from __future__ import annotations

import dataclasses
import html
import re

import ipywidgets as widgets

from diagkit.core import fixtext
from diagkit.core.result import Finding
from diagkit.present.explorer import explore
from diagkit.present.explorer_findings import MOST_FINDINGS, pick
from diagkit.present.explorer_keys import ATTRIBUTE, SCOPE
from diagkit.present.explorer_state import ExplorerState

MEM = "module.metamodel.model.mem_tokens"
CMIM = ["cmim_decoder.0.weight", "cmim_decoder.0.bias", "cmim_decoder.2.weight",
        "cmim_decoder.2.bias"]


def with_findings(diag, findings):
    return dataclasses.replace(diag, findings=findings)


def test_the_findings_lead_with_their_fixes(meta):
    """First child: the findings, the error first, each fix's code in a block of its own and
    its words apart; the filters, the plot and the table come after."""
    w = explore(meta)
    c = w.controls
    assert w.children[0] is c.findings and list(w.children).index(c.tensors) > 1
    heading, *rows = c.findings.children
    assert "2 findings" in heading.value and len(rows) == 2 == len(c.findings.buttons)
    first = rows[0].children[0].children[0].value + rows[0].children[1].value
    assert ">error</span>" in first and "<b>orphan</b>" in first
    assert "grad_not_cleared" in rows[1].children[0].children[0].value
    orphan = next(f for f in meta.findings if f.code == "orphan")
    parts = fixtext.parts(orphan.fix)
    assert [p for k, p in parts if k == "code"] == code_blocks(first) != []
    assert all(html.escape(p) in first for k, p in parts if k == "words")


def test_a_fix_in_its_form_an_older_one_and_hostile_names(meta):
    """Each block of code as pasted, with its copy button, the words apart and escaped; an
    older save's one line of words stays words; names from user code are text, never markup."""
    fix = fixtext.compose(("Add it to an optimizer:", 'optimizer.add_param_group({"params": '
                           "[model.head.weight]})"),
                          ("Or freeze it <b>now</b>:", "for p in [model.head.weight]:\n"
                                                       "    p.requires_grad_(False)"))
    bad = Finding(code="orphan", severity="error", params=("<script>x.weight",),
                  message="`<script>x.weight` is held by no optimizer", fix=fix,
                  module="<script>x", count=1, bytes=16)
    older = dataclasses.replace(bad, severity="warning",
                                fix="Freeze it: for p in model.x.parameters(): "
                                    "p.requires_grad_(False)")
    box = explore(with_findings(meta, [bad, older])).controls.findings
    new, old = (row.children[0].children[0].value + row.children[1].value
                for row in box.children[1:])
    assert code_blocks(new) == ['optimizer.add_param_group({"params": [model.head.weight]})',
                                "for p in [model.head.weight]:\n    p.requires_grad_(False)"]
    assert new.count("diagkit-copy") == 2 and "Or freeze it &lt;b&gt;now&lt;/b&gt;:" in new
    assert code_blocks(old) == [] and "Freeze it: for p in model.x.parameters()" in old
    page = "".join(h.value for h in walk(box) if isinstance(h, widgets.HTML))
    assert "<script>" not in page and "&lt;script&gt;x" in page


def test_picking_a_finding_picks_its_tensors_and_shows_them(finetune, meta):
    """The button of the cmim_decoder finding: its 4 tensors plotted, the verdict and module
    filters set to it (the controls show them), the status line says so once."""
    w = explore(finetune)
    c = w.controls
    f = next(f for f in w.state.findings if f.module == "cmim_decoder")
    button = c.findings.buttons[w.state.findings.index(f)]
    assert button.description == "plot its 4 tensors" and not button.disabled
    button.click()
    assert sorted(w.state.selected) == sorted(CMIM) == sorted(c.tensors.value)
    assert c.verdicts.value == ("unused",) and c.module.value == "cmim_decoder"
    assert "4 of 23 tensors match" in c.status.value
    assert ("finding picked: unused in cmim_decoder: its 4 tensors plotted, the filters set to "
            "its verdict unused and module cmim_decoder") in c.status.value
    assert c.table.value.count("<tr") == 5
    c.metric.value = "delta_norm"                   # the next change: the note is said no more
    assert "finding picked" not in c.status.value and sorted(w.state.selected) == sorted(CMIM)
    # a finding whose where is a tensor: no module filter; the verdict filter still set
    state = ExplorerState.from_diagnosis(meta)
    orphan = next(f for f in state.findings if f.code == "orphan")
    assert pick(state, orphan) == [MEM]
    assert state.selected == [MEM] and state.verdicts == {"orphan"} and state.module_prefix == ""


def test_a_finding_without_tensors_has_no_button_to_press(meta):
    run_level = Finding(code="nothing_trains", severity="error", params=(), module="",
                        message="no tensor requires grad", fix="Unfreeze something.")
    w = explore(with_findings(meta, [*meta.findings, run_level]))
    button = w.controls.findings.buttons[0]              # errors first; then by size
    disabled = [b for b in w.controls.findings.buttons if b.disabled]
    assert len(disabled) == 1 and disabled[0].description == "no tensor to plot"
    assert pick(w.state, run_level) == [] and w.state.picked_finding is None
    assert not button.disabled


def test_a_long_list_of_findings_is_capped_and_says_so(meta):
    many = [dataclasses.replace(meta.findings[0], module=f"m{i}") for i in range(20)]
    box = explore(with_findings(meta, many)).controls.findings
    assert len(box.buttons) == MOST_FINDINGS
    assert f"the first {MOST_FINDINGS} here" in box.children[0].value
    assert "No findings" in explore(with_findings(meta, [])).controls.findings.children[0].value


def test_status_notes_hold_for_one_change_and_count_what_they_name(meta):
    """Taking the last pick off: the line said "6 problem tensors" for 1 problem and 5 ok
    ones, stayed on after the next change, and stood beside "0 of 20 tensors match"."""
    state = ExplorerState.from_diagnosis(meta)
    state.selected = ["module.lm_head.weight"]
    state.selected = []
    assert ("no tensor is picked now: the plot is back to the default selection "
            "(1 problem tensor and 5 ok ones)") in state.message
    state.module_prefix = "module.hypernet"
    assert "no tensor is picked now" not in state.message
    state.selected = ["module.hypernet.0.weight"]
    state.selected = []
    assert "(4 ok tensors)" in state.message
    state.log_scale = False
    assert "no tensor is picked now" not in state.message
    state.module_prefix = ""
    state.selected = [MEM]
    state.verdicts = {"stalled"}                       # nothing matches
    state.selected = []
    assert "0 of 20 tensors match" in state.message
    assert "default selection" not in state.message


def test_the_plot_says_in_words_what_it_draws(meta):
    w = explore(meta)
    alt = html.unescape(w.controls.plot.value.split("alt='", 1)[1].split("'", 1)[0])
    assert alt.startswith("Plot of grad_norm per step (log scale), steps 0 to 4, 6 tensors")
    assert f"{MEM} (orphan, grad_not_cleared): 0.063 to 0.0982" in alt
    w.controls.verdicts.value = ("orphan",)
    w.controls.metric.value = "delta_norm"
    w.controls.log.value = False
    alt = html.unescape(w.controls.plot.value.split("alt='", 1)[1].split("'", 1)[0])
    assert alt.startswith("Plot of delta_norm per step (linear scale)") and ": 0 to 0" in alt
    w.controls.regex.value = "nothing matches this"
    alt = html.unescape(w.controls.plot.value.split("alt='", 1)[1].split("'", 1)[0])
    assert alt == "Plot of delta_norm per step: no data: no tensor matches the filters."


def test_the_keys_script_rides_in_a_hidden_output(meta):
    """The script that keeps keys in the explorer (explorer_keys): an application/javascript
    output of a hidden Output widget among the explorer's children, scoped to its classes."""
    w = explore(meta)
    keys = w.controls.keys
    assert keys in w.children and keys.layout.display == "none"
    (out,) = keys.outputs
    script = out["data"]["application/javascript"]
    assert ATTRIBUTE in script and repr(SCOPE) in script
    assert "window.addEventListener('keydown'" in script and "}, true);" in script
    assert "diagkit-explorer" in w._dom_classes


def code_blocks(page: str) -> list[str]:
    """The code of each fix block as a user copies it (no markup, no break hints)."""
    return [html.unescape(re.sub(r"<[^>]+>", "", chunk.split(">", 1)[1].split("</pre>")[0]))
            for chunk in page.split('<pre class="diagkit-code diagkit-fix-code"')[1:]]


def walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)
