"""A busy neighbour: another job on the machine while `make test` runs (benchmarks/README.md,
"The suite beside another job").

The suite must pass, delete nothing of another job's and keep its time goal on a shared
machine. This is that other job: over and over, a two-rank torchrun job (gloo, a small model
training for a few seconds) and a headless Chromium printing a page, both in the machine's own
temporary folder as any job would (`torchelastic_*`, `org.chromium.Chromium.*` appear there).
At the end it says how many rounds it ran and whether a `torchelastic_*` folder that appeared
while its own job ran disappeared before that job ended (a rough sign that someone deleted it).

    python benchmarks/neighbour.py --seconds 1200 &   # then, beside it: time make test

It stops after `--seconds` or on SIGTERM / SIGINT, and leaves nothing running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK_SCRIPT = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.monotonic() + float(os.environ["NEIGHBOUR_SECONDS"])
while time.monotonic() < end:
    opt.zero_grad(); model(torch.randn(64, 256)).sum().backward(); opt.step()
dist.destroy_process_group()
"""

PAGE = "<html><body><h1>neighbour</h1>" + "<p>text</p>" * 2000 + "</body></html>"


def machine_tmp() -> Path:
    """The machine's temporary folder, not one a caller set for us: the neighbour of a suite
    uses the same `/tmp` as everyone."""
    return Path("/tmp")


def listing(tmp: Path) -> set[str]:
    try:
        return {p.name for p in tmp.iterdir()
                if p.name.startswith(("torchelastic_", "org.chromium.Chromium."))}
    except OSError:
        return set()


def torchrun_job(workdir: Path, seconds: float) -> subprocess.Popen:
    script = workdir / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    env.update(NEIGHBOUR_SECONDS=str(seconds), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", str(script)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def chromium_job(workdir: Path) -> subprocess.Popen | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None
    page = workdir / "page.html"
    page.write_text(PAGE)
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    return subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu",
                             f"--user-data-dir={workdir / 'profile'}",
                             f"--print-to-pdf={workdir / 'page.pdf'}", page.as_uri()],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1200.0)
    parser.add_argument("--job-seconds", type=float, default=20.0)
    args = parser.parse_args()
    ending = []
    signal.signal(signal.SIGTERM, lambda *_: ending.append(1))
    signal.signal(signal.SIGINT, lambda *_: ending.append(1))
    tmp = machine_tmp()
    workdir = Path(tempfile.mkdtemp(prefix="neighbour-", dir=tmp))
    before, mine, vanished, jobs = listing(tmp), set(), set(), 0
    end = time.monotonic() + args.seconds
    running: list[subprocess.Popen | None] = []
    try:
        while time.monotonic() < end and not ending:
            running = [torchrun_job(workdir, args.job_seconds), chromium_job(workdir)]
            while any(p is not None and p.poll() is None for p in running):
                now = listing(tmp) - before
                vanished |= {n for n in mine - now if n.startswith("torchelastic_")
                             and running[0].poll() is None}
                mine |= now
                if ending or time.monotonic() > end:
                    break
                time.sleep(0.5)
            for p in running:
                stop(p)
            jobs += 1
    finally:
        for p in running:
            stop(p)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"neighbour: {jobs} rounds (torchrun + chromium); {len(mine)} folders of its own "
          f"seen in {tmp}; deleted by someone else while in use: {sorted(vanished) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
