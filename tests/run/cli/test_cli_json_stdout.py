"""`diagkit check TARGET --json -` (docs/cli.md, "Command line"): standard output holds one JSON
object, with its `schema_version`, and nothing else: the findings table, the target's own prints
and C-level writes go to standard error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from diagkit.core.schema import SCHEMA_VERSION

DIAGKIT = Path(sys.executable).with_name("diagkit")

TARGET = textwrap.dedent('''
    import os
    import torch

    def noisy():
        """An orphan head, and a target that writes to standard output two ways."""
        print("the target talks on stdout")
        os.write(1, b"and so does C code\\n")
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
        return {"model": model, "optimizer": optimizer, "batch_fn": lambda: torch.ones(3, 2),
                "loss_fn": lambda m, b: m(b).sum()}
''')


def check(tmp_path, *args) -> subprocess.CompletedProcess:
    (tmp_path / "json_target.py").write_text(TARGET)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([str(DIAGKIT), "check", "json_target:noisy", "--steps", "2", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_json_to_stdout_is_one_object_and_nothing_else(tmp_path):
    done = check(tmp_path, "--json", "-")
    assert done.returncode == 1, done.stderr[-2000:]  # an error finding: exit 1
    result = json.loads(done.stdout)  # the whole of stdout is one JSON object
    assert result["schema_version"] == SCHEMA_VERSION
    assert "orphan" in [f["code"] for f in result["findings"]]
    assert "the target talks on stdout" in done.stderr and "and so does C code" in done.stderr
    assert "orphan" in done.stderr  # the findings table, for the person at the terminal


def test_json_to_a_file_leaves_stdout_to_the_table(tmp_path):
    done = check(tmp_path, "--json", tmp_path / "r.json")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "orphan" in done.stdout and "the target talks on stdout" in done.stdout
    assert json.loads((tmp_path / "r.json").read_text())["schema_version"] == SCHEMA_VERSION
