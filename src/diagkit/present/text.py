"""Plain text for the terminal (`diagkit check`, `diagkit compare`). Never measures."""

from __future__ import annotations

import textwrap
from collections import Counter

from ..core import fixtext, severity
from ..core.format import human_bytes, truncate_left
from ..judge.verdicts import bytes_per_verdict
from .sections import not_measured_line
from .source import source_text


def _severity_summary(findings) -> str:
    """'1 error, 2 warnings' ('' when there are none)."""
    counts = Counter(f.severity for f in findings)
    return ", ".join(f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}"
                     for s in severity.LEVELS if counts[s])


def _observed(diag) -> str:
    """'5 steps observed', or on meta 'one meta pass (no values)'."""
    if (diag.meta or {}).get("device") == "meta":
        return "one meta pass (no values)" if diag.meta.get("steps_observed") else "no meta pass"
    return f"{diag.meta.get('steps_observed', 0)} steps observed"


def render_findings(diag, width: int = 100) -> str:
    """The findings table of a diagnosis, each finding's message and fix, the advice."""
    params = diag.params
    summary = _severity_summary(diag.findings)
    lines = [f"diagkit: {len(params)} tensors ({human_bytes(int(params['bytes'].sum()))}), "
             f"{_observed(diag)} — "
             f"{summary or 'no findings: every tensor is ok'}"]
    meta_line = not_measured_line(diag)
    if meta_line:
        lines += textwrap.wrap(meta_line, width, subsequent_indent="  ")
        lines += ["by verdict: " + "; ".join(
            f"{v} {n} tensor{'s' if n != 1 else ''} {human_bytes(b)}"
            for v, (n, b) in bytes_per_verdict(params).items())]
    if diag.findings:
        lines.append("")
        lines.append(f"{'SEVERITY':<8}  {'VERDICT':<22}  {'WHERE':<44}  {'TENSORS':>7}  BYTES")
    indent = " " * 10
    for f in diag.findings:
        where = f.module if len(f.module) <= 44 else "…" + f.module[-43:]
        lines.append(f"{f.severity:<8}  {f.code:<22}  {where:<44}  {f.count:>7}  "
                     f"{human_bytes(f.bytes)}")
        lines += textwrap.wrap(f.message, width, initial_indent=indent, subsequent_indent=indent)
        lines += fix_lines(f.fix, width, indent)
        lines += source_text(getattr(f, "source", ()), indent)
    if diag.checkpoint:
        lines.append("")
        lines += textwrap.wrap(diag.checkpoint.get("summary", ""), width,
                               subsequent_indent="        ")
    fup = diag.advice.get("find_unused_parameters", {})
    sg = diag.advice.get("static_graph", {})
    lines.append("")
    lines += textwrap.wrap(
        f"advice: find_unused_parameters={fup.get('value')} ({fup.get('evidence', '')}); "
        f"{fup.get('recommendation', '')}.", width, subsequent_indent="        ")
    lines += textwrap.wrap(f"        static_graph possible: {sg.get('value')} "
                           f"({sg.get('evidence', '')}).", width, subsequent_indent="        ")
    return "\n".join(lines)


def fix_lines(fix: str, width: int, indent: str) -> list[str]:
    """A fix under its finding: words wrapped at `width`, code never wrapped (it is pasted)."""
    parts = fixtext.parts(fix)
    if len(parts) == 1 and parts[0][0] == "words":  # one line of words (or an older save's)
        return textwrap.wrap("fix: " + parts[0][1], width, initial_indent=indent,
                             subsequent_indent=indent + "     ", break_on_hyphens=False)
    lines = [indent + "fix:"]
    for kind, text in parts:
        if kind == "code":
            lines += [indent + "      " + line for line in text.splitlines()]
        else:
            lines += textwrap.wrap(text, width, initial_indent=indent + "  ",
                                   subsequent_indent=indent + "  ", break_on_hyphens=False)
    return lines


def finding_line(f, step: int | None = None) -> str:
    """One short line for a log or a chip: severity, verdict, where, from which step, the first
    line of the fix. The whole message and fix stay in the diagnosis (README, "Reading a
    finding"): a long line wraps mid-number in a notebook's output."""
    where = truncate_left(f.module, 48) if f.module else ("the model" if f.count else "")
    count = f" ({f.count} tensor{'s' * (f.count != 1)})" if f.count else ""
    when = f" from step {step}" if step is not None else ""
    fix = fixtext.first_line(f.fix)
    fix = fix if len(fix) <= 110 else fix[:109] + "…"
    return (f"diagkit: {f.severity}: {f.code}" + (f" in {where}{count}" if where else "")
            + when + (f"; fix: {fix}" if fix else ""))


def comparison_text(cmp, width: int = 100) -> str:
    """A comparison for the terminal: a header line, then one block per finding with its fix."""
    s = cmp.summary
    verdict = _severity_summary(cmp.findings)
    lines = [f"diagkit compare: {s['path_a']} -> {s['path_b']}: {comparison_totals(s)} — "
             f"{verdict or 'no findings'}"]
    for f in cmp.findings:
        where = f.module or ("(whole model)" if f.count else "")
        lines += ["", f"[{f.severity}] {f.code}: {where}  ({f.count} tensor"
                      f"{'s' if f.count != 1 else ''}, {human_bytes(f.bytes)})"]
        lines += textwrap.wrap(f.message, width, initial_indent="  ", subsequent_indent="  ")
        lines += textwrap.wrap(f.fix, width, initial_indent="  fix: ",
                               subsequent_indent="       ", break_on_hyphens=False)
    return "\n".join(lines)


def comparison_totals(s: dict) -> str:
    """'3 tensors in both (1.2 KiB), 2 changed, 1 unchanged, ...' from a comparison summary."""
    parts = [f"{s['in_both']} tensors in both ({human_bytes(s['bytes_in_both'])})",
             f"{s['changed']} changed", f"{s['unchanged']} unchanged"]
    for key, words in (("only_in_a", "only in A"), ("only_in_b", "only in B"),
                       ("shape_mismatch", "with another shape")):
        if s[key]:
            parts.append(f"{s[key]} {words}")
    return ", ".join(parts)
