"""The result's schema is versioned (docs/result.md, "Schema version"): `check --json`,
`Comparison.to_json_dict` and a saved folder carry `schema_version`, and the fields of each are
recorded per version in schema_versions.json. A field that changes while SCHEMA_VERSION stays
fails here: bump the version (core/schema.py) and record the new fields."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

import diagkit
from diagkit.core.result import Comparison, Finding, StepFailure
from diagkit.core.schema import FORMAT_VERSION, PARAMS_COLUMNS, SCHEMA_VERSION, STEPS_COLUMNS

RECORDED = Path(__file__).with_name("schema_versions.json")


@pytest.fixture(scope="module")
def diagnosis():
    """A real run with a finding (a layer never used) and a failure-free step."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.add_module("idle", torch.nn.Linear(2, 2))
    model.add_module("used", torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return diagkit.diagnose(model, opt, batch_fn=lambda: torch.ones(3, 2),
                            loss_fn=lambda m, b: m.used(b).sum(), steps=2)


def fields(diagnosis, folder: Path) -> dict[str, list[str]]:
    """Every field a reader of the JSON or of a saved folder relies on, by where it is."""
    as_json = diagnosis.to_json_dict()
    diagnosis.save(folder)
    run = json.loads((folder / "run.json").read_text())
    empty = Comparison("a", "b", pd.DataFrame(), [], {})
    return {
        "check_json": sorted(as_json),
        "params": list(PARAMS_COLUMNS),
        "steps": list(STEPS_COLUMNS),
        "finding": [f.name for f in dataclasses.fields(Finding)],
        "failure": [f.name for f in dataclasses.fields(StepFailure)],
        "advice": advice_fields(as_json["advice"]),
        "saved_files": sorted(p.name for p in folder.iterdir()),
        "run_json": sorted(run),
        "compare_json": sorted(empty.to_json_dict()),
    }


def advice_fields(advice: dict) -> list[str]:
    """`advice`'s keys, and one level below ("find_unused_parameters.value")."""
    return sorted(f"{key}.{sub}" if isinstance(value, dict) else key
                  for key, value in advice.items()
                  for sub in (value if isinstance(value, dict) else [None]))


def test_every_output_carries_the_version(diagnosis, tmp_path):
    assert diagnosis.to_json_dict()["schema_version"] == SCHEMA_VERSION
    diagnosis.save(tmp_path / "d")
    run = json.loads((tmp_path / "d" / "run.json").read_text())
    assert run["schema_version"] == SCHEMA_VERSION and run["format"] == FORMAT_VERSION
    assert SCHEMA_VERSION.split(".")[0] == str(FORMAT_VERSION)  # the major is the format
    assert diagkit.load(tmp_path / "d").to_json_dict()["schema_version"] == SCHEMA_VERSION


def test_a_field_never_changes_without_the_version(diagnosis, tmp_path):
    recorded = json.loads(RECORDED.read_text())
    now = fields(diagnosis, tmp_path / "d")
    assert SCHEMA_VERSION in recorded, (
        f"schema_version {SCHEMA_VERSION} has no record: add {json.dumps(now)} to {RECORDED}")
    changed = {where: {"added": sorted(set(now[where]) - set(was)),
                       "removed": sorted(set(was) - set(now[where]))}
               for where, was in recorded[SCHEMA_VERSION].items()
               if set(was) != set(now.get(where, ()))}
    assert not changed, (f"the result's fields changed but schema_version is still "
                         f"{SCHEMA_VERSION}: {changed}. Bump SCHEMA_VERSION in "
                         f"src/diagkit/core/schema.py (a field added: the minor; removed, "
                         f"renamed or its meaning changed: FORMAT_VERSION) and record the "
                         f"new fields in {RECORDED.name} (docs/result.md, \"Schema version\")")


def test_older_versions_stay_recorded():
    """A version once released keeps its record: the history a reader checks against."""
    recorded = json.loads(RECORDED.read_text())
    versions = sorted(recorded, key=lambda v: tuple(map(int, v.split("."))))
    assert versions[0] == "1.0" and versions[-1] == SCHEMA_VERSION
