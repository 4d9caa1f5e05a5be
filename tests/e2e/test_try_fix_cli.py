"""`diagkit check TARGET --try-fix` end to end: the three demos' findings all turn ok in the
before -> after table, bad combinations are one line and exit 2, and under `--nproc 2` (real
DDP, gloo) the fixed run is wrapped with find_unused_parameters=False and both step times are
shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_inprocess import run_cli
from diagkit.run.cli.commands import main

DIAGKIT = str(Path(sys.executable).parent / "diagkit")


def preview_part(out: str) -> str:
    return out[out.index("diagkit --try-fix:"):]


@pytest.mark.parametrize("demo, rows", [
    ("meta_memory", ["orphan -> ok", "grad_not_cleared -> ok"]),
    ("finetune_heads", ["unused -> ok"] * 3),
    ("clean", []),
])
def test_try_fix_turns_every_demo_finding_ok(capsys, tmp_path, demo, rows):
    code = main(["check", f"diagkit.demos:{demo}", "--try-fix", "--steps", "3",
                 "--json", str(tmp_path / "before.json")])
    out = capsys.readouterr().out
    preview = preview_part(out)
    assert code == 0  # the fixed run's findings: none
    assert "every finding is ok after the fixes" in preview
    for row in rows:
        assert row in preview
    assert preview.count(" -> ") == len(rows) + bool(rows)  # the rows, and the header
    assert "did not help" not in preview and "no automatic fix" not in preview
    if rows:
        assert "VERDICT" in preview and "BEFORE -> AFTER" in preview
    # --json is the run as it is, as without --try-fix
    before = json.loads((tmp_path / "before.json").read_text())
    assert len(before["findings"]) == len(rows)


def test_try_fix_on_finetune_heads_counts_the_adamw_state_saved(capsys):
    main(["check", "diagkit.demos:finetune_heads", "--try-fix", "--steps", "2"])
    preview = preview_part(capsys.readouterr().out)
    assert "optimizer state saved: 37.1 KiB" in preview  # 2 x 4 B x 4,748 elements dropped
    assert "find_unused_parameters=False once the fixes are in (was True)" in preview


def test_try_fix_exit_code_is_the_fixed_runs(capsys):
    """An orphan whose neighbours have lr 0: the fix does not help, the fixed run still
    fails --fail-on error."""
    assert main(["check", "fix_targets:orphan", "--arg", "lr=0.0", "--try-fix"]) == 1
    assert "did not help" in preview_part(capsys.readouterr().out)
    assert main(["check", "fix_targets:orphan", "--try-fix"]) == 0


@pytest.mark.parametrize("extra, words", [
    (["--meta"], "--try-fix reruns real steps: it cannot be combined with --meta"),
    (["--checkpoint", "x.pt"], "cannot be combined with --checkpoint x.pt"),
])
def test_try_fix_refuses_meta_and_checkpoint(capsys, extra, words):
    assert main(["check", "diagkit.demos:clean", "--try-fix", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


# The real console script, in a subprocess: the --nproc runs below (the rest of the module
# runs the command line in this process: `main`, and tests/helpers/cli_inprocess.py's `run_cli`).
def test_try_fix_nproc_2_shows_the_two_step_times():
    run = subprocess.run([DIAGKIT, "check", "diagkit.demos:finetune_heads", "--nproc", "2",
                          "--steps", "3", "--try-fix"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    preview = preview_part(run.stdout)
    assert preview.count("unused -> ok") == 3
    assert "every finding is ok after the fixes" in preview
    line = next(x for x in preview.splitlines() if x.startswith("step time:"))
    assert "with find_unused_parameters=True (old) vs" in line and "with False (fixed)" in line


def test_try_fix_rebuilds_the_targets_own_ddp():
    """ddp_strict: the target's own DDP(find_unused_parameters=False) stops on a dead head.
    Fixed, the head is frozen and the DDP rebuilt around the module: the run completes."""
    from diagkit.run.diagnose.try_fix import try_fixes
    p = try_fixes("diagkit.demos:ddp_strict", nproc=2, steps=3)
    assert p.before.failure is not None and p.after.failure is None
    rows = {r["code"]: r for r in p.rows}
    assert rows["ddp_unused_parameters"]["helped"] and rows["unused"]["helped"]
    assert p.after.meta["find_unused_parameters"] is False
    assert not p.after.findings and p.all_ok


def test_try_fix_in_one_process_under_timeout(capsys):
    """--timeout bounds each of the two runs (each build starts its clock)."""
    assert main(["check", "diagkit.demos:meta_memory", "--try-fix", "--timeout", "120"]) == 0
    assert "every finding is ok after the fixes" in capsys.readouterr().out


def test_report_from_a_saved_diagnosis_refuses_try_fix(capsys, tmp_path):
    code = main(["report", "--from", str(tmp_path), "--out", str(tmp_path / "o"), "--try-fix"])
    assert code == 2
    assert "--try-fix: only for running a TARGET" in capsys.readouterr().err


# ------------------------------------------------------------------ the preview's build fails
SECOND_BUILD_FAILS = '''
import os
import time
import torch


def build(how: str = "raise"):
    """Builds once; the second call (the fix preview's fresh copy) raises or hangs. A file
    target is imported again on each build: the count lives in the process's environment."""
    os.environ["BUILDS"] = str(int(os.environ.get("BUILDS", "0")) + 1)
    if os.environ["BUILDS"] == "2":
        if how == "raise":
            raise RuntimeError("the data server is gone")
        time.sleep(300)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"body": torch.nn.Linear(3, 1), "dead": torch.nn.Linear(3, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return {"model": model, "optimizer": opt, "batch_fn": lambda: torch.ones(2, 3),
            "loss_fn": lambda m, b: m["body"](b).sum(), "steps": 2}
'''


def one_error_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.parametrize("how, why", [
    ("raise", "raised while building the setup: RuntimeError: the data server is gone"),
    ("hang", "timed out after 10 s (--timeout) while building the setup"),
])
def test_a_fix_preview_whose_build_fails_keeps_the_first_run(tmp_path, how, why):
    """D3: the run as it is completes, then the fresh copy's build raises or outlives
    --timeout: --json and --save hold the first run, and the one line names the preview's
    build, not the target as the user runs it."""
    (tmp_path / "t.py").write_text(SECOND_BUILD_FAILS)
    run = run_cli("check", "t.py:build", "--arg", f"how={how}", "--try-fix", "--timeout", "10",
                  "--json", "before.json", "--save", "saved", cwd=tmp_path,
                  env={"BUILDS": None})  # the target counts its builds from none
    line = one_error_line(run)
    assert line.startswith("diagkit: error: --try-fix: the fix preview's build"), line
    assert why in line and "before.json" in line, line
    assert "unused" in run.stdout  # the first run's findings, printed
    before = json.loads((tmp_path / "before.json").read_text())
    assert [f["code"] for f in before["findings"]] == ["unused"]
    assert before["meta"]["steps_observed"] == 2 and before["failure"] is None
    from diagkit import load
    assert [f.code for f in load(tmp_path / "saved").findings] == ["unused"]


RANKS_SECOND_BUILD_FAILS = '''
import os
from pathlib import Path

import torch


def build():
    """Under --nproc each run starts new ranks: the first run's ranks leave a mark, and the
    fix preview's ranks (the second build) find it and raise."""
    mark = Path(__file__).with_name(f"built-{os.environ.get('RANK', '0')}")
    if mark.exists():
        raise RuntimeError("no second copy on this node")
    mark.write_text("1")
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"body": torch.nn.Linear(3, 1), "dead": torch.nn.Linear(3, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return {"model": model, "optimizer": opt, "batch_fn": lambda: torch.ones(2, 3),
            "loss_fn": lambda m, b: m["body"](b).sum(), "steps": 2}
'''


def test_a_fix_preview_whose_ranks_fail_to_build_keeps_the_first_run(tmp_path):
    """D3 under --nproc 2: the fixed run's ranks fail while building; the first run's
    findings are written, and the line names the fix preview."""
    (tmp_path / "t.py").write_text(RANKS_SECOND_BUILD_FAILS)
    run = subprocess.run([DIAGKIT, "check", "t.py:build", "--nproc", "2", "--try-fix",
                          "--json", "before.json"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    line = one_error_line(run)
    assert line.startswith("diagkit: error: --try-fix: the fix preview's build and run"), line
    assert "no second copy on this node" in line and "before.json" in line, line
    before = json.loads((tmp_path / "before.json").read_text())
    assert [f["code"] for f in before["findings"]] == ["unused"]
    assert before["meta"]["nproc"] == 2
