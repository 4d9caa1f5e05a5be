"""What the tests of real torchrun jobs share: telling a job that did its work from one that
did not.

A rank of a job that imports pandas and pyarrow (as `import diagkit` does) can abort *after*
its work, at interpreter teardown, with "terminate called without an active exception"
(SIGABRT, no Python frame left); torchrun then stops the other ranks with SIGTERM. Measured on
this machine in about 1 of 20 two-rank gloo jobs that only `import diagkit` and never watch
(0 of 24 without the import): not diagkit's hooks or gathering. A job whose only fault is that
is judged by what it wrote and printed, which every test checks in full.
"""

from __future__ import annotations

import re

TEARDOWN_ABORT = "terminate called without an active exception"


def finished(returncode: int, output: str) -> bool:
    """The job exited 0, or its only fault is a rank's abort at teardown (see above): every
    failed rank aborted (-6) or was stopped by torchrun after it (-15)."""
    if returncode == 0:
        return True
    if returncode in (-6, 134):  # a rank run as a process of its own, not under torchrun
        return TEARDOWN_ABORT in output
    codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", output))
    return TEARDOWN_ABORT in output and "-6" in codes and codes <= {"-6", "-15"}


def all_finished(returncodes: list[int], outputs: list[str]) -> bool:
    """Several launchers of one job (nodes): each finished, or one node's rank aborted at
    teardown, which makes torchrun on the other nodes fail in its own words (a closed
    rendezvous) after the work was done."""
    if all(finished(code, out) for code, out in zip(returncodes, outputs)):
        return True
    return any(TEARDOWN_ABORT in out and finished(code, out)
               for code, out in zip(returncodes, outputs))
