"""Rendering a report leaves this process's environment as it was: the launch folder it tells
its kernel (`diagkit.run.paths.LAUNCH_ENV`) is for that kernel only."""

from __future__ import annotations

import os

from diagkit.run.paths import LAUNCH_ENV
from diagkit.run.report import write_report


def test_the_kernels_launch_folder_does_not_leak(tmp_path, monkeypatch):
    monkeypatch.delenv(LAUNCH_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    write_report(tmp_path / "rep", {"bad": {"target": "no.such:thing", "steps": 1}}, title="x")
    assert LAUNCH_ENV not in os.environ
    monkeypatch.setenv(LAUNCH_ENV, "/somewhere")
    write_report(tmp_path / "rep2", {"bad": {"target": "no.such:thing", "steps": 1}}, title="x")
    assert os.environ[LAUNCH_ENV] == "/somewhere"
