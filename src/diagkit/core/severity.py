"""Severity: the one home of its order, its rank and its colours.

Findings carry `error`, `warning` or `info`; a clean tensor is `ok`. Every table, figure, the
explorer and the exit code of the CLI rank and colour by what is written here.
"""

from __future__ import annotations

from collections.abc import Iterable

LEVELS = ("error", "warning", "info")          # a finding's severity, worst first
ORDER = (*LEVELS, "ok")                         # with the clean state last
RANK = {"error": 3, "warning": 2, "info": 1, "ok": 0}
FAIL_ON = (*LEVELS, "never")                   # thresholds of --fail-on
UNKNOWN = "warning"  # a verdict this version does not know (a newer save): surface it

# severity -> (background, text colour). The report's CSS classes use the same backgrounds.
COLORS = {
    "error": ("#fdd", "#b00020"),
    "warning": ("#ffe7b3", "#8a5300"),
    "info": ("#e3efff", "#1a4f8b"),
    "ok": ("#e8f5e9", "#2e7d32"),
}


def rank(severity: str) -> int:
    """3 for error down to 0 for ok (and for anything unknown)."""
    return RANK.get(severity, 0)


def named(level_rank: int) -> str:
    """The severity of a rank (the inverse of `rank`): 3 -> 'error', ..., 0 -> 'ok'."""
    return ORDER[len(LEVELS) - int(level_rank)]


def worst(severities: Iterable[str]) -> str | None:
    """The highest of `severities`, or None when there are none."""
    return max(severities, key=rank, default=None)


def fails(worst_severity: str | None, fail_on: str) -> bool:
    """Whether a run whose worst finding is `worst_severity` fails under `--fail-on`."""
    if fail_on == "never" or worst_severity is None:
        return False
    return rank(worst_severity) >= rank(fail_on)


def colors(severity: str) -> tuple[str, str]:
    """(background, text colour) of a severity; info's for anything unknown."""
    return COLORS.get(severity, COLORS["info"])
