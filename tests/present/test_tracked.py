"""What lands in a tracker (`present.tracked`): the status, the findings table and its Markdown,
an alert; from a real diagnosis and from findings built by hand."""

from __future__ import annotations

import dataclasses

from diagkit.core.result import Finding
from diagkit.present import tracked
from diagkit.present.text import finding_line
from tracker_runs import ORPHAN, ORPHAN_FIX, orphan_diagnosis


def finding(code="orphan", severity="error", params=("fc2.weight",), module="fc2", fix="do it",
            **more) -> Finding:
    return Finding(code=code, severity=severity, params=params, message="m", fix=fix,
                   module=module, count=len(params), **more)


def test_status_is_the_counts_and_the_worst_severity_info_counting_as_ok():
    assert tracked.status([]) == {tracked.ERRORS: 0, tracked.WARNINGS: 0, tracked.STATUS: "ok"}
    assert tracked.status([finding(severity="info")])[tracked.STATUS] == "ok"
    assert tracked.status([finding(severity="warning")]) == {
        tracked.ERRORS: 0, tracked.WARNINGS: 1, tracked.STATUS: "warning"}
    both = [finding(), finding(severity="warning"), finding(severity="warning")]
    assert tracked.status(both) == {tracked.ERRORS: 1, tracked.WARNINGS: 2,
                                    tracked.STATUS: "error"}
    assert all(type(v) is int for k, v in tracked.status(both).items() if k != tracked.STATUS)
    assert tracked.counts(both) == {tracked.ERRORS: 1.0, tracked.WARNINGS: 2.0}


def test_the_rows_of_a_real_diagnosis_name_each_tensor_once_per_verdict_worst_first():
    diagnosis = orphan_diagnosis()
    rows = tracked.findings_rows(diagnosis)
    assert all(len(row) == len(tracked.TABLE_COLUMNS) for row in rows)
    assert [row[:6] for row in rows] == [
        [ORPHAN, "orphan", "error", "fc2", 60, 0],  # 3 x 5 float32
        ["fc2.bias", "orphan", "error", "fc2", 12, 0],
        [ORPHAN, "grad_not_cleared", "warning", "fc2", 60, 0],
        ["fc2.bias", "grad_not_cleared", "warning", "fc2", 12, 0]]
    assert ORPHAN_FIX in rows[0][6]


def test_rows_take_a_whole_runs_since_leave_info_out_and_name_a_run_level_finding():
    diagnosis = dataclasses.replace(orphan_diagnosis(), findings=[
        finding(severity="info"),
        finding(code="late", severity="warning", since=7),
        finding(code="nonfinite_loss", params=(), module=""),
        finding(code="dead_branch", params=(), module="fc1")])
    assert [row[:2] + row[5:6] for row in tracked.findings_rows(diagnosis)] == [
        ["(run)", "nonfinite_loss", 0], ["fc1", "dead_branch", 0], [ORPHAN, "late", 7]]


def test_the_markdown_is_one_table_whose_cells_keep_their_lines_and_pipes():
    rows = [[ORPHAN, "orphan", "error", "fc2", 60, 0, "Add it:\n    opt.add(a | b)"],
            ["(run)", "nonfinite_loss", "error", None, 0, None, ""]]
    lines = tracked.findings_markdown(rows).splitlines()
    assert lines[0] == "| " + " | ".join(tracked.TABLE_COLUMNS) + " |"
    assert lines[1] == "|---|---|---|---|---|---|---|"
    assert lines[2] == (f"| {ORPHAN} | orphan | error | fc2 | 60 B | 0 | "
                        "Add it:<br>    opt.add(a \\| b) |")
    assert lines[3] == "| (run) | nonfinite_loss | error |  | 0 B |  |  |"
    assert len(lines) == 4
    assert tracked.findings_markdown([]) == "diagkit: no warnings or errors."


def test_an_alert_is_the_verdict_as_title_and_the_logs_line_as_text():
    orphan = orphan_diagnosis().findings[0]
    title, text, level = tracked.alert(orphan, 3)
    assert (title, level) == ("diagkit: orphan in fc2", "error")
    assert text == finding_line(orphan, 3)
    assert text.startswith("diagkit: error: orphan in fc2 (2 tensors) from step 3; fix: ")
    assert tracked.alert(finding(severity="warning"), None)[2] == "warning"
    assert "from step" not in tracked.alert(finding(severity="warning"), None)[1]
