"""Sharded and distributed checkpoints (issue 14, item 3), loaded: a Hugging Face sharded
checkpoint (an index and its shards, as `save_pretrained` writes them) and a
`torch.distributed.checkpoint` folder, one saved by two ranks included, load with the same
report as one file of the same tensors, and stream one shard (or one bounded piece) at a time.
Every checkpoint here is written by the real writers (tests/helpers/checkpoint_forms.py); what
the command line says of them (check, compare, each bad input in one line) is
test_checkpoint_sharded_cli.py."""

from __future__ import annotations

import sys
import weakref

import pytest
import torch
from safetensors.torch import save_file

from checkpoint_forms import (PRETRAIN, net, pretrain, same_report, save_dcp, save_hf_shards,
                              tiny_gpt2)
from diagkit import DiagkitError
from diagkit.judge.checkpoint_audit import load_findings
from diagkit.measure.checkpoints import dcp as checkpoint_dcp, shards as checkpoint_shards
from diagkit.measure.checkpoints.kind import DCP, FILE, HF_SHARDED, locate
from diagkit.measure.checkpoints.load import load_checkpoint
from diagkit.run.workbook.compare import compare_checkpoints
from jobs import run_job


# ------------------------------------------------------------------ one place decides the kind
def test_locate_names_each_kind(tmp_path):
    index = save_hf_shards(pretrain(), tmp_path / "hf")
    dcp_dir = save_dcp({"model": pretrain()}, tmp_path / "dcp")
    (tmp_path / "single").mkdir()
    save_file(pretrain(), str(tmp_path / "single" / "model.safetensors"))
    assert locate(tmp_path / "hf") == locate(index) and locate(index).kind == HF_SHARDED
    assert locate(dcp_dir).kind == DCP and locate(dcp_dir / ".metadata").path == dcp_dir
    assert locate(tmp_path / "single").path == tmp_path / "single" / "model.safetensors"
    assert locate(PRETRAIN).kind == FILE
    (tmp_path / "hf" / "other.bin.index.json").write_text("{}")
    with pytest.raises(DiagkitError, match="2 shard indexes"):
        locate(tmp_path / "hf")


# ------------------------------------------------------------------ the same report as one file
def test_save_pretrained_shards_load_as_the_single_file(tmp_path):
    model = tiny_gpt2()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    model.save_pretrained(tmp_path / "single")
    shards = list((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) >= 3 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    fresh_a, fresh_b = _reinit(tiny_gpt2()), _reinit(tiny_gpt2())
    sharded = load_checkpoint(fresh_a, tmp_path / "sharded")
    single = load_checkpoint(fresh_b, tmp_path / "single" / "model.safetensors")
    assert same_report(sharded, single) and len(sharded.matched) > 20
    by_index = load_checkpoint(_reinit(tiny_gpt2()),
                               tmp_path / "sharded" / "model.safetensors.index.json")
    assert same_report(by_index, single)
    for (name, x), y in zip(fresh_a.state_dict().items(), model.state_dict().values()):
        assert torch.equal(x, y), name


def _reinit(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # not the saved values: the load must overwrite every tensor
    return model


def test_a_missing_tensor_and_a_wrong_shape_in_shards_report_as_in_one_file(tmp_path):
    state = {k: torch.randn_like(v) for k, v in net().state_dict().items()}
    state["2.weight"] = torch.zeros(5, 4)  # another shape: not loaded
    state["stale.weight"] = torch.ones(7)  # not in the model
    del state["2.bias"]  # missing
    torch.save(state, tmp_path / "one.pt")
    save_hf_shards(state, tmp_path / "hf", per_shard=1)
    save_dcp(dict(state), tmp_path / "dcp")
    model = net()
    before = model[2].weight.detach().clone()
    single = load_checkpoint(net(), tmp_path / "one.pt")
    for form in ("hf", "dcp"):
        report = load_checkpoint(model, tmp_path / form)
        assert same_report(report, single), form
        assert report.missing == ["2.bias"] and report.unexpected == ["stale.weight"]
        assert report.mismatched == [{"name": "2.weight", "file": (5, 4), "model": (2, 4)}]
        assert {f.code for f in load_findings(report)} == {
            "checkpoint_shape_mismatch", "checkpoint_missing", "checkpoint_unexpected"}
        assert torch.equal(model[2].weight, before) and torch.equal(model[0].bias,
                                                                     state["0.bias"])


def test_dcp_optimizer_state_loads_as_from_one_file(tmp_path):
    """Non-tensor entries as in one file: the step is ignored, the optimizer state (its
    param_groups pickled, its per-parameter state keyed by id) goes into the optimizer."""
    model = net()
    opt = torch.optim.Adam([{"params": model[0].parameters()},
                            {"params": model[2].parameters(), "lr": 0.1}])
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    saved = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7}
    torch.save(saved, tmp_path / "one.pt")
    save_dcp(saved, tmp_path / "dcp")
    reports, opts = [], []
    for path in (tmp_path / "one.pt", tmp_path / "dcp"):
        fresh = net()
        fresh_opt = torch.optim.Adam([{"params": fresh[0].parameters()},
                                      {"params": fresh[2].parameters(), "lr": 0.1}])
        reports.append(load_checkpoint(fresh, path, optimizers=[fresh_opt]))
        opts.append((fresh, fresh_opt))
    assert same_report(*reports) and reports[1].optimizer["loaded"]
    names = sorted(n for n, _ in net().named_parameters())
    assert sorted(reports[1].optimizer["with_state"]) == names
    (m1, o1), (m2, o2) = opts
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
        assert torch.equal(o1.state[p1]["exp_avg_sq"], o2.state[p2]["exp_avg_sq"])
    assert o2.param_groups[1]["lr"] == 0.1
    other = torch.optim.Adam(net().parameters())  # one group of 4: does not fit, as for a file
    report = load_checkpoint(net(), tmp_path / "dcp", optimizers=[other])
    assert not report.optimizer["loaded"] and "[2, 2]" in report.optimizer["why"]


def test_dcp_optimizer_state_without_per_parameter_state_loads_as_from_one_file(tmp_path):
    """SGD without momentum keeps no per-parameter state; DCP drops the empty `state`, and
    the param groups (lr 0.1) were then silently not loaded, unlike from one file."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    torch.save(saved, tmp_path / "one.pt")
    save_dcp(saved, tmp_path / "dcp")
    reports = []
    for path in (tmp_path / "one.pt", tmp_path / "dcp"):
        fresh_opt = torch.optim.SGD(net().parameters(), lr=0.5)
        reports.append(load_checkpoint(net(), path, optimizers=[fresh_opt]))
        assert fresh_opt.param_groups[0]["lr"] == 0.1, path
    assert same_report(*reports) and reports[1].optimizer["loaded"]


SAVE_TWO_RANKS = """
import sys, warnings
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.distributed.checkpoint as dcp

def main(rank, out, store, source):
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (2,))
    state = torch.load(source, weights_only=True)
    dcp.save({"model": {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in state.items()},
              "step": 5}, checkpoint_id=out)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=tuple(sys.argv[1:]), nprocs=2)
"""


def test_dcp_saved_by_two_ranks_reads_in_one_process(tmp_path):
    """Every tensor split across two ranks' files (a DTensor sharded on dim 0, gloo, world 2):
    read back whole, with no process group, it is the file it was split from."""
    (tmp_path / "save.py").write_text(SAVE_TWO_RANKS)
    run = run_job([sys.executable, str(tmp_path / "save.py"), str(tmp_path / "dcp"),
                   str(tmp_path / "store"), str(PRETRAIN)], timeout=300)  # mp.spawn's ranks
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (tmp_path / "dcp").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]
    cmp = compare_checkpoints(tmp_path / "dcp", PRETRAIN)
    assert [f.code for f in cmp.findings] == ["nothing_changed"]
    assert cmp.summary["unchanged"] == 19
    from diagkit.demos.finetune import FinetuneModel
    model = FinetuneModel()
    assert same_report(load_checkpoint(model, tmp_path / "dcp"),
                       load_checkpoint(FinetuneModel(), PRETRAIN))
    for k, v in pretrain().items():
        assert torch.equal(model.state_dict()[k], v), k


# ------------------------------------------------------------------ streaming
def _count_live(monkeypatch, owner, name):
    """Wraps the project's own reading function `owner.name` (a module's function or a
    class's method): records, at each call, how many pieces it returned earlier still have a
    tensor alive, and the bytes of each piece it returns."""
    real = getattr(owner, name)
    live, seen, sizes = {}, [], []

    def wrapper(*args, **kwargs):
        seen.append(sum(1 for n in live.values() if n > 0))
        piece = real(*args, **kwargs)
        call = len(seen)
        live[call] = len(piece)
        sizes.append(sum(t.numel() * t.element_size() for t in piece.values()))

        def gone(call=call):
            live[call] -= 1
        for tensor in piece.values():
            weakref.finalize(tensor, gone)
        return piece

    monkeypatch.setattr(owner, name, wrapper)
    return seen, sizes


def test_shards_load_one_at_a_time(tmp_path, monkeypatch):
    state = pretrain()
    save_hf_shards(state, tmp_path / "hf", per_shard=3)  # 7 shards
    held, _ = _count_live(monkeypatch, checkpoint_shards, "read_shard")
    from diagkit.demos.finetune import FinetuneModel
    model = FinetuneModel()
    report = load_checkpoint(model, tmp_path / "hf")
    assert len(held) == 7 and held == [0] * 7  # no earlier shard alive when the next is read
    assert len(report.matched) == 19
    assert torch.equal(model.encoder.embed.weight, state["encoder.embed.weight"])


def test_compare_keeps_one_shard_open(tmp_path, monkeypatch):
    save_hf_shards(pretrain(), tmp_path / "hf", per_shard=3)
    real, open_now, most = checkpoint_shards.open_file, [0], [0]

    def counting(path, trust):
        file = real(path, trust)
        open_now[0] += 1
        most[0] = max(most[0], open_now[0])
        close = file.close

        def closing():
            open_now[0] -= 1
            close()
        file.close = closing
        return file

    monkeypatch.setattr(checkpoint_shards, "open_file", counting)
    cmp = compare_checkpoints(tmp_path / "hf", PRETRAIN)
    assert cmp.summary["unchanged"] == 19 and most[0] == 1 and open_now[0] == 0


def test_dcp_loads_in_bounded_pieces_one_at_a_time(tmp_path, monkeypatch):
    state = pretrain()
    save_dcp({"model": state, "step": 1}, tmp_path / "dcp")
    monkeypatch.setattr(checkpoint_dcp, "PIECE_BYTES", 8192)
    held, sizes = _count_live(monkeypatch, checkpoint_dcp.DcpCheckpoint, "load_piece")
    from diagkit.demos.finetune import FinetuneModel
    model = FinetuneModel()
    load_checkpoint(model, tmp_path / "dcp")
    largest = max(t.numel() * t.element_size() for t in state.values())
    assert len(sizes) > 3 and max(sizes) <= max(8192, largest) and held == [0] * len(sizes)
    assert sum(sizes) == sum(t.numel() * t.element_size() for t in state.values())
    for k, v in state.items():
        assert torch.equal(model.state_dict()[k], v), k
