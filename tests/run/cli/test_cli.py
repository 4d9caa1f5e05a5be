"""The `diagkit` command line (SPEC 4 and 6): exit codes 0/1/2, one line on stderr for bad
input, JSON output, a failing step, and the self-contained demo report.

The command line runs in this process (tests/helpers/cli_inprocess.py: what it prints, writes
and exits with is what a process of it would), the bad-input cases from one module-scoped
fixture; the real console script, in a subprocess that imports torch afresh (a few seconds),
runs a whole check (test_check_meta_memory_exits_1_and_writes_json) and a bad option
(test_bad_fail_on_value_is_exit_2). Every case uses `--steps 2`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cli_checks import TIMEOUT, assert_one_line_error, run

DIAGKIT = Path(sys.executable).parent / "diagkit"

TARGETS = textwrap.dedent('''
    import torch

    def _parts():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def fails_at_step_1():
        model, opt = _parts()

        def train_step(i):
            if i == 1:
                raise ValueError("batch 1 is corrupt")
            opt.zero_grad()
            loss = model(torch.ones(2, 3)).sum()
            loss.backward()
            opt.step()
            return loss
        return {"model": model, "optimizer": opt, "train_step": train_step}

    def fails_at_step_0():
        model, opt = _parts()

        def train_step(i):
            raise ValueError("the first batch is corrupt")
        return {"model": model, "optimizer": opt, "train_step": train_step}

    def nan_loss():
        model, opt = _parts()
        return {"model": model, "optimizer": opt, "batch_fn": lambda: torch.ones(2, 3),
                "loss_fn": lambda m, b: m(b).sum() * float("nan")}
''')

HELPER = textwrap.dedent('''
    class Payload:
        """A custom class: unpickling it needs arbitrary code."""
        def __init__(self):
            self.weights = [1.0, 2.0]
''')


def run_console_script(*args, cwd) -> subprocess.CompletedProcess:
    """The real console script, in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k != "DIAGKIT_DEBUG"}
    return subprocess.run([str(DIAGKIT), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder holding the target file and the checkpoints of the bad-input cases."""
    d = tmp_path_factory.mktemp("cli")
    (d / "targets.py").write_text(TARGETS)
    (d / "diagkit_cli_helper.py").write_text(HELPER)
    (d / "empty.pt").write_bytes(b"")
    (d / "a_folder").mkdir()
    (d / "a_file").write_text("the user's own file\n")
    (d / "garbage.pt").write_bytes(b"garbage: not a checkpoint at all\n" * 4)
    sys.path.insert(0, str(d))
    try:
        import diagkit_cli_helper
        torch.save(diagkit_cli_helper.Payload(), d / "custom_class.pt")
    finally:
        sys.path.remove(str(d))
        sys.modules.pop("diagkit_cli_helper", None)
    return d


BAD_INPUTS = {
    "unknown_module": ["check", "no_such_package_xyz.train:build", "--steps", "2"],
    "bad_spec": ["check", "diagkit.demos.clean", "--steps", "2"],
    "bad_arg_format": ["check", "diagkit.demos:clean", "--arg", "batch", "--steps", "2"],
    "unknown_arg_name": ["check", "diagkit.demos:clean", "--arg", "widht=3", "--steps", "2"],
    "steps_zero": ["check", "diagkit.demos:clean", "--steps", "0"],
    "steps_abc": ["check", "diagkit.demos:clean", "--steps", "abc"],
    "unknown_option": ["check", "diagkit.demos:clean", "--frobnicate", "--steps", "2"],
    "no_command": [],
    "nproc_0": ["check", "diagkit.demos:clean", "--nproc", "0", "--steps", "2"],
    # more ranks than the machine runs: refused before any starts (1000 on 2 cores ran it
    # out of memory and left ranks behind)
    "nproc_too_many": ["check", "diagkit.demos:clean", "--nproc", "100000", "--steps", "1"],
    "timeout_0": ["check", "diagkit.demos:clean", "--nproc", "2", "--timeout", "0"],
    "timeout_huge": ["check", "diagkit.demos:clean", "--timeout", "99999999999999"],
    "checkpoint_missing": ["check", "diagkit.demos:clean", "--checkpoint", "missing.pt",
                           "--steps", "2"],
    "checkpoint_empty": ["check", "diagkit.demos:clean", "--checkpoint", "empty.pt",
                         "--steps", "2"],
    "checkpoint_garbage": ["check", "diagkit.demos:clean", "--checkpoint", "garbage.pt",
                           "--steps", "2"],
    "checkpoint_custom_class": ["check", "diagkit.demos:clean", "--checkpoint",
                                "custom_class.pt", "--steps", "2"],
    "json_missing_folder": ["check", "diagkit.demos:clean", "--json", "no/such/dir/out.json",
                            "--steps", "2"],
    "json_is_a_folder": ["check", "diagkit.demos:clean", "--json", "a_folder", "--steps", "2"],
    "demo_out_is_a_file": ["demo", "--out", "a_file", "--steps", "2"],
}


@pytest.fixture(scope="module")
def bad_runs(work):
    return {name: run(*args, cwd=work) for name, args in BAD_INPUTS.items()}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(bad_runs, case):
    assert_one_line_error(bad_runs[case])


@pytest.mark.parametrize("case, words", [
    ("unknown_module", ["no_such_package_xyz.train"]),
    ("bad_spec", ["package.module:function"]),
    ("bad_arg_format", ["--arg", "batch"]),
    ("unknown_arg_name", ["widht", "batch", "weight_decay"]),
    ("steps_zero", ["--steps", "0"]),
    ("steps_abc", ["--steps", "abc"]),
    ("unknown_option", ["--frobnicate"]),
    ("no_command", ["check"]),
    ("nproc_0", ["--nproc", "0"]),
    ("nproc_too_many", ["--nproc 100000", "more ranks than this machine runs"]),
    ("timeout_0", ["--timeout", "0"]),
    ("timeout_huge", ["--timeout", "99999999999999", "below 1e9"]),
    ("checkpoint_missing", ["missing.pt"]),
    ("checkpoint_empty", ["empty.pt", "empty"]),
    ("checkpoint_garbage", ["garbage.pt"]),
    ("checkpoint_custom_class", ["custom_class.pt", "--trust-checkpoint"]),
    ("json_missing_folder", ["--json", "no/such/dir"]),
    ("json_is_a_folder", ["--json", "a_folder"]),
    ("demo_out_is_a_file", ["--out", "a_file"]),
])
def test_bad_input_message_names_the_problem(bad_runs, case, words):
    line = assert_one_line_error(bad_runs[case])
    for word in words:
        assert word in line, (word, line)


def test_garbage_checkpoint_is_not_called_a_pickle_needing_trust(bad_runs):
    line = assert_one_line_error(bad_runs["checkpoint_garbage"])
    # a text file is not a pickle that needs code: don't tell the user to trust it
    assert "--trust-checkpoint" not in line and "arbitrary unpickling" not in line


def test_bad_input_writes_nothing(bad_runs, work):
    assert not (work / "no").exists()
    assert not list(work.glob("*.json"))
    assert list((work / "a_folder").iterdir()) == []
    assert (work / "a_file").read_text() == "the user's own file\n"


# ------------------------------------------------------------------ findings and exit codes
def test_check_meta_memory_exits_1_and_writes_json(tmp_path):
    proc = run_console_script("check", "diagkit.demos:meta_memory", "--steps", "2", "--json", "out.json",
               cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "orphan" in proc.stdout
    payload = json.loads((tmp_path / "out.json").read_text())
    assert {"params", "findings", "advice"} <= set(payload)
    rows = {p["name"]: p for p in payload["params"]}
    assert all("verdicts" in p for p in payload["params"])
    mem = rows["module.metamodel.model.mem_tokens"]
    assert set(mem["verdicts"]) == {"orphan", "grad_not_cleared"}
    assert all(p["verdicts"] == ["ok"] for n, p in rows.items() if "mem_tokens" not in n)
    orphan = [f for f in payload["findings"] if f["code"] == "orphan"]
    assert len(orphan) == 1 and orphan[0]["severity"] == "error"
    assert orphan[0]["params"] == ["module.metamodel.model.mem_tokens"]
    assert orphan[0]["fix"]
    assert payload["advice"]["find_unused_parameters"]["value"] is False
    assert "static_graph" in payload["advice"]
    assert not [p for p in tmp_path.iterdir() if p.name != "out.json"]  # no temp files left


def test_check_clean_exits_0(tmp_path):
    proc = run("check", "diagkit.demos:clean", "--steps", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no findings" in proc.stdout


def test_fail_on_levels(tmp_path):
    default = run("check", "diagkit.demos:finetune_heads", "--steps", "2", cwd=tmp_path)
    warning = run("check", "diagkit.demos:finetune_heads", "--steps", "2", "--fail-on",
                  "warning", cwd=tmp_path)
    never = run("check", "diagkit.demos:meta_memory", "--steps", "2", "--fail-on", "never",
                cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    assert "unused" in default.stdout
    assert warning.returncode == 1, warning.stderr
    assert never.returncode == 0, never.stderr
    assert "orphan" in never.stdout


def test_bad_fail_on_value_is_exit_2(tmp_path):
    line = assert_one_line_error(run_console_script("check", "diagkit.demos:clean",
                                                    "--fail-on", "fatal", cwd=tmp_path))
    assert "--fail-on" in line


def test_a_step_failing_at_step_1_keeps_step_0(work, tmp_path):
    proc = run("check", f"{work / 'targets.py'}:fails_at_step_1", "--steps", "3", "--json",
               "out.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "step_failed" in proc.stdout and "batch 1 is corrupt" in proc.stdout
    payload = json.loads((tmp_path / "out.json").read_text())
    failed = [f for f in payload["findings"] if f["code"] == "step_failed"]
    assert len(failed) == 1 and failed[0]["severity"] == "error"
    assert "batch 1 is corrupt" in failed[0]["message"]
    assert payload["failure"]["step"] == 1
    assert len(payload["params"]) == 4
    for p in payload["params"]:  # step 0 was observed and judged
        assert p["steps"] == 1 and p["used_steps"] == 1 and p["changed_steps"] == 1
        assert p["verdicts"] == ["ok"]


def test_a_step_failing_at_step_0_is_a_finding(work, tmp_path):
    proc = run("check", f"{work / 'targets.py'}:fails_at_step_0", "--steps", "2", "--json",
               "out.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    payload = json.loads((tmp_path / "out.json").read_text())
    assert payload["failure"]["step"] == 0
    assert [f["code"] for f in payload["findings"]][0] == "step_failed"


def test_nan_loss_is_judged_and_written(work, tmp_path):
    proc = run("check", f"{work / 'targets.py'}:nan_loss", "--steps", "2", "--json",
               "out.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    payload = json.loads((tmp_path / "out.json").read_text())
    assert all("nonfinite_grad" in p["verdicts"] for p in payload["params"])


