"""The fix preview (`--try-fix`) as text and as HTML: each finding's verdict before -> after,
the fix tried, the optimizer-state bytes saved, the DDP step times. Never measures; every name
in the HTML is escaped (tensor and module names come from user code)."""

from __future__ import annotations

import html
import textwrap

from ..core.format import human_bytes


def _arrow(row) -> str:
    after = ", ".join(row["after"])
    return f"{row['code']} -> {after}{_note(row)}"


def _note(row) -> str:
    """Why a row is not plainly fixed: no automatic fix, or a fix that did not help."""
    if not row["automatic"]:
        return " (no automatic fix; gone with the other fixes)" if row["helped"] else \
            " (no automatic fix)"
    return "" if row["helped"] else " (did not help)"


def summary_lines(preview) -> list[str]:
    """The lines under the table: totals, fixes that did not help, new findings, bytes, time."""
    rows = preview.rows
    fixed = sum(r["helped"] for r in rows)
    manual = [r for r in rows if not r["automatic"]]
    lines = [f"{fixed} of {len(rows)} finding(s) turned ok"
             + (f"; {len(manual)} with no automatic fix" if manual else "")
             + ("; every finding is ok after the fixes" if preview.all_ok else "")]
    for r in preview.not_helped:
        lines.append(f"did not help: the fix of {r['code']} on {r['module'] or r['names']} "
                     f"({r['applied']}) left it {', '.join(r['after'])}")
    for f in preview.new:
        lines.append(f"new after the fixes: {f.severity} {f.code} on {f.module}")
    dropped = sum(r["dropped_bytes"] for r in rows)
    added = sum(r["added_bytes"] for r in rows)
    lines.append(f"optimizer state saved: {human_bytes(dropped)}"
                 + (f"; {human_bytes(added)} added for the orphans now trained" if added else "")
                 + " (from each optimizer's type: per element, AdamW keeps exp_avg and "
                   "exp_avg_sq, 2 x 4 B in float32; SGD with momentum 1)")
    if preview.find_unused_parameters is False and _fup_before(preview):
        lines.append("DDP: find_unused_parameters=False once the fixes are in (was True)")
    st = preview.step_time
    if st:
        lines.append(f"step time: {st['old'] * 1e3:.2f} ms with find_unused_parameters=True "
                     f"(old) vs {st['fixed'] * 1e3:.2f} ms with False (fixed), medians of "
                     f"{st['rounds']} interleaved rounds of {st['steps_per_round']} steps")
    return lines


def _fup_before(preview) -> bool:
    """Whether the run as it is needed find_unused_parameters=True."""
    return bool((preview.before.advice or {}).get("find_unused_parameters", {}).get("value"))


def render_preview(preview, width: int = 100) -> str:
    """The preview as `check --try-fix` prints it, after the findings of the run as it is."""
    lines = [f"diagkit --try-fix: each finding's fix tried on a fresh copy of {preview.target}"
             " (your objects are unchanged)", ""]
    if not preview.rows:
        lines.append("no findings: nothing to fix")
    else:
        lines.append(f"{'VERDICT':<22}  {'WHERE':<36}  BEFORE -> AFTER")
        for r in preview.rows:
            where = r["module"] if len(r["module"]) <= 36 else "…" + r["module"][-35:]
            lines.append(f"{r['code']:<22}  {where:<36}  {_arrow(r)}")
            lines += textwrap.wrap("tried: " + r["applied"], width, initial_indent=" " * 24,
                                   subsequent_indent=" " * 31)
    lines.append("")
    for line in summary_lines(preview):
        lines += textwrap.wrap(line, width, subsequent_indent="  ")
    return "\n".join(lines)


def preview_html(preview) -> str:
    """The same, as an HTML table for the notebook and the report (escaped)."""
    esc = html.escape
    head = ("<tr><th>verdict</th><th>where</th><th>fix tried</th><th>before</th>"
            "<th>after</th></tr>")
    body = "".join(
        f"<tr><td>{esc(r['code'])}</td><td><code>{esc(r['module'])}</code></td>"
        f"<td>{esc(r['applied'])}</td><td>{esc(r['code'])}</td>"
        f"<td style='color:{'#1a7f37' if r['helped'] else '#b42318'}'>"
        f"{esc(', '.join(r['after']) + _note(r))}</td></tr>" for r in preview.rows)
    notes = "".join(f"<li>{esc(line)}</li>" for line in summary_lines(preview))
    return (f"<div class='diagkit-try-fix'><h3>Fix preview: {esc(preview.target)}</h3>"
            "<p>Each finding's fix, tried on a fresh copy of the setup (your objects are "
            "unchanged).</p>"
            + (f"<table>{head}{body}</table>" if preview.rows else "<p>No findings: nothing "
               "to fix.</p>") + f"<ul>{notes}</ul></div>")
