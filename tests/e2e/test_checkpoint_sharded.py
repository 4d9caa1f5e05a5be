"""Sharded and distributed checkpoints (issue 14, item 3): a Hugging Face sharded checkpoint
(an index and its shards, as `save_pretrained` writes them) and a `torch.distributed.checkpoint`
folder load with the same report and audit as one file of the same tensors, compare against
any other form, stream one shard (or one bounded piece) at a time, and each bad input is one
line, exit 2, through the CLI. Every checkpoint here is written by the real writers."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn

from diagkit import DiagkitError
from diagkit.judge.checkpoint_audit import load_findings
from diagkit.measure.checkpoints import dcp as checkpoint_dcp, shards as checkpoint_shards
from diagkit.measure.checkpoints.kind import DCP, FILE, HF_SHARDED, locate
from diagkit.measure.checkpoints.load import load_checkpoint
from diagkit.run.workbook.compare import compare_checkpoints
from cli_inprocess import run_cli
from jobs import run_job

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "data" / "finetune_heads_pretrain.pt"
DIAGKIT = str(Path(sys.executable).parent / "diagkit")
FINETUNE = "diagkit.demos:finetune_heads"


# ------------------------------------------------------------------ the writers
def save_hf_shards(state: dict, folder: Path, per_shard: int = 4, suffix=".safetensors") -> Path:
    """`state` as a Hugging Face sharded checkpoint: shards of `per_shard` tensors and the
    index naming each tensor's shard (what `save_pretrained` writes, by hand)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    groups = [names[i:i + per_shard] for i in range(0, len(names), per_shard)]
    weight_map = {}
    stem = "model" if suffix == ".safetensors" else "pytorch_model"
    for i, group in enumerate(groups, 1):
        shard = f"{stem}-{i:05d}-of-{len(groups):05d}{suffix}"
        part = {n: state[n].contiguous() for n in group}
        if suffix == ".safetensors":
            save_file(part, str(folder / shard), metadata={"format": "pt"})
        else:
            torch.save(part, folder / shard)
        weight_map.update({n: shard for n in group})
    index = folder / f"{stem}{suffix}.index.json"
    total = sum(t.numel() * t.element_size() for t in state.values())
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return index


def save_dcp(obj: dict, folder: Path) -> Path:
    """`obj` written by torch.distributed.checkpoint.save, in this one process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(obj, checkpoint_id=str(folder))
    assert (folder / ".metadata").is_file() and list(folder.glob("__*_*.distcp"))
    return folder


def pretrain() -> dict[str, torch.Tensor]:
    return torch.load(PRETRAIN, map_location="cpu", weights_only=True)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16, bos_token_id=0, eos_token_id=0))


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def same_report(a, b) -> bool:
    da, db = a.to_dict(), b.to_dict()
    da.pop("path"), db.pop("path")
    return da == db


def cli(*args, cwd=None):
    """The command line in this process (tests/cli_inprocess.py): only what it prints, writes
    and exits with is checked here. The console script itself runs as a subprocess in
    test_compare_cli_refuses_a_folder_that_is_no_checkpoint."""
    return run_cli(*args, cwd=cwd)


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


@pytest.mark.parametrize("form", ["hf_safetensors", "hf_bin", "dcp"])
def test_cli_check_reports_and_audits_as_for_one_file(tmp_path, form):
    """The finetune demo's pretraining checkpoint, once as the shipped file and once in
    `form`: the printed load report, the load report, the audit and the findings agree."""
    if form == "dcp":
        path = save_dcp({"model": pretrain(), "step": 3}, tmp_path / "ckpt")
    else:
        save_hf_shards(pretrain(), tmp_path / "ckpt", per_shard=5,
                       suffix=".safetensors" if form == "hf_safetensors" else ".bin")
        path = tmp_path / "ckpt"
    runs = {}
    for label, ckpt in (("file", PRETRAIN), (form, path)):
        run = cli("check", FINETUNE, "--checkpoint", ckpt, "--steps", "2",
                  "--json", tmp_path / f"{label}.json")
        assert run.returncode == 0, run.stderr
        text = " ".join(run.stdout.split())  # the line wraps where the folder's path ends
        assert "19 tensors loaded" in text and "dead_weight_in_checkpoint" in text
        runs[label] = json.loads((tmp_path / f"{label}.json").read_text())["checkpoint"]
    one, other = runs["file"], runs[form]
    one["load"].pop("path"), other["load"].pop("path")
    assert one["load"] == other["load"] and one["audit"] == other["audit"]
    assert one["audit"]["by_kind"]["unused"]["bytes"] == 19008


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


class _Evil:
    """Unpickling this runs `touch MARKER`: what a weights-only read must never do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_an_evil_entry_in_a_dcp_optimizer_state_is_refused_in_one_line(tmp_path):
    """As in one file, where the whole file is unpickled weights-only: an entry that needs
    code is refused wherever it is, even where nothing reads it (compare reads tensors only;
    an SGD's state was not even found), and its code never runs."""
    marker = tmp_path / "MARKER"
    groups = [{"lr": 0.1, "momentum": 0, "params": list(range(19)), "note": _Evil(marker)}]
    save_dcp({"model": pretrain(), "optimizer": {"state": {}, "param_groups": groups}},
             tmp_path / "c")
    for args in (["check", FINETUNE, "--checkpoint", tmp_path / "c", "--steps", "1"],
                 ["compare", tmp_path / "c", PRETRAIN]):
        run = cli(*args)
        assert run.returncode == 2, (run.stdout[-2000:], run.stderr)
        (line,) = run.stderr.strip().splitlines()
        assert "entry optimizer.param_groups.0.note" in line and "refused" in line, line
        assert "--trust-checkpoint" in line, line
    with pytest.raises(DiagkitError, match="needs arbitrary unpickling"):
        compare_checkpoints(PRETRAIN, tmp_path / "c")
    assert not marker.exists()


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


# ------------------------------------------------------------------ compare across the forms
def test_compare_accepts_every_form_on_either_side(tmp_path):
    state = pretrain()
    save_hf_shards(state, tmp_path / "hf")
    save_dcp({"model": state}, tmp_path / "dcp")
    save_file(state, str(tmp_path / "one.safetensors"))
    for a, b in (("hf", "one.safetensors"), ("dcp", "hf"), (PRETRAIN, "dcp")):
        cmp = compare_checkpoints(tmp_path / a, tmp_path / b)
        assert [f.code for f in cmp.findings] == ["nothing_changed"], (a, b)
        assert cmp.summary["unchanged"] == 19 and cmp.summary["in_both"] == 19
    later = dict(state)
    later["vocab_head.weight"] = later["vocab_head.weight"] + 1
    later["extra.weight"] = torch.zeros(3)
    save_dcp({"model": later}, tmp_path / "later")
    torch.save(later, tmp_path / "later.pt")
    across = compare_checkpoints(tmp_path / "hf", tmp_path / "later")
    files = compare_checkpoints(PRETRAIN, tmp_path / "later.pt")
    assert across.table.equals(files.table)
    assert dict(zip(across.table["name"], across.table["status"]))["vocab_head.weight"] == \
        "changed"
    run = cli("compare", tmp_path / "hf", tmp_path / "one.safetensors")
    assert run.returncode == 0, run.stderr
    assert "nothing_changed" in run.stdout


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


# ------------------------------------------------------------------ bad input: one line, exit 2
def _missing_shard(tmp):
    save_hf_shards(pretrain(), tmp / "c")
    (tmp / "c" / "model-00002-of-00005.safetensors").unlink()
    return tmp / "c", ["model-00002-of-00005.safetensors", "is missing"]


def _shard_lacks_a_tensor(tmp):
    save_hf_shards(pretrain(), tmp / "c")
    state = pretrain()
    save_file({"encoder.layers.1.0.weight": state["encoder.layers.1.0.weight"]},
              str(tmp / "c" / "model-00002-of-00005.safetensors"))
    return tmp / "c", ["model-00002-of-00005.safetensors", "lacks 3 tensor(s)"]


def _damaged_shard(tmp):
    save_hf_shards(pretrain(), tmp / "c")
    shard = tmp / "c" / "model-00003-of-00005.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    return tmp / "c", ["model-00003-of-00005.safetensors", "not a readable safetensors file"]


def _damaged_index(tmp):
    save_hf_shards(pretrain(), tmp / "c")
    (tmp / "c" / "model.safetensors.index.json").write_text('{"weight_map": ')
    return tmp / "c", ["model.safetensors.index.json", "not readable JSON"]


def _empty_folder(tmp):
    (tmp / "c").mkdir()
    return tmp / "c", ["is empty"]


def _not_a_checkpoint(tmp):
    (tmp / "c").mkdir()
    (tmp / "c" / "notes.txt").write_text("hello")
    (tmp / "c" / "config.json").write_text("{}")
    return tmp / "c", ["is not a checkpoint diagkit can read", "notes.txt"]


def _missing_distcp(tmp):
    save_dcp({"model": pretrain()}, tmp / "c")
    next((tmp / "c").glob("*.distcp")).unlink()
    return tmp / "c", ["__0_0.distcp", "is missing"]


def _truncated_distcp(tmp):
    save_dcp({"model": pretrain()}, tmp / "c")
    data = next((tmp / "c").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:1000])
    return tmp / "c", ["__0_0.distcp", "is truncated"]


def _damaged_metadata(tmp):
    save_dcp({"model": pretrain()}, tmp / "c")
    (tmp / "c" / ".metadata").write_bytes(b"\x80\x04garbage")
    return tmp / "c", [".metadata", "damaged"]


def _metadata_needing_code(tmp):
    save_dcp({"model": pretrain()}, tmp / "c")
    import collections
    import pickle
    (tmp / "c" / ".metadata").write_bytes(pickle.dumps(collections.Counter(a=1)))
    return tmp / "c", [".metadata", "refused", "--trust-checkpoint"]


BAD = {f.__name__.lstrip("_"): f for f in (
    _missing_shard, _shard_lacks_a_tensor, _damaged_shard, _damaged_index, _empty_folder,
    _not_a_checkpoint, _missing_distcp, _truncated_distcp, _damaged_metadata,
    _metadata_needing_code)}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2(tmp_path, case):
    path, words = BAD[case](tmp_path)
    run = cli("check", FINETUNE, "--checkpoint", path, "--steps", "1",
              "--json", tmp_path / "o.json")
    assert run.returncode == 2, (run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "o.json").exists()
    with pytest.raises(DiagkitError) as info:  # compare reads it through the same place
        compare_checkpoints(PRETRAIN, path)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_compare_cli_refuses_a_folder_that_is_no_checkpoint(tmp_path):
    """The real console script, in a subprocess (the module's other CLI tests run it in this
    process: tests/cli_inprocess.py)."""
    path, words = _not_a_checkpoint(tmp_path)
    run = subprocess.run([DIAGKIT, "compare", str(path), str(PRETRAIN)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert all(word in run.stderr for word in words), run.stderr
