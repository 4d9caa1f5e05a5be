"""The command line's own pieces for bad input (issue 36, R11), in this process: the line
a `compare --timeout` ends with. The console script itself meets the bad input in
tests/e2e/test_cli_bad_input.py."""

from __future__ import annotations

from diagkit.run import deadline


def test_the_line_a_compare_timeout_ends_with():
    clock = deadline.Deadline.__new__(deadline.Deadline)  # its message only: no thread
    clock.seconds, clock.phase, clock.step = 5, "comparing", None
    assert clock.message() == ("timed out after 5 s (--timeout) while comparing the "
                               "checkpoints")
    clock.phase = "importing"
    assert clock.message().endswith("while importing the target")
    clock.phase = "building"
    assert clock.message().endswith("while building the setup")
