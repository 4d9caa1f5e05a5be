"""`diagkit.explore` on a saved folder (docs/workbook.md, "The explorer anywhere"): it shows
the findings and their fixes as the explorer of a diagnosis in memory does, and a reload of a
running job's folder always answers: the newer save, or "no newer save" and when the save
shown was written (the other cases of diagkit.explore: tests/run/live/test_live.py)."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import time

import diagkit
from diagkit.present.explorer import Explorer, Reloadable

CLOCK = re.compile(r"\d\d:\d\d:\d\d")


def running(diag, observed: int):
    return dataclasses.replace(diag, meta={**diag.meta, "ended": "running",
                                           "steps_observed": observed})


def test_a_saved_folder_shows_its_findings_and_fixes(tmp_path, meta):
    meta.save(tmp_path / "diag")
    shown = diagkit.explore(str(tmp_path / "diag"))
    assert isinstance(shown, Explorer)
    box = shown.controls.findings
    assert "2 findings" in box.children[0].value and len(box.buttons) == 2
    assert "<b>orphan</b>" in box.children[1].children[0].children[0].value
    assert "diagkit-fix-code" in box.children[1].children[1].value


def test_a_reload_says_no_newer_save_and_when_the_one_shown_was_saved(tmp_path, meta):
    folder = tmp_path / "diag"
    running(meta, 3).save(folder)
    saved = time.strftime("%H:%M:%S", time.localtime(os.stat(folder / "run.json").st_mtime))
    view = diagkit.explore(folder)
    assert isinstance(view, Reloadable)
    line = html.unescape(view.line.value)
    assert line == (f"A running job's diagnosis, as last saved (3 observed steps) at {saved}: "
                    "reload for a newer save.")
    shown = view.explorer
    view.button.click()                                    # nothing new: said, with the time
    line = html.unescape(view.line.value)
    assert line.startswith("Looked at ") and line.endswith(
        f": no newer save; this is still the save of {saved} (3 observed steps).")
    assert CLOCK.fullmatch(line.split()[2].rstrip(":"))
    assert view.explorer is shown and view.children[1] is shown
    running(meta, 4).save(folder)                          # a newer save: shown
    view.button.click()
    assert "as last saved (4 observed steps) at " in view.line.value
    assert view.explorer is not shown and view.children[1] is view.explorer
    meta.save(folder)                                      # the job ended
    view.button.click()
    assert re.fullmatch(r"The job has ended: its diagnosis \(5 observed steps\)\. Saved at "
                        r"\d\d:\d\d:\d\d\.", html.unescape(view.line.value))
    ended = view.explorer
    view.button.click()
    assert "no newer save" in view.line.value and view.explorer is ended
