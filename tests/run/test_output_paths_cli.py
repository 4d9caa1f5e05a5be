"""The command line's outputs given as a link loop (issue 36, R18; docs/cli.md, "Command
line"): `--json`, `--save` or `--out` is one line and exit 2, before anything runs."""

from __future__ import annotations

import pytest

from test_cli import assert_one_line_error, run

pytestmark = pytest.mark.slow  # the console script in a subprocess


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
