"""HTML fragments of a diagnosis, for the notebook and the offline report: the banner, the
findings, the DDP advice and the checkpoint. Parameter and module names are user data, so
every one of them is escaped; nothing emitted holds a script or refers outside the page."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from ..core import severity
from ..core.format import dotted_breaks, human_bytes
from ..judge.verdicts import NO_OPTIMIZER, bytes_per_verdict, severity_of
from .html_text import fix_html, keep_units, prose
from .source import source_html

_LEFT = "text-align:left;vertical-align:top"


def diagnosis_html(diag) -> str:
    """The notebook summary of a `Diagnosis`: the report's banner, findings and advice. A
    live notebook runs script, so each block of code has its copy button."""
    return (f"<div class='diagkit'>{verdict_banner(diag)}"
            f"{findings_table(diag.findings, copy=True)}{advice_html(diag.advice)}</div>")


def severity_chip(level: str, inner: str) -> str:
    bg, fg = severity.colors(level)
    return (f'<span class="diagkit-chip {level}" style="display:inline-block;margin:2px;'
            f'padding:2px 8px;border-radius:4px;background:{bg};color:{fg}">{inner}</span>')


def verdict_banner(diag) -> str:
    """How many tensors and bytes per verdict, worst first, coloured by severity; the totals;
    and, when the user's step raised, a red line with the failed step and its error."""
    esc = html.escape
    params = diag.params
    sizes = pd.to_numeric(params["bytes"], errors="coerce").fillna(0).astype(np.int64)
    chips = "".join(
        severity_chip(severity_of(v), keep_units(
                      f"<b>{esc(v)}</b> {n} tensor{'s' if n != 1 else ''}, {human_bytes(b)}"))
        for v, (n, b) in bytes_per_verdict(params).items())
    steps = (diag.meta or {}).get("steps_observed")
    if steps is None:
        steps = int(diag.steps["step"].nunique()) if len(diag.steps) else 0
    total = (f"{len(params)} tensors, {human_bytes(int(sizes.sum()))}, "
             f"{steps} step{'s' if steps != 1 else ''} observed")
    red = severity.COLORS["error"]
    lines = []
    if diag.failure is not None:
        k = int(diag.failure.step)
        kept = (f"The {k} step{'s' if k != 1 else ''} before it are kept and shown." if k
                else "No step completed.")
        lines.append(f"The training step failed at step {k}: "
                     f"{esc(str(diag.failure.error))}. {kept}")
    lines += [esc(f.message) for f in (diag.findings or []) if f.code == "check_failed"]
    alarms = "".join(
        f'<p class="diagkit-failure error" style="margin:4px 0;padding:4px 8px;'
        f'background:{red[0]};color:{red[1]};font-weight:bold">{line}</p>' for line in lines)
    return (f'<div class="diagkit-banner banner"><div>{chips}</div>'
            f'<p style="margin:4px 0">{keep_units(total)}</p>{_not_measured_html(diag)}{alarms}'
            '</div>')


def _not_measured_html(diag) -> str:
    """What was not judged (no optimizer; a zero gradient no observed step could tell) or not
    measured (a dry run on meta), and why."""
    line = not_measured_line(diag)
    return (f'<p class="diagkit-not-measured" style="margin:4px 0;font-style:italic">'
            f'{html.escape(line)}</p>') if line else ""


def not_measured_line(diag) -> str:
    """The one wording, for the terminal and the report, of `meta["not_judged"]` (verdict ->
    why) and `meta["not_measured"]` (a dry run on meta): 'No optimizer (hand-written
    updates): ...', 'zero_gradient not judged: 4 tensors (...) got only ...', 'Dry run on the
    meta device: ...'; '' when everything was judged."""
    meta = diag.meta or {}
    unjudged = meta.get("not_judged") or {}
    membership = [v for v, why in unjudged.items() if why == NO_OPTIMIZER]
    parts = ([] if not membership else
             ["No optimizer (hand-written updates): membership verdicts mean nothing and are "
              f"not judged: {', '.join(membership)}."])
    parts += [f"{v} not judged: {str(why).rstrip('.')}." for v, why in unjudged.items()
              if why != NO_OPTIMIZER]
    skipped = meta.get("not_measured")
    if skipped:
        listed = ", ".join(f"{v} ({why})" for v, why in skipped.items())
        parts.append("Dry run on the meta device: one forward and backward, no values. Wiring "
                     f"verdicts are measured; not measured on meta: {listed}.")
    return " ".join(parts)


def findings_table(findings, copy: bool = False) -> str:
    """Two rows per finding, worst first: severity, verdict, where, tensors and bytes; then,
    the whole width of the table under them, what was found, the fix (its words, and each
    block of code to paste, with a copy button when `copy`: the page runs script) and the
    lines that built the optimizer group. Prose and code get the full width and wrap: readable
    in JupyterLab's ~520 px output at a 968 px window, never scrolled sideways."""
    if not findings:
        return '<p class="diagkit-findings">No findings: every tensor is wired correctly.</p>'
    esc = html.escape
    ordered = sorted(enumerate(findings),
                     key=lambda p: (-severity.rank(p[1].severity), -int(p[1].bytes or 0), p[0]))
    rows = []
    for _, f in ordered:
        bg, fg = severity.colors(f.severity)
        where = f.module or ("(whole model)" if f.count else "—")
        rows.append(
            f'<tr class="{esc(f.severity)}">'
            f'<td rowspan="2" style="background:{bg};color:{fg};font-weight:bold;{_LEFT}">'
            f"{esc(f.severity)}</td><td style='{_LEFT}'>{esc(f.code)}</td>"
            f"<td style='{_LEFT}'>{dotted_breaks(esc(where))}</td>"
            f"<td style='text-align:right;vertical-align:top'>{int(f.count or 0)}</td>"
            f"<td style='text-align:right;vertical-align:top;white-space:nowrap'>"
            f"{keep_units(human_bytes(int(f.bytes or 0)))}</td></tr>"
            f'<tr class="diagkit-fix-row"><td colspan="4" class="diagkit-fix" '
            f"style='{_LEFT};padding-bottom:10px'>"
            f'<p class="diagkit-message" style="margin:0 0 6px">{prose(f.message)}</p>'
            f"{fix_html(f.fix, copy)}{source_html(getattr(f, 'source', ()))}</td></tr>")
    # Inline styles: the notebook's own CSS right-aligns table cells and would win over a class.
    head = "".join(f"<th style='{_LEFT}'>{h}</th>" for h in
                   ("severity", "verdict", "where", "tensors", "bytes"))
    # A fixed layout with set widths fits the output area: "where" takes what is left and
    # wraps a name after its dots; the rows under it span the whole table.
    cols = "".join(f'<col style="width:{w}">' for w in _FINDINGS_WIDTHS)
    return (f'<table class="diagkit-findings" style="width:100%;table-layout:fixed">'
            f"<colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


# A verdict is one identifier (25 characters at most: dead_weight_in_checkpoint), never broken.
_FINDINGS_WIDTHS = ("5.5em", "13em", "auto", "4.5em", "5.5em")


def _names_list(names, most: int = 8) -> str:
    names = [str(n) for n in names]
    shown = ", ".join(f"<code>{html.escape(n)}</code>" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def advice_html(advice: dict) -> str:
    """The find_unused_parameters and static_graph advice (see findings.build_advice), with its
    evidence and recommendation."""
    esc = html.escape
    advice = advice or {}
    fup = advice.get("find_unused_parameters") or {}
    sg = advice.get("static_graph") or {}
    if not fup and not sg:
        return '<div class="diagkit-advice"><p>No DDP advice (nothing was observed).</p></div>'
    parts = []
    if fup:
        need = bool(fup.get("value"))
        bg, fg = severity.COLORS["warning" if need else "ok"]
        parts.append(
            f'<p><span style="background:{bg};color:{fg};padding:2px 6px;border-radius:4px">'
            + ("DDP needs <b>find_unused_parameters=True</b></span> as the model is now: "
               if need else "<b>find_unused_parameters=False</b></span> is enough: ")
            + f"{esc(str(fup.get('evidence', '')))}.</p>")
        if fup.get("unused"):
            parts.append(f"<p>Never received a gradient "
                         f"({human_bytes(int(fup.get('unused_bytes') or 0))}): "
                         f"{_names_list(fup['unused'])}.</p>")
        if fup.get("intermittent"):
            parts.append(f"<p>Received gradients on some steps only: "
                         f"{_names_list(fup['intermittent'])}.</p>")
        if fup.get("recommendation"):
            parts.append(f"<p><b>Recommendation:</b> {esc(str(fup['recommendation']))}.</p>")
        if need and "after_fix" in fup:
            parts.append(f"<p>After that fix: <code>find_unused_parameters="
                         f"{bool(fup['after_fix'])}</code>.</p>")
    if sg:
        possible = bool(sg.get("value"))
        parts.append(f"<p><b>static_graph=True {'is possible' if possible else 'is not possible'}"
                     f"</b>: {esc(str(sg.get('evidence', '')))}.</p>")
    return keep_units(f'<div class="diagkit-advice">{"".join(parts)}</div>')


def checkpoint_html(checkpoint: dict | None, limit: int = 30) -> str:
    """What loading the checkpoint did, and its dead bytes (diag.checkpoint); '' when no
    checkpoint was loaded."""
    if not checkpoint:
        return ""  # nothing to show: the report folds this section into one line
    esc = html.escape
    load = checkpoint.get("load", {})
    parts = [f"<p>{esc(checkpoint.get('summary', ''))}.</p>"]
    audit = checkpoint.get("audit") or {}
    kinds = audit.get("by_kind", {})
    if kinds:
        rows = "".join(
            f"<tr><td>{esc(kind)}</td><td>{v['tensors']}</td><td>{human_bytes(v['bytes'])}</td>"
            f"<td>{v['share']:.1%}</td><td>{esc(', '.join(v['names'][:6]))}"
            f"{' …' if len(v['names']) > 6 else ''}</td></tr>"
            for kind, v in sorted(kinds.items(), key=lambda kv: -kv[1]["bytes"]))
        parts.append(
            f"<p>Of the checkpoint's {human_bytes(audit.get('checkpoint_bytes', 0))}:</p>"
            "<table><tr><th>tensors this run</th><th>count</th><th>bytes</th><th>share</th>"
            f"<th>e.g.</th></tr>{rows}</table>")
    problems = ([(n, "missing from the file") for n in load.get("missing", [])]
                + [(n, "in the file, not in the model") for n in load.get("unexpected", [])]
                + [(m["name"], f"shape {tuple(m['file'])} in the file, {tuple(m['model'])} "
                    "in the model") for m in load.get("mismatched", [])])
    if problems:
        rows = "".join(f"<tr><td>{esc(n)}</td><td>{esc(what)}</td></tr>"
                       for n, what in problems[:limit])
        more = f"<p>and {len(problems) - limit} more.</p>" if len(problems) > limit else ""
        parts.append(f"<table><tr><th>tensor</th><th>not loaded because</th></tr>{rows}</table>"
                     + more)
    return keep_units("".join(parts))


def printed_html(text: str, most: int = 200) -> str:
    """What the target printed while it ran, folded (the report's last section), or nothing:
    kept for whoever needs it, out of the way of the findings. At most the last `most` lines."""
    lines = str(text or "").rstrip("\n").splitlines()
    if not lines:
        return ""
    cut = f" (the last {most} of {len(lines)})" if len(lines) > most else ""
    body = html.escape("\n".join(lines[-most:]))
    return (f'<details class="diagkit-printed"><summary>What the target printed: '
            f"{len(lines)} line{'s' if len(lines) != 1 else ''}{cut}</summary>"
            f'<pre style="white-space:pre-wrap">{body}</pre></details>')
