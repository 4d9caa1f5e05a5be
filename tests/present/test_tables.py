"""HTML and tables of the presenting layer: on the demos, escaped, bounded at scale."""

from __future__ import annotations

import html
import re
import types

import pytest

from diagkit.core import fixtext, severity
from diagkit.core.format import human_bytes
from diagkit.core.result import Finding
from diagkit.judge.verdicts import severity_of
from diagkit.present import html_text, ranks, sections, tables
from samples import HOSTILE, MEM, demo, failing_run, hostile_diag, synthetic

DEMOS = ["meta_memory", "finetune_heads", "clean"]
CMIM = ["cmim_decoder.0.weight", "cmim_decoder.0.bias", "cmim_decoder.2.weight",
        "cmim_decoder.2.bias"]


NBSP = "\u00a0"


def chips(banner: str) -> list[str]:
    """The verdict names in the banner, in order."""
    return re.findall(r"<b>([^<]+)</b> \d+\u00a0tensors?", banner)


def spaced(text: str) -> str:
    """Text as read: a non-breaking space (between a number and its unit) as a space."""
    return text.replace(NBSP, " ")


# ------------------------------------------------------------------ banner
def test_banner_names_the_orphan_worst_first():
    d = demo("meta_memory")
    banner = sections.verdict_banner(d)
    assert chips(banner) == ["orphan", "grad_not_cleared", "ok"]  # error, warning, ok
    assert f"<b>orphan</b> 1{NBSP}tensor, 512{NBSP}B" in banner  # numbers keep their units
    assert severity.COLORS["error"][0] in banner.split("orphan")[0].rsplit("<span", 1)[1]
    total = human_bytes(int(d.params["bytes"].sum()))
    assert f"20 tensors, {total}, 5 steps observed" in spaced(banner)
    assert "failed" not in banner


def test_banner_on_the_other_demos():
    banner = sections.verdict_banner(demo("finetune_heads"))
    assert chips(banner) == ["unused", "ok"]
    assert "<b>unused</b> 8 tensors, 18.6 KiB" in spaced(banner)
    assert chips(sections.verdict_banner(demo("clean"))) == ["ok"]


def test_banner_says_which_step_failed_escaped():
    banner = sections.verdict_banner(failing_run(0))
    assert "failed at step 0: RuntimeError: boom &lt;b&gt;bad&lt;/b&gt;. No step completed." \
        in banner
    assert "<b>bad</b>" not in banner
    assert "0 steps observed" in spaced(banner)
    banner = spaced(sections.verdict_banner(failing_run(2)))
    assert "failed at step 2" in banner and "The 2 steps before it are kept" in banner
    assert "2 steps observed" in banner


def test_banner_lists_every_severity_in_order():
    params, steps = synthetic()
    d = types.SimpleNamespace(params=params, steps=steps, failure=None, meta={}, findings=[])
    banner = sections.verdict_banner(d)
    names = chips(banner)
    assert set(names) == {"stalled", "orphan", "grad_not_cleared", "unused", "ok"}
    ranks = [("ok", "info", "warning", "error").index(severity_of(v)) for v in names]
    assert ranks == sorted(ranks, reverse=True) and names[-1] == "ok"
    assert "200 steps observed" in spaced(banner)


# ------------------------------------------------------------------ findings
@pytest.mark.parametrize("name", DEMOS)
def test_findings_table_has_every_code_and_escaped_fix(name):
    d = demo(name)
    out = sections.findings_table(d.findings)
    if not d.findings:
        assert "No findings" in out and "<table" not in out
    for f in d.findings:
        assert f">{f.code}</td>" in out
        for kind, text in fixtext.parts(f.fix):  # words as prose, each code block as a <pre>
            shown = f">{html.escape(text)}</pre>" if kind == "code" else html_text.prose(text)
            assert shown in out.replace("<wbr>", ""), (kind, text)  # (code breaks at dots)
        assert human_bytes(f.bytes).replace(" ", NBSP) in out
    # each finding, then its fix the whole width of the table under it
    assert len(re.findall(r'<tr class="(?:error|warning|info)">', out)) == len(d.findings)
    assert out.count('<tr class="diagkit-fix-row"><td colspan="4"') == len(d.findings)
    assert "<button" not in out  # no copy button unless the page runs script


def test_a_fix_reads_as_words_and_code_blocks_with_copy_buttons():
    fix = fixtext.compose(("Add it to an optimizer:",
                           'optimizer.add_param_group({"params": [model.w]})'),
                          ("Or, if it should stay fixed, freeze it:",
                           "for p in [model.w]:\n    p.requires_grad_(False)"))
    out = html_text.fix_html(fix, copy=True)
    assert "model.<wbr>w" in out  # a line of code may break after a dot between names
    out = out.replace("<wbr>", "")
    assert re.findall(r"<pre[^>]*>(.*?)</pre>", out, re.S) == [
        "optimizer.add_param_group({&quot;params&quot;: [model.w]})",
        "for p in [model.w]:\n    p.requires_grad_(False)"]
    assert out.count('class="diagkit-copy"') == 2 and "white-space:pre-wrap" in out
    assert "Or, if it should stay fixed, freeze it:</p>" in out
    old = html_text.fix_html("Include it: `optimizer.add_param_group(x)` or freeze it")
    assert "<pre" not in old and "<code>optimizer.add_param_group(x)</code>" in old
    assert html_text.keep_units("8.0 KiB of 3 steps, from step 3; 3 tensors") == \
        f"8.0{NBSP}KiB of 3{NBSP}steps, from step{NBSP}3; 3{NBSP}tensors"
    assert 'onclick=' in sections.diagnosis_html(demo("meta_memory"))  # the live repr copies


def test_findings_table_worst_first():
    info = Finding("decay_on_norm_or_bias", "info", ("a.bias",), "m", "f", "a", 1, 10**6)
    warn = Finding("unused", "warning", ("b.w",), "m", "f", "b", 1, 10)
    err = Finding("orphan", "error", ("c.w",), "m", "f", "c", 1, 1)
    out = sections.findings_table([info, warn, err])
    assert re.findall(r'<tr class="(error|warning|info)">', out) == ["error", "warning", "info"]


def test_findings_table_escapes_names_and_marks_code():
    f = Finding("orphan", "error", (HOSTILE,), f"`{HOSTILE}` is never trained", f"fix {HOSTILE}",
                HOSTILE, 1, 16)
    out = sections.findings_table([f])
    assert "<script" not in out
    assert "<code>&lt;script&gt;alert(1)&lt;/script&gt;</code> is never trained" in out


# ------------------------------------------------------------------ wiring table
def test_wiring_table_puts_the_orphan_first():
    styler = tables.wiring_table(demo("meta_memory").params)
    first = styler.data.iloc[0]
    assert first["name"] == MEM
    assert first["verdicts"] == "orphan, grad_not_cleared"
    assert first["optimizer/group"] == "—" and first["used"] == "5/5"
    assert first["changed"] == "0/5" and first["shape"] == "4×32" and first["bytes"] == "512 B"
    assert first["grad_total_norm"] == f"{demo('meta_memory').params['grad_total_norm'][0]:.3g}"
    out = styler.to_html()
    assert severity.COLORS["error"][0] in out
    assert list(styler.data.columns) == list(tables.WIRING_COLUMNS)


def test_wiring_table_unused_then_ok_in_model_order():
    params = demo("finetune_heads").params
    names = list(tables.wiring_table(params).data["name"])
    assert set(names[:8]) == set(params.loc[params["used_steps"] == 0, "name"])
    assert names[0] == "vocab_head.weight"  # the largest flagged
    assert names[8:] == [n for n in params["name"] if n not in names[:8]]


def test_wiring_table_at_scale_keeps_every_flagged_row():
    params, _ = synthetic()
    styler = tables.wiring_table(params, limit=200)
    shown = styler.data
    assert len(shown) == 200
    flagged = params.loc[params["verdicts"] != ("ok",), "name"]
    assert set(flagged) <= set(shown["name"])
    assert list(shown["verdicts"][:18]).count("ok") == 0
    ok_bytes = params.loc[params["verdicts"] == ("ok",), "bytes"]
    smallest_kept = params.set_index("name").loc[list(shown["name"][18:]), "bytes"].min()
    assert smallest_kept >= ok_bytes.nlargest(182).min()
    caption = styler.caption
    assert "1800 rows left out" in caption and "params.csv" in caption
    assert styler.to_html().count("<tr>") <= 201


# ------------------------------------------------------------------ module rollup
def test_module_rollup_counts_the_dead_heads():
    roll = tables.module_rollup(demo("finetune_heads").params)
    by_module = roll.set_index("module")
    assert by_module.loc["cmim_decoder", "unused"] == 4
    assert by_module.loc["cmim_decoder", "tensors"] == 4
    assert by_module.loc["cmim_decoder", "trainable"] == 4
    assert by_module.loc["encoder", "unused"] == 2 and by_module.loc["encoder", "ok"] == 11
    assert list(roll["module"]) == ["cmim_decoder", "vocab_head", "encoder", "ffn_head"]
    assert list(roll["worst"]) == ["warning"] * 3 + ["ok"]
    assert roll["tensors"].sum() == 23


def test_module_rollup_counts_depth_after_the_ddp_prefix():
    params = demo("meta_memory").params
    roll = tables.module_rollup(params)
    assert roll["module"][0] == "module.metamodel"
    assert roll.loc[0, "orphan"] == 1 and roll.loc[0, "trainable"] == 1
    assert set(roll["module"]) == {"module.metamodel", "module.hypernet", "module.metalora",
                                   "module.lm_head"}
    deeper = tables.module_rollup(params, depth=2)
    assert deeper["module"][0] == "module.metamodel.model"
    assert "module.hypernet.0" in set(deeper["module"])
    assert list(roll.columns[:4]) == ["module", "tensors", "bytes", "trainable"]
    assert list(roll.columns[5:]) == ["orphan", "grad_not_cleared", "ok"]


def test_module_rollup_at_scale():
    params, _ = synthetic()
    roll = tables.module_rollup(params)
    assert len(roll) == 25 and roll["tensors"].sum() == len(params)
    assert roll["worst"][0] == "error" and (roll["worst"][roll["worst"] == "ok"].index
                                           > roll["worst"][roll["worst"] != "ok"].index.max()).all()


def test_module_table_shows_sizes_as_everywhere_else():
    params = demo("finetune_heads").params
    styler = tables.module_table(params)
    roll = tables.module_rollup(params)
    assert list(styler.data["bytes"]) == [human_bytes(b) for b in roll["bytes"]]
    assert list(styler.data.columns[:5]) == ["module", "worst", "tensors", "bytes", "trainable"]
    out = styler.to_html()
    assert f"8.2{NBSP}KiB" in out and severity.COLORS["warning"][0] in out


# ------------------------------------------------------------------ advice
def test_advice_html_for_dead_heads():
    out = sections.advice_html(demo("finetune_heads").advice)
    assert "find_unused_parameters=True" in out
    assert "cmim_decoder.0.weight" in out and "18.6 KiB" in spaced(out)
    assert "then use find_unused_parameters=False" in out
    assert "static_graph=True is possible" in out


def test_advice_html_clean_and_empty():
    out = sections.advice_html(demo("clean").advice)
    assert "find_unused_parameters=False</b></span> is enough" in out
    assert "No DDP advice" in sections.advice_html({})


# ------------------------------------------------------------------ escaping, end to end
def test_hostile_module_name_is_escaped_everywhere():
    d = hostile_diag()
    assert any(n.startswith(HOSTILE) for n in d.params["name"])
    assert any(f.code == "unused" and HOSTILE in f.module for f in d.findings)
    outputs = {
        "banner": sections.verdict_banner(d),
        "findings": sections.findings_table(d.findings),
        "wiring": tables.wiring_table(d.params).to_html(),
        "advice": sections.advice_html(d.advice),
    }
    escaped = html.escape(HOSTILE)
    for where, out in outputs.items():
        assert "<script" not in out.lower(), where
        assert "http://" not in out and "https://" not in out, where
    for where in ("findings", "wiring", "advice"):
        assert escaped in outputs[where], where
    roll = tables.module_rollup(d.params)
    assert HOSTILE in set(roll["module"])  # a DataFrame keeps the raw name; pandas escapes it
    assert "<script" not in roll._repr_html_() and escaped in roll._repr_html_()


def test_a_fix_in_prose_shows_its_quoted_code_as_code_not_backticks():
    from diagkit.core.result import Finding
    prose = Finding("nothing_changed", "info", (), "m",
                    "check that `optimizer.step()` is reached <here>", module="")
    code = Finding("orphan", "error", ("a",), "m",
                   fixtext.compose(("Add it:", "opt.add_param_group({'params': [p]})")),
                   module="a")
    out = sections.findings_table([prose, code]).replace("<wbr>", "")
    assert "`" not in out
    assert "check that <code>optimizer.step()</code> is reached &lt;here&gt;" in out
    assert re.search(r"<pre [^>]*>opt.add_param_group\(\{&#x27;params&#x27;: \[p\]\}\)</pre>",
                     out)


def test_the_wiring_table_shows_the_stage_only_when_the_ranks_hold_different_tensors():
    params = demo("meta_memory").params.copy()
    assert "stage" not in tables.wiring_table(params).data.columns
    params["stage"] = ["1"] + ["0"] * (len(params) - 1)
    data = tables.wiring_table(params).data
    assert list(data.columns[:2]) == ["name", "stage"] and data.iloc[0]["stage"] == "1"
