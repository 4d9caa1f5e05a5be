"""What the tests of real jobs (torchrun, several processes) share: running a job so that none
of its processes outlives it, and telling a job that did its work from one that did not.

torchrun starts each rank in a session of its own, so killing torchrun's process group misses
the ranks (they are re-parented to init and live on). Every process of a job started here
carries an environment variable unique to that job (`DIAGKIT_TEST_JOB`, inherited by torchrun
and its ranks); when the job ends, however it ends, every process that carries it is killed,
and the call returns only once they are gone.

A rank that exits with its gloo process group still alive can abort *after* its work, at
interpreter teardown, with "terminate called without an active exception" (SIGABRT, no Python
frame left; torchrun then stops the other ranks with SIGTERM): torch's own, reproduced without
diagkit by `benchmarks/gloo_teardown_abort.py --ending no-destroy` (docs/development.md, "Tests").
Every job diagkit and these tests run destroys its group, so it should not happen; a job whose
only fault is that is still judged by what it wrote and printed, which every test checks in
full. Twice, on a loaded machine, a job was judged finished without rank 0's file: the one
path that allows it is the other rank aborting first and torchrun stopping rank 0 before it
wrote. So each program here meets at a barrier after rank 0 wrote, before it destroys its group,
and a missing file is reported with the job's output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

TEARDOWN_ABORT = "terminate called without an active exception"
JOB_MARKER = "DIAGKIT_TEST_JOB"


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


# ------------------------------------------------------------------ no process outlives a job
def carrying(name: str, value: str) -> dict[int, str]:
    """{pid: command line} of the processes whose environment holds name=value, this one and
    its ancestors left out (they may have inherited it: a nested run)."""
    entry = f"\0{name}={value}\0".encode()
    mine = _ancestors()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in mine:
            continue
        try:
            if entry in b"\0" + (proc / "environ").read_bytes() + b"\0":
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").strip()
                found[int(proc.name)] = cmd.decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _ancestors() -> set[int]:
    """This process and its parents up to init."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: ppid
    return pids


def kill_carrying(name: str, value: str, wait_s: float = 15.0) -> dict[int, str]:
    """SIGKILL every process that carries name=value, and wait until the kernel has ended them
    (a loaded machine takes a moment). Returns those that were found alive."""
    found = carrying(name, value)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    gone_by = time.monotonic() + wait_s
    while carrying(name, value) and time.monotonic() < gone_by:
        time.sleep(0.05)
    return found


@contextmanager
def marked(env: dict | None = None):
    """An environment for one job: `env` (default: this process's) plus a marker unique to the
    job. On exit every process carrying the marker is killed and waited for."""
    tag = uuid.uuid4().hex
    try:
        yield {**(os.environ if env is None else env), JOB_MARKER: tag}
    finally:
        kill_carrying(JOB_MARKER, tag)


@contextmanager
def marked_here():
    """The marker set in this process's own environment, for jobs that a library call launches
    (diagnose_distributed); yields the marker. The ranks of that call inherit it, so a test can
    ask whether any of *its own* ranks outlived the call; the rest are killed on exit."""
    tag, before = uuid.uuid4().hex, os.environ.get(JOB_MARKER)
    os.environ[JOB_MARKER] = tag
    try:
        yield tag
    finally:
        if before is None:
            os.environ.pop(JOB_MARKER, None)
        else:
            os.environ[JOB_MARKER] = before
        kill_carrying(JOB_MARKER, tag)


def run_job(cmd: list[str], *, timeout: float, env: dict | None = None,
            **popen) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, capture_output=True, text=True)` for a job of several processes:
    on return, on timeout or on any error, none of the job's processes is left (subprocess.run
    kills only the first one on a timeout; torchrun's ranks would live on)."""
    with marked(env) as job_env:
        proc = subprocess.Popen(cmd, env=job_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                **popen)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            # every process of the job first: one that left the session holds the pipes open
            kill_carrying(JOB_MARKER, job_env[JOB_MARKER])
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun_program(folder: Path, program: str, nproc: int, env: dict, timeout: float):
    """Run `program` (its source) as `job.py out.json` under a real torchrun of `nproc`
    processes in `folder`, leaving none behind; rank 0's JSON from `out.json`."""
    import json
    import sys

    (folder / "job.py").write_text(program)
    done = run_job([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                    "--max-restarts=0", "--standalone", "job.py", "out.json"],
                   cwd=folder, env=env, timeout=timeout)
    assert finished(done.returncode, done.stdout + done.stderr), done.stderr[-4000:]
    assert (folder / "out.json").exists(), (
        f"torchrun exited {done.returncode} without rank 0's out.json:\n{done.stderr[-4000:]}")
    return json.loads((folder / "out.json").read_text())


def same_norm(a, b, rel: float = 1e-5) -> bool:
    """Two norms read back from a job's JSON agree: both missing (None or NaN), or within
    `rel` of each other (the oracles the engine tests compare against)."""
    import math

    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return (a is None or math.isnan(a)) == (b is None or math.isnan(b))
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)
