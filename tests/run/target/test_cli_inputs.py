"""The command line's own pieces for bad input (issue 36, R11 and R18), in this process: the
console that any text can be printed to, the report parameters a notebook cannot hold, the
lookup of a path the user typed, and the line a `compare --timeout` ends with. The console
script itself meets the bad input in tests/e2e/test_cli_bad_input.py."""

from __future__ import annotations

import io
import os
import sys

import pytest

from diagkit.core.errors import DiagkitError
from diagkit.run.target import cli_run, deadline
from diagkit.run.target.paths import check_lookup

PRINTED = "a → b ≤ c · d — e α f"


def _console(encoding: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict",
                            write_through=True)


def test_an_ascii_console_gets_ascii_spellings_not_an_encoding_error(monkeypatch):
    out, err = _console("ascii"), _console("latin-1")
    monkeypatch.setattr(sys, "stdout", out)  # here, not in a fixture: pytest's capture
    monkeypatch.setattr(sys, "stderr", err)  # sets its own streams again before the test
    with pytest.raises(UnicodeEncodeError):  # what the command line died of
        print(PRINTED, file=_console("ascii"))
    cli_run.safe_console()
    print(PRINTED, file=out)
    print(PRINTED, file=err)
    assert out.buffer.getvalue() == b"a -> b <= c - d -- e \\u03b1 f\n"
    # Latin-1 shows the characters it has; only the rest are spelled in ASCII
    assert err.buffer.getvalue().decode("latin-1") == "a -> b <= c · d -- e \\u03b1 f\n"


def test_a_file_name_that_is_not_utf8_prints_on_a_utf8_console(monkeypatch):
    """Python keeps a name's non-UTF-8 bytes as surrogates, which UTF-8 cannot encode."""
    out = _console("utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    cli_run.safe_console()
    print(os.fsdecode(b"poids-\xe9.pt"), "→", file=out)
    assert out.buffer.getvalue().decode("utf-8") == "poids-\\udce9.pt →\n"


def test_report_parameters_must_be_utf8_text():
    cli_run.check_notebook_text({"checkpoint": "données.pt", "steps": 3, "args": {"k": "v"}})
    with pytest.raises(DiagkitError, match=r"checkpoint_a 'poids-\\udce9.pt' is not UTF-8"):
        cli_run.check_notebook_text({"checkpoint_a": os.fsdecode(b"poids-\xe9.pt")})
    with pytest.raises(DiagkitError, match="target_args"):
        cli_run.check_notebook_text({"target_args": {"path": os.fsdecode(b"\xff")}})


@pytest.mark.parametrize("case, reason", [
    ("loop", "symbolic link loop"),
    ("long", "File name too long"),
])
def test_check_lookup_names_the_path_and_the_reason(tmp_path, case, reason):
    if case == "loop":
        (tmp_path / "x").symlink_to(tmp_path / "x")
        path = tmp_path / "x"
    else:
        path = tmp_path / ("n" * 300)
    with pytest.raises(DiagkitError) as info:
        check_lookup(path, "--from")
    assert str(info.value) == f"--from {path}: {reason}"


def test_check_lookup_leaves_a_missing_path_to_its_reader(tmp_path):
    (tmp_path / "file").write_text("x")
    check_lookup(tmp_path / "missing", "--from")  # "does not exist": the reader's line
    check_lookup(tmp_path / "file" / "below", "--from")  # "not a folder": likewise
    check_lookup(tmp_path / "file", "--from")


def test_the_line_a_compare_timeout_ends_with():
    clock = deadline.Deadline.__new__(deadline.Deadline)  # its message only: no thread
    clock.seconds, clock.phase, clock.step = 5, "comparing", None
    assert clock.message() == ("timed out after 5 s (--timeout) while comparing the "
                               "checkpoints")
    clock.phase = "importing"
    assert clock.message().endswith("while importing the target")
    clock.phase = "building"
    assert clock.message().endswith("while building the setup")
