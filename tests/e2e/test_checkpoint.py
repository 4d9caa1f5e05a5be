"""Loading a checkpoint into the model under diagnosis: layouts, prefixes, formats, the load
report, optimizer state, the dead-weight audit, and every bad input (one line, exit 2)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import diagkit
from diagkit import DiagkitError
from diagkit.run.diagnose.api import run_target
from diagkit.judge.checkpoint_audit import audit, load_findings
from diagkit.measure.checkpoints.load import load_checkpoint
from cli_inprocess import run_cli

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "data" / "finetune_heads_pretrain.pt"
DIAGKIT = str(Path(sys.executable).parent / "diagkit")


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def weights():
    torch.manual_seed(1)
    return {k: torch.randn_like(v) for k, v in net().state_dict().items()}


@pytest.mark.parametrize("layout", ["bare", "model", "state_dict", "model_state_dict", "module"])
def test_layouts_load_every_tensor(tmp_path, layout):
    state = weights()
    torch.save(state if layout == "bare" else {layout: state, "epoch": 3}, tmp_path / "c.pt")
    model = net()
    report = load_checkpoint(model, tmp_path / "c.pt")
    assert report.matched == sorted(state) and not report.missing and not report.unexpected
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k])


@pytest.mark.parametrize("side", ["file", "model"])
def test_module_prefix_on_either_side(tmp_path, side):
    state = weights()
    if side == "file":
        state, model = {f"module.{k}": v for k, v in state.items()}, net()
    else:
        model = nn.Sequential()
        model.add_module("module", net())
    torch.save(state, tmp_path / "c.pt")
    report = load_checkpoint(model, tmp_path / "c.pt")
    assert len(report.matched) == 4 and not report.missing


def test_safetensors_file(tmp_path):
    state = weights()
    save_file(state, str(tmp_path / "c.safetensors"))
    model = net()
    report = load_checkpoint(model, tmp_path / "c.safetensors")
    assert len(report.matched) == 4
    assert torch.equal(model[0].weight, state["0.weight"])


def test_report_names_missing_unexpected_shape_and_dtype(tmp_path):
    state = weights()
    state["2.weight"] = torch.zeros(5, 4)  # another shape: not loaded
    state["0.bias"] = state["0.bias"].double()  # another dtype: loaded, cast
    state["stale.weight"] = torch.ones(7)  # not in the model
    del state["2.bias"]  # missing from the file
    torch.save(state, tmp_path / "c.pt")
    model = net()
    before = model[2].weight.detach().clone()
    report = load_checkpoint(model, tmp_path / "c.pt")
    assert report.missing == ["2.bias"] and report.unexpected == ["stale.weight"]
    assert report.mismatched == [{"name": "2.weight", "file": (5, 4), "model": (2, 4)}]
    assert report.dtype_cast == [{"name": "0.bias", "file": "torch.float64",
                                  "model": "torch.float32"}]
    assert torch.equal(model[2].weight, before)  # the mismatched tensor kept its values
    codes = {f.code: f.severity for f in load_findings(report)}
    assert codes == {"checkpoint_shape_mismatch": "error", "checkpoint_missing": "warning",
                     "checkpoint_unexpected": "info"}
    statuses = dict(zip(report.table()["name"], report.table()["status"]))
    assert statuses["2.weight"].startswith("shape mismatch") and statuses["0.bias"] == "dtype cast"


def test_optimizer_state_is_mapped_onto_the_current_groups(tmp_path):
    model = net()
    opt = torch.optim.Adam([{"params": model[0].parameters()},
                            {"params": model[2].parameters(), "lr": 0.1}])
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "c.pt")
    fresh = net()
    fresh_opt = torch.optim.Adam([{"params": fresh[0].parameters()},
                                  {"params": fresh[2].parameters(), "lr": 0.1}])
    report = load_checkpoint(fresh, tmp_path / "c.pt", optimizers=[fresh_opt])
    assert report.optimizer["loaded"] and report.optimizer["sizes_in_file"] == [2, 2]
    assert sorted(report.optimizer["with_state"]) == sorted(n for n, _ in fresh.named_parameters())
    assert torch.equal(fresh_opt.state[fresh[0].weight]["exp_avg"], opt.state[model[0].weight]["exp_avg"])
    other = torch.optim.Adam(net().parameters())  # one group of 4: does not fit
    report = load_checkpoint(net(), tmp_path / "c.pt", optimizers=[other])
    assert not report.optimizer["loaded"] and "[2, 2]" in report.optimizer["why"]
    assert "checkpoint_optimizer_mismatch" in {f.code for f in load_findings(report)}


def test_finetune_audit_counts_the_dead_bytes():
    diag = run_target("diagkit.demos:finetune_heads", checkpoint=str(PRETRAIN), steps=2)
    dead = diag.checkpoint["audit"]["by_kind"]["unused"]
    unused = diag.params[diag.params["verdicts"].map(lambda v: "unused" in v)]
    assert dead["bytes"] == unused["bytes"].sum() == 19008 and dead["tensors"] == 8
    assert {f.code for f in diag.findings} >= {"unused", "dead_weight_in_checkpoint",
                                               "checkpoint_missing"}
    missing = next(f for f in diag.findings if f.code == "checkpoint_missing")
    assert missing.severity == "info" and all(n.startswith("ffn_head.") for n in missing.params)


def test_audit_separates_orphan_unused_and_frozen():
    setup = diagkit.load_target("diagkit.demos:meta_memory")
    diag = diagkit.diagnose(setup, steps=2)

    class Report:  # the audit reads only file sizes by name
        file_bytes = {n: b for n, b in zip(diag.params["name"], diag.params["bytes"])}
    result = audit(diag.params, Report())
    assert result["by_kind"]["orphan"]["names"] == ["module.metamodel.model.mem_tokens"]
    assert result["by_kind"]["frozen"]["tensors"] == 11


BAD = {
    "missing": (None, ["no such checkpoint file"]),
    "empty": (b"", ["is empty"]),
    "truncated": ("truncate", ["not a readable PyTorch file"]),
    "not_a_checkpoint": (b"hello, this is not a checkpoint\n" * 20, ["not a readable"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_files_are_one_line_errors(tmp_path, case):
    content, words = BAD[case]
    path = tmp_path / f"{case}.pt"
    if content == "truncate":
        torch.save(weights(), path)
        path.write_bytes(path.read_bytes()[:200])
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(DiagkitError) as info:
        load_checkpoint(net(), path)
    for word in words:
        assert word in str(info.value)


class Payload:
    """Any class: a weights-only load refuses every object it would have to import."""


def test_a_pickle_needing_code_is_refused_naming_the_flag(tmp_path):
    torch.save({"x": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(DiagkitError) as info:
        load_checkpoint(net(), tmp_path / "evil.pt")
    assert "--trust-checkpoint" in str(info.value) and "refused" in str(info.value)


def test_another_architecture_is_an_error(tmp_path):
    torch.save({"0.weight": torch.zeros(9, 9), "0.bias": torch.zeros(9)}, tmp_path / "c.pt")
    with pytest.raises(DiagkitError) as info:
        load_checkpoint(net(), tmp_path / "c.pt")
    assert "another architecture" in str(info.value)
    torch.save({"encoder.w": torch.zeros(2)}, tmp_path / "d.pt")
    with pytest.raises(DiagkitError) as info:
        load_checkpoint(net(), tmp_path / "d.pt")
    assert "matches none" in str(info.value)


def test_cli_shows_the_load_report_and_refuses_bad_files(tmp_path):
    # The first run in this process (tests/helpers/cli_inprocess.py); the second is the real console
    # script, in a subprocess.
    run = run_cli("check", "diagkit.demos:finetune_heads", "--checkpoint", PRETRAIN,
                  "--steps", "2")
    assert run.returncode == 0, run.stderr
    assert "19 tensors loaded" in run.stdout and "dead_weight_in_checkpoint" in run.stdout
    torch.save({"x.weight": torch.zeros(3)}, tmp_path / "other.pt")
    run = subprocess.run([DIAGKIT, "check", "diagkit.demos:finetune_heads", "--checkpoint",
                          str(tmp_path / "other.pt"), "--json", str(tmp_path / "o.json")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "matches none" in run.stderr and not (tmp_path / "o.json").exists()
