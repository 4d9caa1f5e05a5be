"""`diagkit.watch` in ordinary programs written without diagkit (examples/): a monolithic
`main()` loop and a torchrun DDP job, on one node and on two nodes of two processes each,
launched by real torchrun. Each program gains at most 3 lines, marked `# diagkit`.

The DDP example on one node, with its diagkit lines and without them, runs in one torchrun
job (`one_node`, tests/helpers/ranks_one_job.py: one program after the other in the same ranks, each
with a process group of its own); the two nodes and the hanging rank keep a job each."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import diagkit
from jobs import all_finished, finished, marked, run_job
from ranks_one_job import programs_together

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": str(ROOT / "src")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*launcher: str, script: tuple[str, ...] = ()) -> list[str]:
    """A real torchrun of the DDP example, 2 processes on this node."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
            "--max-restarts=0", *launcher, str(EXAMPLES / "torchrun_ddp.py"), *script]


def run(cmd, cwd, timeout=240):
    """The job, to its end: none of its processes (torchrun's ranks) is left when it returns."""
    done = run_job(cmd, cwd=cwd, env=ENV, timeout=timeout)
    assert finished(done.returncode, done.stdout + done.stderr), \
        done.stdout[-2000:] + done.stderr[-4000:]
    return done


def test_plain_main_loop_finds_the_name_filter_and_the_dead_module(tmp_path):
    out = run([sys.executable, str(EXAMPLES / "plain_loop.py")], tmp_path)
    diag = diagkit.load(tmp_path / "diag")
    v = diag.verdicts()
    assert v["head.weight"] == {"orphan", "grad_not_cleared"} == v["head.bias"]
    assert v["aux_proj.weight"] == {"unused"} == v["aux_proj.bias"]
    assert v["encoder.0.weight"] == {"ok"} == v["encoder.2.weight"]
    assert diag.meta["steps_observed"] == 10 and "10 steps observed — 1 error" in out.stdout
    # later, anywhere: the saved watch result renders without running anything
    cli = subprocess.run([sys.executable, "-m", "diagkit.run.cli.commands", "report", "--from", "diag",
                          "--out", "report"], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=240)
    assert cli.returncode == 1, cli.stderr[-2000:]  # findings at the default --fail-on error
    html = re.sub(r"<wbr/?>", "", (tmp_path / "report" / "report.html").read_text())
    assert "orphan" in html and "aux_proj" in html and "head.weight" in html


def without_diagkit(name: str, folder: Path) -> Path:
    """The example `name` with its `# diagkit` lines taken out, written into `folder`."""
    source = (EXAMPLES / name).read_text().splitlines()
    plain = folder / name
    plain.write_text("\n".join(line for line in source
                               if not line.rstrip().endswith("# diagkit")) + "\n")
    return plain


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """One torchrun job (2 processes, --standalone) of the DDP example: first without its
    diagkit lines (in plain/), then as it is (in watched/). {name: (folder, its result)}."""
    root = tmp_path_factory.mktemp("one_node")
    (root / "plain").mkdir()
    (root / "watched").mkdir()
    ran = programs_together({
        "plain": {"path": without_diagkit("torchrun_ddp.py", root / "plain"),
                  "cwd": root / "plain"},
        "watched": {"path": EXAMPLES / "torchrun_ddp.py", "cwd": root / "watched"}}, env=ENV)
    return {name: (root / name, done) for name, done in ran.items()}


def one_node_run(one_node, name):
    """(folder, result) of one program of the job, once every rank ended it well."""
    folder, done = one_node[name]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return folder, done


@pytest.mark.parametrize("name", ["plain_loop.py", "torchrun_ddp.py"])
def test_examples_gain_at_most_three_lines_and_run_without_them(tmp_path, name, one_node):
    source = (EXAMPLES / name).read_text().splitlines()
    marked = [line for line in source if line.rstrip().endswith("# diagkit")]
    assert 1 <= len(marked) <= 3
    plain = without_diagkit(name, tmp_path)
    assert "diagkit" not in plain.read_text().replace("# diagkit", "").split('"""', 2)[2]
    if name == "plain_loop.py":
        run([sys.executable, str(plain)], tmp_path)
        assert not (tmp_path / "diag").exists()
    else:  # the same file, run under torchrun --standalone --nproc-per-node=2 (one_node)
        folder, _ = one_node_run(one_node, "plain")
        assert (folder / name).read_text() == plain.read_text()
        assert not (folder / "diag").exists()


def test_torchrun_one_node_late_unfreeze_is_rank_divergent(one_node):
    folder, out = one_node_run(one_node, "watched")
    assert "backbones identical across ranks: False" in out.stdout
    diag = diagkit.load(folder / "diag")
    v = diag.verdicts()
    assert v["backbone.0.weight"] == {"rank_divergent"} == v["backbone.0.bias"]
    assert v["head.weight"] == {"ok"} == v["head.bias"]  # DDP keeps the head in sync
    assert sorted(diag.steps["rank"].unique()) == [0, 1] and "checksum" in diag.steps
    assert diag.meta["nproc"] == 2 and diag.failure is None
    # DDP's own account agrees: it was built when only the head's 2 tensors required grad
    assert diag.advice["find_unused_parameters"]["ddp"]["num_parameter_tensors"] == 2
    fix = next(f for f in diag.findings if f.code == "rank_divergent").fix
    assert "DDP" in fix


def launch_two_nodes(root: Path):
    """Two torchrun launchers forming one 2 x 2 job; (folders, codes, logs), or None when the
    rendezvous never formed in 120 s. Either way, no process of the job outlives this call."""
    port, nodes, procs = free_port(), [root / "node0", root / "node1"], []
    with marked(ENV) as env:
        for rank, cwd in enumerate(nodes):
            cwd.mkdir(parents=True)
            procs.append(subprocess.Popen(
                torchrun("--nnodes=2", f"--node-rank={rank}", f"--rdzv-endpoint=127.0.0.1:{port}"),
                cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True))
        try:
            logs = [p.communicate(timeout=120)[0] for p in procs]
        except subprocess.TimeoutExpired:
            return None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.stdout.close()
                p.wait()
    return nodes, [p.returncode for p in procs], logs


def test_torchrun_two_nodes_of_two_processes(tmp_path):
    """Two launchers on this machine form one 4-rank job over 127.0.0.1; only rank 0 writes.
    A rendezvous that never forms (its free port taken meanwhile, seen once in CI) is retried
    once on a fresh port."""
    ran = launch_two_nodes(tmp_path / "a") or launch_two_nodes(tmp_path / "b")
    assert ran is not None, "the two launchers never formed a job (twice)"
    nodes, codes, logs = ran
    assert all_finished(codes, logs), "\n".join(log[-3000:] for log in logs)
    diag = diagkit.load(nodes[0] / "diag")
    assert not (nodes[1] / "diag").exists()
    assert sorted(diag.steps["rank"].unique()) == [0, 1, 2, 3]
    assert diag.steps.groupby("rank")["step"].nunique().tolist() == [4, 4, 4, 4]
    v = diag.verdicts()
    assert v["backbone.0.weight"] == {"rank_divergent"} and v["head.weight"] == {"ok"}


def test_a_hanging_rank_is_named_and_the_others_steps_are_kept(tmp_path):
    """Rank 1 stops after two steps; rank 0 reports within the watch's timeout (8 s). The
    job is then killed, the hanging rank included (it is in a session of its own)."""
    with marked(ENV) as env:
        proc = subprocess.Popen(torchrun("--standalone",
                                         script=("--no-ddp-sync", "--hang-rank=1")),
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not (tmp_path / "diag" / "run.json").exists():
                assert time.monotonic() < deadline and proc.poll() is None, \
                    "no diagnosis written"
                time.sleep(0.2)
        finally:
            proc.kill()
            proc.wait()
    diag = diagkit.load(tmp_path / "diag")
    per_rank = diag.steps.groupby("rank")["step"].nunique().to_dict()
    assert per_rank == {0: 4, 1: 2}
    assert diag.failure is not None and "rank 1 did not finish within 8 s" in diag.failure.error


def test_a_run_shorter_than_steps_is_saved_when_the_process_exits(tmp_path):
    """Training ended before `steps` were observed and nobody called stop(): the process's
    exit ends the watch, judges the steps it saw and writes `out`."""
    script = tmp_path / "short.py"
    script.write_text(
        "import torch, diagkit\n"
        "model = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "w = diagkit.watch(model, opt, steps=50, out='diag')\n"
        "for _ in range(3):\n"
        "    opt.zero_grad(); model(torch.ones(2, 3)).sum().backward(); opt.step()\n"
        "print('trained')\n")
    out = run([sys.executable, str(script)], tmp_path)
    assert "trained" in out.stdout
    diag = diagkit.load(tmp_path / "diag")
    assert diag.meta["steps_observed"] == 3 and diag.failure is None
    assert set().union(*diag.verdicts().values()) == {"ok"}


def test_report_true_renders_the_html_report_beside_the_saved_diagnosis(tmp_path):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    w = diagkit.watch(model, opt, steps=2, out=tmp_path / "diag", report=True)
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
    html = re.sub(r"<wbr/?>", "", (tmp_path / "diag" / "report" / "report.html").read_text())
    assert w.done and "orphan" in html and "1.weight" in html
    assert diagkit.load(tmp_path / "diag").verdicts() == w.diagnosis.verdicts()
    with pytest.raises(diagkit.DiagkitError, match="needs out=DIR"):
        diagkit.watch(model, opt, report=True)
