"""What lands in an experiment tracker, from a diagnosis (docs/integrations.md, "Trackers").

Pure: a diagnosis or a finding in, plain values out. Each tracker (`diagkit.run.trackers`) puts
them in its own idiom: summary values, a series per observed step, one table, an alert. Names are
fixed (`diagkit/errors`, `diagkit/warnings`, `diagkit/status`) so a tracker's own alerts and an
agent reading runs can key on them; the text is the short finding line of the log
(`present.text.finding_line`), so a tracker's alert reads as the notebook's chip does.
"""

from __future__ import annotations

from ..core import severity
from ..core.format import human_bytes
from .text import finding_line

ERRORS, WARNINGS, STATUS = "diagkit/errors", "diagkit/warnings", "diagkit/status"
TABLE_KEY = "diagkit/findings"
# One row per tensor and non-ok verdict; `from_step` is the first observed step it held on (a
# whole run) or the window's first step, `fix` the finding's whole fix (words, then code).
TABLE_COLUMNS = ("name", "verdict", "severity", "module", "bytes", "from_step", "fix")


def counts(findings) -> dict[str, float]:
    """The numbers of a step or of the end: errors and warnings among `findings`."""
    return {ERRORS: float(sum(f.severity == "error" for f in findings)),
            WARNINGS: float(sum(f.severity == "warning" for f in findings))}


def status(findings) -> dict:
    """The summary: the counts, and `diagkit/status` ("ok", "warning" or "error": the worst
    finding's severity, info counting as ok)."""
    worst = severity.worst(f.severity for f in findings)
    word = worst if worst in ("error", "warning") else "ok"
    return {**{k: int(v) for k, v in counts(findings).items()}, STATUS: word}


def findings_rows(diagnosis, offset: int = 0) -> list[list]:
    """The findings table's rows (`TABLE_COLUMNS`): every tensor a warning or an error names,
    once per verdict, worst first. A finding without tensors (a run-level one) is one row named
    after its module, or '(run)'. `offset`: the tracker's step of diagkit's step 0 (its
    `from_step` is on the tracker's axis, as the series are)."""
    sizes = dict(zip(diagnosis.params["name"], diagnosis.params["bytes"]))
    rows = []
    for f in sorted(diagnosis.findings, key=lambda f: -severity.rank(f.severity)):
        if f.severity not in ("error", "warning"):
            continue
        start = f.since if f.since is not None else _first_step(diagnosis)
        start = None if start is None else start + offset
        for name in f.params or (f.module or "(run)",):
            rows.append([name, f.code, f.severity, f.module, int(sizes.get(name, 0) or 0),
                         start, f.fix])
    return rows


def findings_markdown(rows: list[list]) -> str:
    """The table as Markdown (TensorBoard's text tab renders it); a fix's code keeps its lines
    as `<br>` inside the cell, and '|' is escaped."""
    if not rows:
        return "diagkit: no warnings or errors."
    head = "| " + " | ".join(TABLE_COLUMNS) + " |\n|" + "---|" * len(TABLE_COLUMNS) + "\n"
    return head + "\n".join("| " + " | ".join(_cell(c, i) for i, c in enumerate(row)) + " |"
                            for row in rows)


def alert(finding, step: int | None) -> tuple[str, str, str]:
    """(title, text, level) of a tracker alert for a new finding: the title names the verdict
    and the module (W&B holds back a title it sent in the last minute), the text is the log's
    one line (README, "Reading a finding")."""
    level = "error" if finding.severity == "error" else "warning"
    where = f" in {finding.module}" if finding.module else ""
    return f"diagkit: {finding.code}{where}", finding_line(finding, step), level


def _first_step(diagnosis) -> int | None:
    steps = diagnosis.steps
    return int(steps["step"].min()) if len(steps) else None


def _cell(value, index: int) -> str:
    if TABLE_COLUMNS[index] == "bytes":
        value = human_bytes(value)
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", "<br>")
