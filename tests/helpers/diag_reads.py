"""Reading a `Diagnosis` in the zoo's tests (tests/e2e/test_zoo*.py): one tensor's values of a
steps column, its one params row, the exact verdict set of every tensor, the findings' codes."""

from __future__ import annotations

OK = {"ok"}


def col(diag, name, column):
    """One tensor's values of a steps column, in step order, as a numpy array."""
    s = diag.steps[diag.steps["name"] == name].sort_values("step")
    return s[column].to_numpy()


def prow(diag, name):
    """The one params row of tensor `name` (fails the test if there is none, or several)."""
    rows = diag.params[diag.params["name"] == name]
    assert len(rows) == 1, f"expected one params row named {name!r}, got {len(rows)}"
    return rows.iloc[0]


def assert_verdicts(diag, expected: dict[str, set[str]]):
    """`expected` names every tensor row: exact verdict sets, nothing more, nothing less."""
    assert diag.verdicts() == expected


def codes(diag):
    """The codes of the diagnosis' findings, as a set."""
    return {f.code for f in diag.findings}
