"""A symbolic link loop given as an output path is one line naming the option (issue 36,
R18; docs/cli.md, "Command line"), never pathlib's RuntimeError ("internal error")."""

from __future__ import annotations

import pytest

from diagkit import DiagkitError
from diagkit.core.files import check_output


@pytest.mark.parametrize("option", ["--json", "--save", "--out"])
def test_a_link_loop_is_one_line_naming_the_option(tmp_path, option):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for path in (tmp_path / "a", tmp_path / "a" / "below"):
        with pytest.raises(DiagkitError) as info:
            check_output(path, option)
        assert str(info.value) == f"{option} {path}: symbolic link loop"
