"""The command line's outputs through links, into a stream, and into a link loop (issue 36, R2,
R18; docs/cli.md, "Command line"): `--json` to this process's standard output makes it hold the
JSON alone (the findings go to standard error); a loop given as `--json`, `--save` or `--out` is one line and exit 2.
Streams are reached through a link made in tmp_path, never by writing a system path."""

from __future__ import annotations

import json
import os

import pytest

import diagkit
from cli_checks import assert_one_line_error, run

pytestmark = pytest.mark.slow  # the console script in a subprocess


def test_json_to_standard_output_holds_the_json_alone(tmp_path):
    (tmp_path / "stdout").symlink_to("/proc/self/fd/1")  # /dev/stdout, made here
    proc = run("check", "diagkit.demos:clean", "--steps", "1", "--json", "stdout",
               "--save", "saved", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no findings" in proc.stderr
    payload = json.loads(proc.stdout)
    assert {p["name"] for p in payload["params"]} == set(diagkit.load(tmp_path / "saved")
                                                        .params["name"])
    assert os.readlink(tmp_path / "stdout") == "/proc/self/fd/1"


@pytest.mark.parametrize("args", [
    ["check", "diagkit.demos:clean", "--json", "loop"],
    ["check", "diagkit.demos:clean", "--save", "loop"],
    ["check", "diagkit.demos:clean", "--json", "loop/below.json"],
    ["report", "diagkit.demos:clean", "--out", "loop"],
], ids=["json", "save", "json_below", "out"])
def test_a_link_loop_is_one_line_and_exit_2(tmp_path, args):
    (tmp_path / "loop").symlink_to("loop")
    line = assert_one_line_error(run(*args, cwd=tmp_path))
    assert line == f"diagkit: error: {args[-2]} {args[-1]}: symbolic link loop"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]
