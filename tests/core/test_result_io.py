"""Diagnosis.save / diagkit.load round-trip everything; the HTML summaries escape user names."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

import diagkit
from diagkit import DiagkitError
from diagkit.judge.findings import build_findings

HOSTILE = "<script>alert('x')</script>&\"q\""


def failing_at(step_to_fail: int, steps: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(i):
        if i == step_to_fail:
            raise ValueError(f"step {i} exploded")
        opt.zero_grad()
        loss = model(torch.ones(2, 3)).sum()
        loss.backward()
        opt.step()
        return loss
    return diagkit.diagnose(model, opt, train_step=train_step, steps=steps)


def healthy():
    return failing_at(step_to_fail=-1, steps=2)


def hostile_diagnosis():
    """A real run on a model whose submodule name is markup; that submodule is never used."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.add_module(HOSTILE, torch.nn.Linear(2, 2))
    model.add_module("used", torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return diagkit.diagnose(model, opt, batch_fn=lambda: torch.ones(3, 2),
                            loss_fn=lambda m, b: m.used(b).sum(), steps=2)


@pytest.fixture(scope="module")
def meta_diag(meta):
    return meta


def assert_same(a: diagkit.Diagnosis, b: diagkit.Diagnosis):
    pd.testing.assert_frame_equal(a.params, b.params)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.findings == b.findings
    assert a.advice == b.advice
    assert a.failure == b.failure
    assert a.meta == b.meta


# ------------------------------------------------------------------ round trip
def test_round_trip_of_a_real_diagnosis(meta_diag, tmp_path):
    meta_diag.save(tmp_path / "diag")
    loaded = diagkit.load(tmp_path / "diag")
    assert_same(loaded, meta_diag)
    for col in ("aliases", "shape", "memberships", "verdicts"):
        assert all(isinstance(v, tuple) for v in loaded.params[col]), col
    mem = loaded.params.set_index("name").loc["module.metamodel.model.mem_tokens"]
    assert set(mem["verdicts"]) == {"orphan", "grad_not_cleared"}
    assert mem["shape"] == (4, 32)
    assert all(isinstance(m, tuple) and all(isinstance(x, tuple) for x in m)
               for m in loaded.params["memberships"])
    assert loaded.verdicts() == meta_diag.verdicts()
    assert loaded.worst() == meta_diag.worst()


def test_round_trip_keeps_the_failure_and_the_steps_before_it(tmp_path):
    diag = failing_at(2)
    assert diag.failure is not None and diag.failure.step == 2
    assert sorted(diag.steps["step"].unique()) == [0, 1]
    diag.save(tmp_path / "failed")
    loaded = diagkit.load(tmp_path / "failed")
    assert_same(loaded, diag)
    assert loaded.failure.step == 2 and "step 2 exploded" in loaded.failure.error
    assert "Traceback" in loaded.failure.traceback
    assert loaded.findings[0].code == "step_failed"


def test_round_trip_of_hand_made_tuples(tmp_path):
    diag = hostile_diagnosis()
    params = diag.params.copy()
    params.at[0, "aliases"] = ("tied.weight", "other.weight")
    diag = dataclasses.replace(diag, params=params)
    diag.save(tmp_path / "d")
    loaded = diagkit.load(tmp_path / "d")
    assert loaded.params.at[0, "aliases"] == ("tied.weight", "other.weight")
    assert loaded.params.at[1, "aliases"] == ()
    assert_same(loaded, diag)


def test_save_returns_the_folder_and_leaves_no_temporary(meta_diag, tmp_path):
    out = meta_diag.save(tmp_path / "diag")
    assert out == tmp_path / "diag"
    assert [p.name for p in tmp_path.iterdir()] == ["diag"]


def test_save_over_an_existing_folder_replaces_it(meta_diag, tmp_path):
    target = tmp_path / "diag"
    failing_at(1).save(target)
    (target / "stale.txt").write_text("left from before")
    meta_diag.save(target)
    loaded = diagkit.load(target)
    assert_same(loaded, meta_diag)
    assert loaded.failure is None
    assert not (target / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["diag"]


def test_save_onto_an_existing_file_is_refused_and_keeps_the_file(meta_diag, tmp_path):
    target = tmp_path / "results.txt"
    target.write_text("the user's own notes\n")
    with pytest.raises(DiagkitError):
        meta_diag.save(target)
    assert target.is_file() and target.read_text() == "the user's own notes\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.txt"]


def test_load_of_a_folder_that_is_not_a_diagnosis(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DiagkitError, match="not a saved diagnosis"):
        diagkit.load(tmp_path)
    with pytest.raises(DiagkitError):
        diagkit.load(tmp_path / "does_not_exist")


@pytest.mark.parametrize("edit, words", [
    (lambda fs: fs[0].update(severity="fatal"), ["finding 0", "'fatal'", "error, warning, info"]),
    (lambda fs: fs[0].pop("severity"), ["finding 0", "severity None"]),
    (lambda fs: fs.append("orphan"), ["must be a list of findings"]),
])
def test_load_refuses_a_finding_whose_severity_it_cannot_rank(meta_diag, tmp_path, edit, words):
    """An unknown severity ranks as ok: the saved run would pass every --fail-on."""
    folder = meta_diag.save(tmp_path / "diag")
    findings = json.loads((folder / "findings.json").read_text())
    edit(findings)
    (folder / "findings.json").write_text(json.dumps(findings))
    with pytest.raises(DiagkitError) as info:
        diagkit.load(folder)
    line = str(info.value)
    assert "\n" not in line and str(folder) in line and "corrupt" in line, line
    for word in words:
        assert word in line, line


def test_saved_files_are_plain_json_and_parquet(meta_diag, tmp_path):
    meta_diag.save(tmp_path / "diag")
    run = json.loads((tmp_path / "diag" / "run.json").read_text())
    assert run["meta"]["steps_observed"] == meta_diag.meta["steps_requested"] == 5
    assert pd.read_parquet(tmp_path / "diag" / "params.parquet").shape[0] == len(meta_diag.params)
    findings = json.loads((tmp_path / "diag" / "findings.json").read_text())
    assert [f["code"] for f in findings] == [f.code for f in meta_diag.findings]


def test_round_trip_of_a_run_with_a_nan_loss(tmp_path):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    diag = diagkit.diagnose(model, opt, batch_fn=lambda: torch.ones(3, 2),
                            loss_fn=lambda m, b: m(b).sum() * float("nan"), steps=2)
    assert all("nonfinite_grad" in v for v in diag.verdicts().values())
    diag.save(tmp_path / "nan")
    loaded = diagkit.load(tmp_path / "nan")
    assert loaded.verdicts() == diag.verdicts()


def test_a_failure_at_step_0_still_gives_a_diagnosis(tmp_path):
    diag = failing_at(0)
    assert diag.failure.step == 0
    assert diag.findings[0].code == "step_failed"
    assert len(diag.steps) == 0 and len(diag.params) == 4
    diag.save(tmp_path / "d")
    assert diagkit.load(tmp_path / "d").failure.step == 0


# ------------------------------------------------------------------ HTML
def test_repr_html_escapes_a_hostile_name():
    diag = hostile_diagnosis()
    assert f"{HOSTILE}.weight" in set(diag.params["name"])
    assert diag.verdicts()[f"{HOSTILE}.weight"] == {"unused"}
    html = diag._repr_html_()
    assert "<script" not in html
    assert "&lt;script&gt;" in html  # the name is shown, escaped
    assert HOSTILE not in html


def test_repr_html_escapes_a_crafted_params_name():
    diag = healthy()
    params = diag.params.copy()
    steps = diag.steps.copy()
    old = params.at[0, "name"]
    params.at[0, "name"] = f"<img src=x onerror=alert(1)>{old}"
    steps.loc[steps["name"] == old, "name"] = params.at[0, "name"]
    params.at[0, "verdicts"] = ("orphan",)
    crafted = diagkit.Diagnosis(params=params, steps=steps,
                                findings=build_findings(params, steps), advice=diag.advice,
                                meta=diag.meta)
    html = crafted._repr_html_()
    assert "<img" not in html and "&lt;img" in html


def test_repr_html_summarises():
    diag = healthy()
    html = diag._repr_html_().replace("\xa0", " ")  # a number and its unit never split
    assert "2 steps observed" in html and "find_unused_parameters" in html


