"""Several runs of a test module in ONE torchrun job (a job's CPU is mostly its start: torchrun
and each rank importing torch, pandas and diagkit, ~8 s per job here): `run_together` runs
programs one after the other in the same ranks, each in a process group of its own (named
apart in torchrun's store); `programs_together` for scripts, `diagnose_together` for
`diagnose_distributed` calls.

`diagnose_together({name: kwargs})` returns {name: Diagnosis or the DiagkitError raised},
each exactly what `diagnose_distributed(**kwargs)` returns, with one difference: the ranks are
not started by the launcher's own `_launch` for each run. Every other part of the call is
the real one:

1. each call is made for real up to its launch: the options checked, the spec written (by
   `diagnose_distributed` itself); `launcher._launch` is patched to keep that spec and stop;
2. one torchrun job (the launcher's command line and environment, `run_job` of
   tests/helpers/jobs.py: no process outlives it) runs `python -m diagkit.run.diagnose.worker
   SPEC` (runpy) for every spec in turn, in the same 2 ranks: each run starts its own process
   group and destroys it;
3. each call is made again, its `_launch` patched to hand it the run folder that run's ranks
   wrote (and torchrun's exit code for it): the launcher assembles, names failures and judges
   as always.

So what `_launch` itself does (starting torchrun, waiting with a deadline, killing a hung or
crashed job, ranks left behind) is NOT checked here: tests of that keep a job of their own.
Only runs whose ranks all reach the end of `worker.main` together can share a job (a rank
that fails alone would leave its peer waiting in a collective); a run whose step fails on
every rank (DDP's reduction error) goes last. And no DTensor (FSDP2) run but as the last of a
job: DTensor caches its redistribution plans with the name of the group they ran on, and a
later group in the same process fails on them ("Could not resolve the process group
registered under the name ...") -- a process's state that one of its own never has.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

from diagkit import DiagkitError
from diagkit.run.diagnose import launcher
from jobs import finished, run_job

RUNNER = '''
import contextlib, json, os, runpy, sys, traceback
from pathlib import Path
from torch.distributed import distributed_c10d as c10d

rank = os.environ["RANK"]
home = Path(__file__).parent
for i, entry in enumerate(json.loads((home / "programs.json").read_text())):
    # Each program's default group gets names of its own in torchrun's store: after a group is
    # destroyed, the next one would be named alike ("0") and read the last one's addresses.
    assert hasattr(c10d._world, "group_count"), "torch names its groups otherwise now"
    c10d._world.group_count = 1000 * (i + 1)
    os.chdir(entry["cwd"])
    sys.argv = [entry.get("path") or entry["module"], *entry["argv"]]
    name, code = entry["name"], 0
    with open(home / "out" / f"{name}.rank{rank}.out", "w") as out, \\
            open(home / "out" / f"{name}.rank{rank}.err", "w") as err, \\
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if "path" in entry:  # as `python PATH`: its folder first on sys.path
                sys.path.insert(0, os.path.dirname(entry["path"]))
                try:
                    runpy.run_path(entry["path"], run_name="__main__")
                finally:
                    sys.path.remove(os.path.dirname(entry["path"]))
            else:
                runpy.run_module(entry["module"], run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    (home / "out" / f"{name}.rank{rank}.exit").write_text(str(code))
'''


class _Kept(Exception):
    """Raised by the patched `_launch` of step 1: the spec is kept, nothing is launched."""


def run_together(programs: list[dict], *, nproc: int = 2, timeout: float = 300,
                 env: dict | None = None, folder: Path,
                 as_launcher: bool = False) -> dict[str, subprocess.CompletedProcess]:
    """One torchrun job of `nproc` ranks (the launcher's options) that runs each program in
    turn, in every rank, as `python PATH ARGV` (`path`) or `python -m MODULE ARGV` (`module`)
    would, in its `cwd`: {name: its exit code (the highest of the ranks'), its ranks' stdout
    and stderr (Python's), rank by rank}. None of the job's processes outlives the call.
    `as_launcher`: the ranks' environment as diagkit's launcher sets it."""
    (folder / "out").mkdir()
    (folder / "programs.json").write_text(json.dumps(programs))
    (folder / "runner.py").write_text(RUNNER)
    job_env = {**(os.environ if env is None else env)}
    if as_launcher:  # as launcher._launch sets them
        job_env["OMP_NUM_THREADS"] = job_env.get("OMP_NUM_THREADS", "1")
        job_env.setdefault("TORCH_DISTRIBUTED_DEBUG", "INFO")
    done = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.5",
                    f"--log-dir={folder / 'torchrun'}", str(folder / "runner.py")],
                   env=job_env, timeout=timeout, cwd=folder)
    log = done.stdout + done.stderr
    assert finished(done.returncode, log), log[-4000:]
    results = {}
    for entry in programs:
        name, out = entry["name"], folder / "out"
        codes = [int((out / f"{name}.rank{r}.exit").read_text()) for r in range(nproc)]
        results[name] = subprocess.CompletedProcess(
            entry, max(codes, key=abs),
            "".join((out / f"{name}.rank{r}.out").read_text() for r in range(nproc)),
            "".join((out / f"{name}.rank{r}.err").read_text() for r in range(nproc)) + log)
    return results


def programs_together(programs: dict[str, dict], **job) -> dict[str, subprocess.CompletedProcess]:
    """{name: {"path": SCRIPT, "argv": [...], "cwd": FOLDER}} run in one job (`run_together`).
    Each script must start its group with `init_process_group` and destroy it at its end, and
    all its ranks must get there (one rank failing alone leaves its peers waiting)."""
    with tempfile.TemporaryDirectory(prefix="diagkit-trun-job-") as tmp:
        return run_together(_entries(programs), folder=Path(tmp), **job)


def _entries(programs: dict[str, dict]) -> list[dict]:
    return [{"name": name, "argv": [], **{k: v if k == "argv" else str(v) for k, v in p.items()}}
            for name, p in programs.items()]


def diagnose_together(calls: dict[str, dict], *, nproc: int = 2, **job) -> dict[str, object]:
    """{name: kwargs of diagnose_distributed} -> {name: its Diagnosis, or the DiagkitError it
    raised} (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="diagkit-trun-job-") as tmp:
        root = Path(tmp)
        programs = []
        for name, kwargs in calls.items():  # 1. the real calls, up to the launch
            run_dir = root / name
            run_dir.mkdir()

            def keep(their_dir, n, _timeout, run_dir=run_dir):
                assert n == nproc, (n, nproc)
                spec = json.loads((their_dir / "spec.json").read_text())
                spec["run_dir"] = str(run_dir)
                (run_dir / "spec.json").write_text(json.dumps(spec))
                raise _Kept

            try:
                with mock.patch.object(launcher, "_launch", keep):
                    launcher.diagnose_distributed(**kwargs, nproc=nproc)
            except _Kept:
                programs.append({"name": name, "module": "diagkit.run.diagnose.worker",
                                 "argv": [str(run_dir / "spec.json")], "cwd": str(run_dir)})
            except DiagkitError:  # refused before any launch: raised again in step 3
                pass
        ran = run_together(programs, nproc=nproc, folder=root, as_launcher=True,
                           **job)  # 2. one job
        results = {}
        for name, kwargs in calls.items():  # 3. the real calls, handed what their ranks wrote
            def handed(their_dir, n, _timeout, name=name):
                for item in (root / name).iterdir():
                    if item.name != "spec.json":
                        shutil.copy2(item, their_dir / item.name)
                # torchrun's exit: 1 when a rank's did not end with 0
                return int(ran[name].returncode != 0), False, ran[name].stderr

            try:
                with mock.patch.object(launcher, "_launch", handed):
                    results[name] = launcher.diagnose_distributed(**kwargs, nproc=nproc)
            except DiagkitError as exc:
                results[name] = exc
    return results
