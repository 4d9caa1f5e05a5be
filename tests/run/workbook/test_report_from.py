"""`diagkit report --from DIR`: render a saved diagnosis without running anything (issue 12,
item 4). `check --save` (and `Diagnosis.save`) write the folders, `report --from` renders them;
bad folders and bad option mixes are one line, exit 2, no OUT. The `--nproc` check and one
render run the console script in subprocesses; the rest run the CLI in this process
(`run_cli`), the renders' notebooks still in real papermill kernels."""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

import diagkit
from cli_inprocess import run_cli
from samples import failing_run
from cli_checks import assert_one_line_error

CHECKPOINT = Path(__file__).resolve().parents[3] / "data" / "finetune_heads_pretrain.pt"
DIAGKIT = Path(sys.executable).parent / "diagkit"


def console(*args, cwd) -> subprocess.CompletedProcess:
    """The real console script, in a subprocess (thread-safe: it may run beside `run_cli`)."""
    env = {k: v for k, v in os.environ.items() if k != "DIAGKIT_DEBUG"}
    return subprocess.run([str(DIAGKIT), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def here(*args, cwd) -> subprocess.CompletedProcess:
    """The command line in this process (`run_cli`)."""
    return run_cli(*args, cwd=cwd, env={"DIAGKIT_DEBUG": None})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Saved diagnoses: a finetune run with a checkpoint and a 2-rank run (both by `check
    --save`), and a run whose step 1 failed (by `Diagnosis.save`)."""
    d = tmp_path_factory.mktemp("saved")
    with ThreadPoolExecutor(max_workers=1) as pool:  # the torchrun job, while `ft` runs here
        ranks = pool.submit(console, "check", "diagkit.demos:rank_branch", "--nproc", "2",
                            "--steps", "3", "--save", "ranks", cwd=d)
        ft = here("check", "diagkit.demos:finetune_heads", "--checkpoint", CHECKPOINT,
                  "--steps", "2", "--save", "ft", cwd=d)
        assert ft.returncode == 0, ft.stderr
        assert ranks.result().returncode == 0, ranks.result().stderr
    failing_run(1).save(d / "failed")
    failing_run(1).save(d / "old")
    for table, added in (("params", ["placement", "stage", "skipped_steps"]),
                         ("steps", ["skipped"])):  # as saved before these columns existed
        path = d / "old" / f"{table}.parquet"
        pd.read_parquet(path).drop(columns=added).to_parquet(path)
    return d


@pytest.fixture(scope="module")
def reports(saved):
    """Each saved diagnosis rendered; `ft` by a relative --from, from its folder, by the
    console script (concurrently), the others by the CLI in this process."""
    cases = {"ranks": ["--from", saved / "ranks", "--out", saved / "r_ranks"],
             "failed": ["--from", saved / "failed", "--out", saved / "r_failed"],
             "old": ["--from", saved / "old", "--out", saved / "r_old"]}
    with ThreadPoolExecutor(max_workers=1) as pool:
        ft = pool.submit(console, "report", "--from", "ft", "--out", "r_ft", "--fail-on",
                         "warning", cwd=saved)
        done = {k: here("report", *args, cwd=saved) for k, args in cases.items()}
        return {"ft": ft.result(), **done}


def test_report_from_renders_the_saved_findings_and_verdicts(saved, reports):
    proc, out = reports["ft"], saved / "r_ft"
    assert proc.returncode == 1, proc.stderr  # --fail-on warning: the unused heads
    assert str((out / "report.html").resolve()) in proc.stdout
    assert {"report.html", "report.ipynb", "params.csv", "steps.csv", "findings.json"} <= {
        p.name for p in out.iterdir()}
    diag = diagkit.load(saved / "ft")
    written = json.loads((out / "findings.json").read_text())
    assert written["findings"] == [f.to_dict() for f in diag.findings]
    assert written["worst"] == diag.worst() == "warning"
    params = pd.read_csv(out / "params.csv")
    assert dict(zip(params["name"], params["verdicts"])) == {
        n: " ".join(v) for n, v in zip(diag.params["name"], diag.params["verdicts"])}
    page = (out / "report.html").read_text().replace("\u00a0", " ")  # (units kept on a line)
    assert f">{saved / 'ft'}</h1>" in page and "(not run again)" in page  # found from cwd
    for f in diag.findings:
        assert f.code in page and html.escape(f.module) in page, f.code
    for name, verdicts in diag.verdicts().items():
        if verdicts != {"ok"}:
            assert html.escape(name) in page, name
    assert "19 tensors loaded" in page and "18.6 KiB" in page  # the checkpoint report
    assert page.count("<img") >= 3


def test_report_from_a_distributed_run_shows_the_per_rank_view(saved, reports):
    proc, out = reports["ranks"], saved / "r_ranks"
    assert proc.returncode == 0, proc.stderr  # rank-dependent use is a warning
    page = (out / "report.html").read_text()
    assert "2 ranks (0–1), 3 steps observed" in page
    assert "module.aux.weight" in page and "rank 0: never" in page
    header = (out / "steps.csv").read_text().splitlines()[0]
    assert header.startswith("rank,step,name,") and header.endswith(",checksum")


def test_fail_on_and_the_failure_of_a_saved_run(saved, reports):
    proc, out = reports["failed"], saved / "r_failed"
    assert proc.returncode == 1, proc.stderr  # step_failed is an error, the default --fail-on
    page = (out / "report.html").read_text()
    assert "step_failed" in page and "boom" in page
    assert "This report is incomplete" not in page


def test_report_from_renders_a_save_of_an_older_diagkit(saved, reports):
    """Saved before placement, stage, skipped_steps and steps.skipped existed (issue 36,
    R13): rendered as `load` reads it, those columns with the values they meant then."""
    proc, out = reports["old"], saved / "r_old"
    assert proc.returncode == 1, proc.stderr  # step_failed, as for the same run saved now
    page = (out / "report.html").read_text()
    assert "step_failed" in page and "boom" in page
    assert "This report is incomplete" not in page
    params = pd.read_csv(out / "params.csv", keep_default_na=False)
    assert set(params["placement"]) == {""} and set(params["skipped_steps"]) == {0}


# ------------------------------------------------------------------ bad input
def _corrupt(saved: Path, root: Path) -> None:
    """Folders that are not (whole) saved diagnoses, and a plain file."""
    (root / "a_file").write_text("not a folder\n")
    (root / "not_saved").mkdir()
    (root / "not_saved" / "notes.txt").write_text("hello\n")
    for name in ("bad_json", "truncated", "no_steps", "bad_columns", "bad_severity", "newer",
                 "bad_events", "bad_count"):
        shutil.copytree(saved / "ft", root / name)
    for name, edit in (("newer", lambda run: run.update(format=99)),
                       ("bad_events", lambda run: run["meta"].update(events=[{"step": "x"}]))):
        run_json = json.loads((root / name / "run.json").read_text())
        edit(run_json)
        (root / name / "run.json").write_text(json.dumps(run_json))
    findings = json.loads((root / "bad_count" / "findings.json").read_text())
    findings[0]["count"] = "several"
    (root / "bad_count" / "findings.json").write_text(json.dumps(findings))
    findings = json.loads((root / "bad_severity" / "findings.json").read_text())
    findings[0]["severity"] = "catastrophic"  # ranks as ok: it would load, and exit 0
    (root / "bad_severity" / "findings.json").write_text(json.dumps(findings))
    (root / "bad_json" / "run.json").write_text("{ not json")
    parquet = (root / "truncated" / "params.parquet").read_bytes()
    (root / "truncated" / "params.parquet").write_bytes(parquet[: len(parquet) // 2])
    (root / "no_steps" / "steps.parquet").unlink()
    pd.DataFrame({"x": [1]}).to_parquet(root / "bad_columns" / "steps.parquet")


BAD = {
    "neither": (["report", "--out", "OUT"], ["TARGET", "--from"]),
    "both": (["report", "diagkit.demos:clean", "--from", "SAVED", "--out", "OUT"],
             ["not both"]),
    "steps": (["report", "--from", "SAVED", "--out", "OUT", "--steps", "2"], ["--steps"]),
    "nproc_arg": (["report", "--from", "SAVED", "--out", "OUT", "--nproc", "1", "--arg", "a=1"],
                  ["--arg", "--nproc"]),
    "checkpoint": (["report", "--from", "SAVED", "--out", "OUT", "--checkpoint", "x.pt",
                    "--trust-checkpoint"], ["--checkpoint", "--trust-checkpoint"]),
    "missing": (["report", "--from", "no_such_dir", "--out", "OUT"],
                ["no_such_dir", "does not exist"]),
    "a_file": (["report", "--from", "a_file", "--out", "OUT"], ["a_file", "not a folder"]),
    "not_saved": (["report", "--from", "not_saved", "--out", "OUT"],
                  ["not_saved", "not a saved diagnosis"]),
    "bad_json": (["report", "--from", "bad_json", "--out", "OUT"], ["bad_json", "corrupt"]),
    "truncated": (["report", "--from", "truncated", "--out", "OUT"], ["truncated", "corrupt"]),
    "no_steps": (["report", "--from", "no_steps", "--out", "OUT"], ["no_steps", "steps"]),
    "bad_columns": (["report", "--from", "bad_columns", "--out", "OUT"],
                    ["bad_columns", "steps table lacks"]),
    "bad_severity": (["report", "--from", "bad_severity", "--out", "OUT", "--fail-on", "info"],
                     ["bad_severity", "corrupt", "'catastrophic'"]),
    "out_is_saved": (["report", "--from", "SAVED", "--out", "SAVED"], ["--out", "itself"]),
    "newer": (["report", "--from", "newer", "--out", "OUT"],
              ["newer", "saved by a newer diagkit (format 99; this one reads ≤ 1): upgrade"]),
    "bad_events": (["report", "--from", "bad_events", "--out", "OUT"],
                   ["bad_events", "corrupt", "run.json", "meta events"]),
    "bad_count": (["report", "--from", "bad_count", "--out", "OUT"],
                  ["bad_count", "corrupt", "findings.json", "count"]),
}


@pytest.fixture(scope="module")
def bad_runs(saved, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    _corrupt(saved, root)

    def case(name, args):  # refused before a kernel starts: no subprocess needed
        spelled = [str(saved / "ft") if a == "SAVED" else str(root / f"out_{name}")
                   if a == "OUT" else a for a in args]
        return here(*spelled, cwd=root)
    return root, {name: case(name, args) for name, (args, _) in BAD.items()}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_report_from_is_one_line_exit_2_and_writes_nothing(saved, bad_runs, case):
    root, procs = bad_runs
    line = assert_one_line_error(procs[case])
    for word in BAD[case][1]:
        assert word in line, (word, line)
    assert not (root / f"out_{case}").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no scratch folder
    assert diagkit.load(saved / "ft").findings  # the saved diagnosis is untouched
