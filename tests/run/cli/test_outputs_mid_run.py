"""An output that cannot be written in mid-run (issue 21, section 3): `check --save DIR` whose
folder is replaced while the run goes on, `--json PATH` on a disk that fills up. Each is one
line naming the path, exit code 2, never "internal error", and what else was promised is kept:
the findings printed, and `--json` written (docs/cli.md: `--json` writes the run as it is).

Real subprocesses of the console script; the faults are real too: a folder replaced by a file,
and a file-size limit (RLIMIT_FSIZE: a write past it fails with EFBIG, as a full disk fails
with ENOSPC).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DIAGKIT = str(Path(sys.executable).parent / "diagkit")

TARGET = '''
import resource
import shutil
from pathlib import Path

import torch


def build(spoil: str = "save"):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"body": torch.nn.Linear(3, 1), "dead": torch.nn.Linear(3, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(m, batch):
        _spoil(spoil)
        return m["body"](batch).sum()
    return {"model": model, "optimizer": opt, "batch_fn": lambda: torch.ones(2, 3),
            "loss_fn": loss_fn, "steps": 2}


def _spoil(how):
    """In mid-run: the --save folder's parent replaced by a file, or a disk that is full."""
    out = Path("out")
    if how == "save" and out.is_dir():
        shutil.rmtree(out)
        out.write_text("a file now")
    elif how == "disk":
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
'''


def check(tmp_path, *args) -> subprocess.CompletedProcess:
    (tmp_path / "t.py").write_text(TARGET)
    (tmp_path / "out").mkdir()
    return subprocess.run([DIAGKIT, "check", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


def one_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, (run.returncode, run.stderr[-3000:])
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
    (line,) = run.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("try_fix", [[], ["--try-fix"]], ids=["check", "try_fix"])
def test_a_save_folder_replaced_in_mid_run_is_one_line_and_json_is_kept(tmp_path, try_fix):
    run = check(tmp_path, "t.py:build", "--json", "j.json", "--save", "out/saved", *try_fix)
    line = one_line(run)
    assert line.startswith("diagkit: error: cannot write --save out/saved: File exists"), line
    assert "written: the findings above, --json j.json" in line, line
    assert "unused" in run.stdout  # the findings, printed
    written = json.loads((tmp_path / "j.json").read_text())
    assert [f["code"] for f in written["findings"]] == ["unused"]
    assert written["meta"]["steps_observed"] == 2
    if try_fix:  # the preview still ran and shows
        assert "every finding is ok after the fixes" in run.stdout


def test_json_on_a_full_disk_is_one_line_naming_it(tmp_path):
    run = check(tmp_path, "t.py:build", "--arg", "spoil=disk", "--json", "j.json")
    line = one_line(run)
    assert line.startswith("diagkit: error: cannot write --json j.json: File too large"), line
    assert "unused" in run.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t.py"]  # no temporary left
