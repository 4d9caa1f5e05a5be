"""What reading a saved diagnosis says about one it cannot read, and how it reads an older one
(issue 36, R13, R14, R15; docs/result.md, "Saved folders"): a newer format is refused with
"upgrade"; damage is one line naming the file; a save from before a column existed is read
with the value that column meant then; a finding's unknown fields are ignored."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import diagkit
from diagkit import DiagkitError
from diagkit.core.result import StepFailure
from diagkit.core.schema import FORMAT_VERSION
from diagkit.run.workbook.notebook import load_saved

# Columns added after format 1 was first written.
ADDED = {"params": ["placement", "stage", "skipped_steps"], "steps": ["skipped"]}


@pytest.fixture(scope="module")
def diag():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model[1].parameters(), lr=0.1)  # model[0]: an orphan, a finding
    return diagkit.diagnose(model, opt, batch_fn=lambda: torch.ones(3, 2),
                            loss_fn=lambda m, b: m(b).sum(), steps=2)


@pytest.fixture
def folder(diag, tmp_path):
    return diag.save(tmp_path / "diag")


def edit_json(path, edit):
    payload = json.loads(path.read_text())
    edit(payload)
    path.write_text(json.dumps(payload))


def refused(folder, *words, reader=diagkit.load) -> str:
    with pytest.raises(DiagkitError) as info:
        reader(folder)
    line = str(info.value)
    assert "\n" not in line and str(folder) in line, line
    for word in words:
        assert word in line, (word, line)
    return line


# ------------------------------------------------------------------ R13: older saves
def as_saved_before_the_added_columns(folder):
    """The folder as a diagkit of format 1 wrote it before placement, stage, skipped_steps
    and steps.skipped existed."""
    for table, added in ADDED.items():
        path = folder / f"{table}.parquet"
        pd.read_parquet(path).drop(columns=added).to_parquet(path)


@pytest.mark.parametrize("reader", [diagkit.load, load_saved], ids=["load", "report_from"])
def test_a_save_from_before_the_added_columns_is_read_with_their_old_meaning(diag, folder,
                                                                            reader):
    as_saved_before_the_added_columns(folder)
    old = reader(folder)
    assert set(old.params["placement"]) == {""} and set(old.params["stage"]) == {""}
    assert set(old.params["skipped_steps"]) == {0} and set(old.steps["skipped"]) == {False}
    assert old.findings == diag.findings and old.verdicts() == diag.verdicts()


# ------------------------------------------------------------------ R14: format and damage
def test_a_newer_format_is_refused_with_upgrade(folder):
    edit_json(folder / "run.json", lambda run: run.update(format=99))
    line = refused(folder, f"saved by a newer diagkit (format 99; this one reads ≤ "
                           f"{FORMAT_VERSION}): upgrade")
    assert "corrupt" not in line
    refused(folder, "format 99", "upgrade", reader=load_saved)


@pytest.mark.parametrize("value", [None, "1", 0, True])
def test_a_format_that_is_no_format_number_is_damage(folder, value):
    edit_json(folder / "run.json", lambda run: run.update(format=value))
    refused(folder, "corrupt", "run.json", "format")


def test_a_truncated_table_is_damage_naming_the_file(folder):
    for name in ("params.parquet", "steps.parquet"):
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])
        refused(folder, "corrupt", name, "not a readable table")
        refused(folder, "corrupt", name, reader=load_saved)
        (folder / name).write_bytes(data)


@pytest.mark.parametrize("name, data", [("run.json", b"{ not json"), ("run.json", b"\xff\xfe{"),
                                        ("run.json", b"[1]"), ("advice.json", b"[1, 2]"),
                                        ("findings.json", b'{"not": "a list"}')])
def test_a_json_file_that_is_not_what_it_must_be_is_damage_naming_it(folder, name, data):
    (folder / name).write_bytes(data)
    refused(folder, "corrupt", name)


@pytest.mark.parametrize("name", ["findings.json", "advice.json", "steps.parquet"])
def test_a_missing_file_is_damage_naming_it(folder, name):
    (folder / name).unlink()
    refused(folder, "corrupt", f"{name} is missing")


def test_a_findings_unknown_fields_are_ignored(diag, folder):
    """Forward compatible: a newer diagkit of the same format may add a field."""
    edit_json(folder / "findings.json",
              lambda fs: [f.update(confidence=0.9, seen_by={"rank": 0}) for f in fs])
    assert diagkit.load(folder).findings == diag.findings


@pytest.mark.parametrize("field, value", [("count", "many"), ("params", "a.weight"),
                                          ("source", {"file": "x"}), ("since", 1.5),
                                          ("message", None)])
def test_a_finding_field_of_the_wrong_type_is_damage(folder, field, value):
    edit_json(folder / "findings.json", lambda fs: fs[0].update({field: value}))
    refused(folder, "corrupt", "findings.json", "finding 0", field)


def test_a_finding_without_its_code_is_damage(folder):
    edit_json(folder / "findings.json", lambda fs: fs[0].pop("code"))
    refused(folder, "corrupt", "findings.json", "code")


def test_a_failure_without_its_error_is_damage_and_extra_fields_are_ignored(folder):
    edit_json(folder / "run.json",
              lambda run: run.update(failure={"step": 1, "traceback": "", "extra": 1}))
    refused(folder, "corrupt", "run.json", "failure")
    edit_json(folder / "run.json", lambda run: run["failure"].update(error="boom"))
    assert diagkit.load(folder).failure == StepFailure(step=1, error="boom", traceback="")


# ------------------------------------------------------------------ R15: meta, explore
@pytest.mark.parametrize("field, value", [
    ("events", "garbage"), ("events", [{"step": "two", "what": "x"}]), ("events", [3]),
    ("timeline", [{"code": "orphan", "severity": "fatal", "module": "", "since": 0,
                   "until": 1, "ended": None}]),
    ("steps_observed", "many"), ("optimizer_steps", -0.5), ("not_judged", ["a"]),
])
def test_a_hand_edited_meta_field_is_damage_naming_it(folder, field, value):
    edit_json(folder / "run.json", lambda run: run["meta"].update({field: value}))
    refused(folder, "corrupt", "run.json", f"meta {field}")


def test_a_meta_that_is_no_object_is_damage(folder):
    edit_json(folder / "run.json", lambda run: run.update(meta=[1]))
    refused(folder, "corrupt", "run.json", "meta")


def test_well_formed_events_and_timeline_load(folder):
    events = [{"step": 2, "what": "group 1 added", "names": ["a.weight"]}]
    timeline = [{"code": "orphan", "severity": "warning", "module": "0", "since": 0,
                 "until": 1, "ended": None}]
    edit_json(folder / "run.json", lambda run: run["meta"].update(events=events,
                                                                    timeline=timeline))
    meta = diagkit.load(folder).meta
    assert meta["events"] == events and meta["timeline"] == timeline


def test_explore_names_damage_as_damage(folder):
    pytest.importorskip("ipywidgets")
    data = (folder / "params.parquet").read_bytes()
    (folder / "params.parquet").write_bytes(data[:100])
    line = refused(folder, "corrupt", "params.parquet", reader=diagkit.explore)
    assert "replaced" not in line
    edit_json(folder / "run.json", lambda run: run["meta"].update(events="garbage"))
    refused(folder, "corrupt", "run.json", "meta events", reader=diagkit.explore)
