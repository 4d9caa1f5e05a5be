"""Sharded and distributed checkpoints (issue 14, item 3) through the command line: `diagkit
check --checkpoint` reports and audits a Hugging Face sharded checkpoint or a
`torch.distributed.checkpoint` folder as one file of the same tensors, compare takes any form
on either side, an entry that needs code is refused, and each bad input is one line, exit 2.
Every checkpoint here is written by the real writers (tests/helpers/checkpoint_forms.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from checkpoint_forms import PRETRAIN, pretrain, save_dcp, save_hf_shards
from cli_inprocess import run_cli
from diagkit import DiagkitError
from diagkit.run.workbook.compare import compare_checkpoints

DIAGKIT = str(Path(sys.executable).parent / "diagkit")
FINETUNE = "diagkit.demos:finetune_heads"


def cli(*args, cwd=None):
    """The command line in this process (tests/helpers/cli_inprocess.py): only what it
    prints, writes and exits with is checked here. The console script itself runs as a
    subprocess in test_compare_cli_refuses_a_folder_that_is_no_checkpoint."""
    return run_cli(*args, cwd=cwd)


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
    process: tests/helpers/cli_inprocess.py)."""
    path, words = _not_a_checkpoint(tmp_path)
    run = subprocess.run([DIAGKIT, "compare", str(path), str(PRETRAIN)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert all(word in run.stderr for word in words), run.stderr
