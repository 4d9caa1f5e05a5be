"""Several `diagnose_distributed` runs of a test module in ONE torchrun job (its CPU is mostly
the start: torchrun and each rank importing torch, pandas and diagkit, ~8 s per job here).

`diagnose_together({name: kwargs})` returns {name: Diagnosis or the DiagkitError raised},
each exactly what `diagnose_distributed(**kwargs)` returns, with one difference: the ranks are
not started by the launcher's own `_launch` for each run. Every other part of the call is
the real one:

1. each call is made for real up to its launch: the options checked, the spec written (by
   `diagnose_distributed` itself); `launcher._launch` is patched to keep that spec and stop;
2. one torchrun job (the launcher's command line and environment, `tests/jobs.run_job`: no
   process outlives it) runs `diagkit.run.worker.main(spec)` for every spec in turn, in the
   same 2 ranks: each run starts its own process group and destroys it, as a rank does;
3. each call is made again, its `_launch` patched to hand it the run folder that run's ranks
   wrote (and torchrun's exit code for it): the launcher assembles, names failures and judges
   as always.

So what `_launch` itself does (starting torchrun, waiting with a deadline, killing a hung or
crashed job, ranks left behind) is NOT checked here: tests of that keep a job of their own.
Only runs whose ranks all reach the end of `worker.main` together can share a job (a rank
that fails alone would leave its peer waiting in a collective); a run whose step fails on
every rank (DDP's reduction error) goes last.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from unittest import mock

from diagkit import DiagkitError
from diagkit.run import launcher
from jobs import finished, run_job

RUNNER = '''
import os, socket, sys
from datetime import timedelta
from pathlib import Path
import torch.distributed as dist
from diagkit.run import worker

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# torchrun's own store, for what the runs do not share: each run's process group gets a store
# of its own (its keys would otherwise meet the previous run's: `init_process_group` names
# every default group alike), on a port that rank 0 chooses and hosts.
agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False, timeout=timedelta(seconds=120))
for i, spec in enumerate(sys.argv[1:]):
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            agent.set(f"trun/port{i}", str(s.getsockname()[1]))
    os.environ["MASTER_PORT"] = agent.get(f"trun/port{i}").decode()
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    code = worker.main([spec])
    (Path(spec).parent.parent / "exits" / f"{Path(spec).parent.name}.rank{rank}").write_text(
        str(code))
    agent.set(f"trun/done{i}/{rank}", "1")  # every rank out of this run before the next
    agent.wait([f"trun/done{i}/{r}" for r in range(world)])
'''


class _Kept(Exception):
    """Raised by the patched `_launch` of step 1: the spec is kept, nothing is launched."""


def diagnose_together(calls: dict[str, dict], *, nproc: int = 2, timeout: float = 300,
                      env: dict | None = None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="diagkit-trun-job-") as tmp:
        root = Path(tmp)
        (root / "exits").mkdir()
        specs = []
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
                specs.append(str(run_dir / "spec.json"))
            except DiagkitError:  # refused before any launch: raised again in step 3
                pass
        (root / "runner.py").write_text(RUNNER)
        job_env = {**(os.environ if env is None else env)}  # 2. one job runs them all
        job_env["OMP_NUM_THREADS"] = job_env.get("OMP_NUM_THREADS", "1")
        job_env.setdefault("TORCH_DISTRIBUTED_DEBUG", "INFO")  # as launcher._launch sets them
        done = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={nproc}", "--max-restarts=0",
                        "--monitor-interval=0.5", f"--log-dir={root / 'torchrun'}",
                        str(root / "runner.py"), *specs], env=job_env, timeout=timeout)
        log = done.stdout + done.stderr
        assert finished(done.returncode, log), log[-4000:]
        results = {}
        for name, kwargs in calls.items():  # 3. the real calls, handed what their ranks wrote
            ran = root / name
            exits = [(root / "exits" / f"{name}.rank{r}") for r in range(nproc)]
            code = 0 if all(e.is_file() and e.read_text() == "0" for e in exits) else 1

            def handed(their_dir, n, _timeout, ran=ran, code=code):
                for item in ran.iterdir():
                    if item.name != "spec.json":
                        shutil.copy2(item, their_dir / item.name)
                return code, False, log

            try:
                with mock.patch.object(launcher, "_launch", handed):
                    results[name] = launcher.diagnose_distributed(**kwargs, nproc=nproc)
            except DiagkitError as exc:
                results[name] = exc
    return results
