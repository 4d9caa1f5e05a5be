"""How reading a saved diagnosis reads an older one (issue 36, R13): a save from before a
column existed is read with the value that column meant then, by `load` and `report --from`."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import diagkit
from diagkit.run.notebook import load_saved

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
