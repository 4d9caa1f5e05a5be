"""`print(diagnosis)` shows the findings (severity, verdict, where, message, the fix's code
unwrapped), `repr` stays one short line, and a finding's log line is short."""

from __future__ import annotations

import torch

import diagkit
from diagkit.core import fixtext
from diagkit.present.text import finding_line
from models import TwoHeads, two_heads_groups


def _diagnosis():
    torch.manual_seed(0)
    model = TwoHeads()
    optimizer = torch.optim.SGD(two_heads_groups(dict(model.named_parameters()), planted=True),
                                lr=0.05)
    w = diagkit.watch(model, optimizer, steps=4, live=False)
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).backward()
        optimizer.step()
    return w.diagnosis


def test_print_shows_each_finding_with_its_fix_and_repr_stays_short():
    diag = _diagnosis()
    text = str(diag)
    assert diag.findings
    for f in diag.findings:
        row = next(line for line in text.splitlines() if line.startswith(f.severity))
        assert f.code in row and f.module in row
        code = fixtext.first_code(f.fix)
        for line in code.splitlines():  # code is printed whole, never wrapped mid-expression
            assert any(printed.strip() == line.strip() for printed in text.splitlines()), line
    assert "\n" not in repr(diag) and repr(diag).startswith("<Diagnosis")


def test_a_findings_log_line_is_one_short_line_with_its_step_and_first_fix_line():
    diag = _diagnosis()
    for f in diag.findings:
        line = finding_line(f, 7)
        assert "\n" not in line and len(line) <= 220, line
        assert f"{f.severity}: {f.code}" in line and "from step 7" in line
        first = fixtext.first_line(f.fix)
        assert first[:60] in line
