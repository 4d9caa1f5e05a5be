"""The command line's checks that several test modules share: `run` (the CLI in this process,
`cli_inprocess.run_cli`, with the debug switch off) and `assert_one_line_error` (exit 2, one line
on stderr, no traceback: docs/cli.md, "Command line")."""

from __future__ import annotations

import subprocess

from cli_inprocess import run_cli

TIMEOUT = 300


def run(*args, cwd) -> subprocess.CompletedProcess:
    """The command line, in this process."""
    return run_cli(*args, cwd=cwd, env={"DIAGKIT_DEBUG": None}, timeout=TIMEOUT)



def assert_one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    # `diagkit demo` reports progress on stderr; everything else there must be the one reason
    lines = [line for line in proc.stderr.strip().splitlines()
             if not line.startswith("diagkit: diagnosing ")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("diagkit: error:"), lines[0]
    return lines[0]
