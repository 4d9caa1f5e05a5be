"""The example programs (`examples/`), each an ordinary training program with a planted bug and
at most three lines added for diagkit (marked `# diagkit`). Each runs as a real process,
offline, in an empty folder: the saved diagnosis names exactly the planted bug, every other
tensor is `ok`, and nothing but the diagnosis is written. Under the HF and Lightning Trainers
the planted orphan (the first seed's name filter) points at the user's optimizer line: the
lever its fix names, at the example's file:line, and the filter among its source's lines. With the marked lines removed (and
diagkit made unimportable) the program still runs: diagkit asks for nothing else."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import diagkit
from integration_helpers import OFFLINE
from jobs import run_job

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MARK = "# diagkit"
# example -> (the frameworks it needs, the planted bug's exact verdicts)
CASES = {
    "hf_trainer.py": (("transformers", "accelerate"), {"score.weight": {"orphan"}}),
    "lightning_fit.py": (("lightning",), {"encoder.offset": {"orphan", "grad_not_cleared"},
                                          "aux_head.weight": {"unused"},
                                          "aux_head.bias": {"unused"}}),
    "accelerate_loop.py": (("accelerate",), {"embed.weight": {"frozen_in_optimizer"}}),
}


@pytest.fixture(params=sorted(CASES))
def example(request):
    for package in CASES[request.param][0]:
        pytest.importorskip(package)
    return request.param


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **OFFLINE, "PYTHONWARNINGS": "ignore"}
    done = run_job(command, cwd=cwd, env=env, timeout=600)  # none of its processes outlives it
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def without_diagkit(source: str) -> str:
    return "".join(line for line in source.splitlines(keepends=True)
                   if not line.rstrip().endswith(MARK))


def test_the_example_finds_exactly_its_planted_bug(example, tmp_path):
    done = run([sys.executable, str(EXAMPLES / example), "--output-dir", "out"], cwd=tmp_path)
    diag = diagkit.load(tmp_path / "out" / "diagkit")
    # the program prints what its callback found (paths in it are shown relative to the cwd)
    printed = str(diag).split("\n\n")
    assert printed[0] in done.stdout and printed[-1] in done.stdout
    assert all(f"{f.severity:<8}  {f.code}" in done.stdout for f in diag.findings)
    assert diag.meta["steps_observed"] == 4 and diag.failure is None
    verdicts = diag.verdicts()
    planted = CASES[example][1]
    assert {name: verdicts.pop(name) for name in planted} == planted
    assert verdicts and set().union(*verdicts.values()) == {"ok"}
    assert {f.code for f in diag.findings} == set().union(*planted.values())
    assert files_under(tmp_path) == {f"out/diagkit/{name}" for name in
                                     files_under(tmp_path / "out" / "diagkit")}
    if example in LEVERS:
        orphan_points_at_the_users_optimizer_line(example, diag)


def line_with(example: str, text: str) -> str:
    """file:line of the example's one line holding `text`."""
    lines = (EXAMPLES / example).read_text().splitlines()
    (found,) = [i for i, line in enumerate(lines, 1) if text in line]
    return f"{example}:{found}"


# example -> (the lever its orphan's fix names, with {at} for file:line of the line holding
# the text after it; a line the finding's source shows): the seed's name filter in sight
LEVERS = {
    "hf_trainer.py": ("`Trainer(optimizers=(optimizer, scheduler))` ({at})",
                      "optimizers=(optimizer_for(model), None)",
                      'head = [p for n, p in named if n.startswith("classifier.")]'),
    "lightning_fit.py": ("Put it in the optimizer your `configure_optimizers` builds ({at}): "
                         "include [self.encoder.offset] in the params it passes",
                         'if not n.startswith("encoder.")',
                         'params = [p for n, p in self.named_parameters() if not '
                         'n.startswith("encoder.")]'),
}


def orphan_points_at_the_users_optimizer_line(example: str, diag) -> None:
    """Under the framework, the orphan's fix names the user's lever at its file:line, and its
    source shows the user's lines that built the groups (the name filter among them)."""
    lever, where, shown = LEVERS[example]
    (orphan,) = [f for f in diag.findings if f.code == "orphan"]
    assert lever.format(at=line_with(example, where)) in orphan.fix
    assert "add_param_group" not in orphan.fix
    sources = [s for s in orphan.source if s["file"].endswith(f"examples/{example}")]
    assert sources and any(shown in line for s in sources for line in s["lines"])


def test_the_example_adds_at_most_three_marked_lines(example):
    source = (EXAMPLES / example).read_text()
    marked = [line for line in source.splitlines() if line.rstrip().endswith(MARK)]
    assert 1 <= len(marked) <= 3
    tree = ast.parse(without_diagkit(source))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names} | {n.module for n in ast.walk(tree)
                                    if isinstance(n, ast.ImportFrom)}
    assert not any("diagkit" in str(name).lower() for name in names | imported)


def test_the_example_runs_without_its_marked_lines(example, tmp_path):
    (tmp_path / "program.py").write_text(without_diagkit((EXAMPLES / example).read_text()))
    block = ("import runpy, sys; sys.modules['diagkit'] = None; "  # diagkit cannot be imported
             "sys.argv = ['program.py', '--output-dir', 'out']; "
             "runpy.run_path('program.py', run_name='__main__')")
    run([sys.executable, "-c", block], cwd=tmp_path)
    assert files_under(tmp_path) == {"program.py"}  # and without diagkit nothing is written
