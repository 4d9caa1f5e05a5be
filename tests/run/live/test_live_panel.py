"""What the live panel says (docs/workbook.md, "The live view"): one chip per verdict, errors
first, with the step a whole run's finding began and the first line of its fix; wiring changes
that name their tensors once; a plot that never says "no step observed" once steps were.
The panel's parts are plain functions of what the feed hands them: tested here on findings
and events as a whole run makes them (the feed itself: test_live.py, test_live_cells.py)."""

from __future__ import annotations

import html
import re

import numpy as np

from diagkit.core.fixtext import compose
from diagkit.core.result import Finding
from diagkit.present.live_panel import events_html, findings_html, trajectory_svg


def finding(code, severity, module, since=None, ended=None, fix=None):
    return Finding(code, severity, (f"{module}.weight",), f"{code} in {module}",
                   fix or compose((f"Fix {module}:", f"fix_{code}({module!r})")), module=module,
                   count=1, bytes=64, since=since, until=since, ended=ended)


def chips(text: str) -> list[str]:
    """Each chip's line, as a reader sees it."""
    rows = re.findall(r"<div class='diagkit-live-finding[^']*'[^>]*>(.*?)</div>", text)
    return [html.unescape(re.sub(r"<[^>]+>", "", r)) for r in rows]


def test_one_chip_per_verdict_errors_first_with_its_step_and_fix():
    norms = [finding("decay_on_norm_or_bias", "info", f"blocks.{i}.ln", since=0)
             for i in range(4)]
    errors = [finding("orphan", "error", "head2", since=31),
              finding("nonfinite_grad", "error", "head", since=40)]
    warning = finding("grad_not_cleared", "warning", "head2", since=31)
    shown = chips(findings_html(norms + [warning] + errors))
    assert shown == [
        "nonfinite_grad in head (1 tensor) from step 40; fix: fix_nonfinite_grad('head')",
        "orphan in head2 (1 tensor) from step 31; fix: fix_orphan('head2')",
        "grad_not_cleared in head2 (1 tensor) from step 31; fix: fix_grad_not_cleared('head2')",
        "decay_on_norm_or_bias ×4 in blocks.0.ln (1 tensor), blocks.1.ln (1 tensor) and 2 more "
        "from step 0; fix: fix_decay_on_norm_or_bias('blocks.0.ln')"]


def test_the_errors_are_never_pushed_out_by_many_infos():
    infos = [finding(f"info_{i}", "info", "m") for i in range(12)]
    text = findings_html(infos + [finding("orphan", "error", "head2", since=3)])
    shown = chips(text)
    assert shown[0].startswith("orphan in head2") and len(shown) == 8
    assert "and 5 more verdicts (5 findings)" in text


def test_a_finding_that_no_longer_holds_comes_last_with_its_span():
    gone = finding("orphan", "error", "fc1", since=21, ended=61)
    gone = Finding(**{**gone.__dict__, "until": 50})
    shown = chips(findings_html([gone, finding("stalled", "warning", "fc2", since=51)]))
    assert shown == ["stalled in fc2 (1 tensor) from step 51; fix: fix_stalled('fc2')",
                     "orphan in fc1 (1 tensor): held from step 21 to 50; gone at step 61"]


def test_a_wiring_change_names_its_tensors_once():
    names = [f"layer{i}.weight" for i in range(12)]
    event = {"step": 500, "kind": "requires_grad", "names": names[:8],
             "what": "layer0.weight, layer1.weight, layer2.weight and 9 more became trainable "
                     "(requires_grad=True)"}
    text = html.unescape(re.sub(r"<[^>]+>", "", events_html([event])))
    assert text == ("Wiring changesstep 500: layer0.weight, layer1.weight, layer2.weight and 9 "
                    "more became trainable (requires_grad=True)")


def test_the_plot_says_no_step_only_before_the_first():
    assert "no step observed yet" in trajectory_svg([], observed=0)
    assert "no step observed" not in trajectory_svg([], observed=16)
    whole = trajectory_svg([("the whole model", np.array([0, 1, 2]), np.array([1.0, 2.0, 4.0]))],
                           observed=3, whole=True)
    assert "of the whole model" in whole and "<polyline" in whole and "steps 0 to 2" in whole
