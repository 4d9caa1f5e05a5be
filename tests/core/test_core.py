"""The bottom layer's one-home concepts: severity, options, formatting, atomic files."""

from __future__ import annotations

import json
import math

import pytest

from diagkit.core import severity
from diagkit.core.errors import DiagkitError, TargetError
from diagkit.core.files import write_json_atomic
from diagkit.core.swap import write_dir_atomic
from diagkit.core.format import (brief, fmt_number, fmt_shape, human_bytes, spans,
                                 truncate_left)
from diagkit.core.options import (CHECKS, DEFAULTS, DELTA_MODES, check_option,
                                  check_run_options, positive_int)


# ------------------------------------------------------------------ severity
def test_severity_order_rank_and_worst():
    assert severity.ORDER == ("error", "warning", "info", "ok")
    assert [severity.rank(s) for s in severity.ORDER] == [3, 2, 1, 0]
    assert severity.rank("nonsense") == 0
    assert severity.worst(["info", "error", "warning"]) == "error"
    assert severity.worst([]) is None


@pytest.mark.parametrize("worst, fail_on, fails", [
    ("error", "error", True), ("warning", "error", False), ("warning", "warning", True),
    ("info", "warning", False), ("info", "info", True), ("error", "never", False),
    (None, "info", False)])
def test_fails_is_the_exit_code_rule(worst, fail_on, fails):
    assert severity.fails(worst, fail_on) is fails


def test_every_severity_has_colours_and_unknown_ones_fall_back():
    assert set(severity.COLORS) == set(severity.ORDER)
    assert severity.colors("bogus") == severity.COLORS["info"]
    assert severity.UNKNOWN in severity.LEVELS


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "5", None])
def test_positive_int_rejects_in_one_line(bad):
    with pytest.raises(DiagkitError) as info:
        positive_int(bad, "steps")
    assert str(info.value) == f"steps must be a positive int (>= 1), got {bad!r}"


def test_checks_raise_the_callers_error_with_its_label():
    with pytest.raises(TargetError, match=r"^'steps' must be a positive int"):
        positive_int(0, "'steps'", error=TargetError)
    with pytest.raises(DiagkitError, match=r"^notebook parameter 'delta' must be one of "
                                           r"exact, sampled, off, got 'fast'$"):
        check_option("delta", "fast", "notebook parameter 'delta'")
    assert check_option("every", 3) == 3


def test_every_checked_option_has_a_default():
    assert set(CHECKS) <= set(DEFAULTS)
    for name in CHECKS:
        assert check_option(name, DEFAULTS[name]) == DEFAULTS[name]
    assert DEFAULTS["delta"] in DELTA_MODES


def test_run_options_are_checked_in_order_steps_first():
    with pytest.raises(DiagkitError, match="^steps"):
        check_run_options(steps=0, delta="fast")
    with pytest.raises(DiagkitError, match="^sample .* per tensor"):
        check_run_options(sample=0)
    check_run_options()  # the defaults pass


# ------------------------------------------------------------------ formatting
def test_formatting():
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 << 20, 3 << 40)] == [
        "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "3072.0 GiB"]
    assert [fmt_number(v) for v in (0.000123456, math.nan, "x", None, 12345)] == [
        "0.000123", "—", "—", "—", "1.23e+04"]
    assert [fmt_shape(s) for s in ((3, 4), (), None)] == ["3×4", "scalar", "—"]
    assert truncate_left("module.metamodel.model.mem_tokens", 12) == "….mem_tokens"
    assert truncate_left("short", 12) == "short"
    assert spans([5, 0, 1, 2, 2]) == "0–2, 5"
    assert brief(ValueError("a\n  b" + "c" * 300)) == ("a b" + "c" * 300)[:200]


# ------------------------------------------------------------------ atomic files
def test_json_is_strict_and_replaced_whole(tmp_path):
    path = tmp_path / "out" / "x.json"
    write_json_atomic(path, {"a": math.nan, "b": (1, 2), "c": math.inf})
    assert json.loads(path.read_text()) == {"a": None, "b": [1, 2], "c": None}
    class Unwritable:
        def __str__(self):
            raise RuntimeError("cannot be written")
    with pytest.raises(RuntimeError):
        write_json_atomic(path, {"a": Unwritable()})  # fails: the old file stays whole
    assert json.loads(path.read_text())["b"] == [1, 2]
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temporary left


def test_a_folder_written_halfway_never_replaces_the_old_one(tmp_path):
    target = tmp_path / "diag"
    write_dir_atomic(target, lambda d: (d / "run.json").write_text("1"))

    def fails(folder):
        (folder / "run.json").write_text("2")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        write_dir_atomic(target, fails)
    assert (target / "run.json").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diag"]
