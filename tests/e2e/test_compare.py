"""Checkpoint comparison (`diagkit.compare`, SPEC 4 `diagkit compare`, 5, 6): what changed
between two saves, on the meta_memory demo's checkpoints and on hand-made files; bad input;
streaming memory; the compare notebook under papermill."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import papermill
import pytest
import torch
from matplotlib.figure import Figure
from papermill.exceptions import PapermillExecutionError
from safetensors.torch import save_file

from cli_inprocess import run_cli
from diagkit import DiagkitError
from diagkit.measure.checkpoints import diff as checkpoint_diff
from diagkit.present import comparison
from diagkit.run.workbook import compare
from diagkit.present.text import comparison_text
from diagkit.run.workbook.compare import compare_checkpoints

REPO = Path(__file__).resolve().parents[2]
STEP2 = REPO / "data" / "meta_memory_step2.pt"
STEP5 = REPO / "data" / "meta_memory_step5.pt"
NOTEBOOK = REPO / "notebooks" / "compare_checkpoints.ipynb"
MEM = "module.metamodel.model.mem_tokens"
TRAINED = ("module.hypernet.", "module.metalora.", "module.lm_head.")


def _model(path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def _status(cmp) -> dict[str, str]:
    return dict(zip(cmp.table["name"], cmp.table["status"]))


def _codes(cmp) -> list[str]:
    return [f.code for f in cmp.findings]


@pytest.fixture(scope="module")
def demo():
    return compare_checkpoints(STEP2, STEP5)


# ------------------------------------------------------------------ the demo pair
def test_demo_data_are_two_small_weights_only_saves_of_the_demo():
    for path, step in ((STEP2, 2), (STEP5, 5)):
        assert path.stat().st_size < 200_000
        obj = torch.load(path, map_location="cpu", weights_only=True)
        assert obj["step"] == step and set(obj) == {"model", "optimizer", "step"}
        assert MEM in obj["model"]
    assert not torch.equal(_model(STEP2)["module.lm_head.weight"],
                           _model(STEP5)["module.lm_head.weight"])


def test_demo_pair_names_mem_tokens_in_one_unchanged_finding_per_subtree(demo):
    status = _status(demo)
    assert status[MEM] == "unchanged"
    backbone = [n for n in status if n.startswith("module.metamodel.")]
    assert len(backbone) == 12 and all(status[n] == "unchanged" for n in backbone)
    unchanged = [f for f in demo.findings if f.code == "unchanged"]
    assert len(unchanged) == 1  # the frozen backbone and mem_tokens: one subtree, one finding
    f = unchanged[0]
    assert f.severity == "warning" and f.module == "module.metamodel"
    assert set(f.params) == set(backbone) and f.count == 12
    assert f.bytes == int(demo.table.loc[demo.table["name"].isin(backbone), "bytes"].sum())
    assert MEM in f.message  # the hand-added tensor is named, not only counted
    assert "module.metamodel.model.embed.weight" not in f.message
    assert "optimizer" in f.fix and "module." in f.fix
    assert demo.worst() == "warning"
    assert demo.fails("warning") and demo.fails("info") and not demo.fails("error")
    assert not demo.fails("never")


def test_demo_pair_trained_tensors_changed(demo):
    t = demo.table.set_index("name")
    trained = [n for n in t.index if n.startswith(TRAINED)]
    assert len(trained) == 8
    for name in trained:
        row = t.loc[name]
        assert row["status"] == "changed" and not row["identical"]
        assert 0 < row["relative_change"] < 1
        assert row["max_abs_diff"] > 0
        assert math.isclose(row["relative_change"], row["delta_norm"] / row["norm_a"])
    a, b = _model(STEP2)["module.lm_head.weight"], _model(STEP5)["module.lm_head.weight"]
    row = t.loc["module.lm_head.weight"]
    assert math.isclose(row["delta_norm"], float((b.double() - a.double()).norm()), rel_tol=1e-9)
    assert math.isclose(row["norm_a"], float(a.double().norm()), rel_tol=1e-9)
    assert math.isclose(row["max_abs_diff"], float((b.double() - a.double()).abs().max()))
    assert t.loc[MEM, "relative_change"] == 0 and t.loc[MEM, "norm_a"] > 0
    s = demo.summary
    assert (s["tensors"], s["changed"], s["unchanged"], s["only_in_a"], s["only_in_b"]) == \
        (20, 8, 12, 0, 0)
    assert s["bytes"] == int(demo.table["bytes"].sum()) > 0


def test_table_columns_and_shapes(demo):
    assert list(demo.table.columns) == list(checkpoint_diff.COLUMNS)
    for col in ("name", "module", "in_a", "in_b", "shape_a", "shape_b", "dtype_a", "dtype_b",
                "numel", "bytes", "identical", "max_abs_diff", "delta_norm", "norm_a",
                "relative_change"):
        assert col in demo.table.columns
    row = demo.table.set_index("name").loc[MEM]
    assert row["shape_a"] == row["shape_b"] == (4, 32)
    assert row["dtype_a"] == "torch.float32" and row["numel"] == 128 and row["bytes"] == 512
    assert row["module"] == "module.metamodel.model"


def test_render_text_and_strict_json(demo):
    text = comparison_text(demo)
    first = text.splitlines()[0]
    assert str(STEP2) in first and str(STEP5) in first and "12 unchanged" in first
    assert "[warning] unchanged: module.metamodel" in text and MEM in text and "fix:" in text
    payload = demo.to_json_dict()
    json.dumps(payload, allow_nan=False)
    assert payload["worst"] == "warning" and len(payload["tensors"]) == 20
    assert payload["findings"][0]["code"] == "unchanged"
    mem = next(r for r in payload["tensors"] if r["name"] == MEM)
    assert mem["shape_a"] == [4, 32] and mem["identical"] is True


# ------------------------------------------------------------------ hand-made pairs
def test_identical_files_everything_unchanged_but_no_unchanged_finding(tmp_path):
    copy = tmp_path / "copy.pt"
    shutil.copy(STEP5, copy)
    for other, same_file in ((STEP5, True), (copy, False)):
        cmp = compare_checkpoints(STEP5, other)
        assert set(cmp.table["status"]) == {"unchanged"} and cmp.table["identical"].all()
        assert _codes(cmp) == ["nothing_changed"]
        f = cmp.findings[0]
        assert f.severity == "info" and f.count == 20 and "nothing changed" in f.message
        assert ("same file" in f.message) is same_file
        assert cmp.worst() == "info" and not cmp.fails("warning")


def test_module_prefix_on_one_side_aligns(tmp_path, demo):
    bare = tmp_path / "bare.pt"
    torch.save({k.removeprefix("module."): v for k, v in _model(STEP5).items()}, bare)
    forward = compare_checkpoints(STEP2, bare)
    assert _status(forward) == _status(demo)  # A's spelling kept: module.…
    assert forward.table["in_a"].all() and forward.table["in_b"].all()
    backward = compare_checkpoints(bare, STEP2)
    assert set(backward.table["name"]) == {n.removeprefix("module.") for n in _status(demo)}
    assert _status(backward)["metamodel.model.mem_tokens"] == "unchanged"
    assert backward.summary["changed"] == 8


def test_safetensors_and_pt_of_the_same_weights_are_identical(tmp_path, demo):
    st2, st5 = tmp_path / "step2.safetensors", tmp_path / "step5.bin"  # .bin: found by content
    save_file(_model(STEP2), str(st2))
    save_file(_model(STEP5), str(st5))
    same = compare_checkpoints(STEP2, st2)
    assert set(same.table["status"]) == {"unchanged"} and _codes(same) == ["nothing_changed"]
    assert same.table["dtype_b"].eq("torch.float32").all()
    mixed = compare_checkpoints(st2, STEP5)
    assert _status(mixed) == _status(demo)
    both = compare_checkpoints(st2, st5)
    assert _status(both) == _status(demo)
    t, d = both.table.set_index("name"), demo.table.set_index("name")
    assert (t["delta_norm"] - d["delta_norm"]).abs().max() == 0


def test_extra_tensor_and_missing_tensor_are_reported(tmp_path, demo):
    state = _model(STEP5)
    state["module.new_head.weight"] = torch.ones(3, 4)
    state["module.new_head.bias"] = torch.zeros(3)
    del state["module.lm_head.bias"]
    extra = tmp_path / "extra.pt"
    torch.save({"state_dict": state}, extra)
    cmp = compare_checkpoints(STEP2, extra)
    status = _status(cmp)
    assert status["module.new_head.weight"] == status["module.new_head.bias"] == "only_in_b"
    assert status["module.lm_head.bias"] == "only_in_a"
    only_b = next(f for f in cmp.findings if f.code == "only_in_b")
    assert only_b.severity == "info" and only_b.module == "module.new_head"
    assert set(only_b.params) == {"module.new_head.weight", "module.new_head.bias"}
    assert only_b.bytes == 12 * 4 + 3 * 4 and str(extra) in only_b.message
    only_a = next(f for f in cmp.findings if f.code == "only_in_a")
    assert only_a.params == ("module.lm_head.bias",)
    row = cmp.table.set_index("name").loc["module.new_head.weight"]
    assert not row["in_a"] and row["in_b"] and row["shape_a"] is None
    assert math.isnan(row["relative_change"])
    json.dumps(cmp.to_json_dict(), allow_nan=False)  # NaN -> null


def test_shape_mismatch_is_a_warning(tmp_path):
    state = _model(STEP5)
    state["module.lm_head.weight"] = torch.zeros(80, 32)
    state["module.lm_head.bias"] = torch.zeros(80)
    path = tmp_path / "wider.pt"
    torch.save(state, path)
    cmp = compare_checkpoints(STEP2, path)
    assert _status(cmp)["module.lm_head.weight"] == "shape_mismatch"
    f = next(f for f in cmp.findings if f.code == "shape_mismatch")
    assert f.severity == "warning" and f.module == "module.lm_head" and f.count == 2
    assert "64×32 in A, 80×32 in B" in f.message
    row = cmp.table.set_index("name").loc["module.lm_head.weight"]
    assert row["shape_a"] == (64, 32) and row["shape_b"] == (80, 32) and not row["identical"]
    assert row["numel"] == 80 * 32 and math.isnan(row["delta_norm"])


def test_dtype_change_compares_by_value(tmp_path):
    a = {"enc.weight": torch.randn(4, 4), "enc.bias": torch.randn(4), "head.weight": torch.randn(2)}
    b = {"enc.weight": a["enc.weight"].double(), "enc.bias": a["enc.bias"].bfloat16(),
         "head.weight": a["head.weight"] + 1}
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    cmp = compare_checkpoints(tmp_path / "a.pt", tmp_path / "b.pt")
    status = _status(cmp)
    assert status["enc.weight"] == "unchanged"  # float32 -> float64 is exact
    assert status["enc.bias"] == "changed" and status["head.weight"] == "changed"
    dtype = [f for f in cmp.findings if f.code == "dtype_mismatch"]
    assert dtype and dtype[0].severity == "info" and dtype[0].module == "enc"


def test_chunked_measures_are_exact_for_large_tensors(tmp_path):
    gen = torch.Generator().manual_seed(0)
    rows = 3 * checkpoint_diff.CHUNK // 100 + 7  # several row blocks of 100 columns
    a = {"big.weight": torch.randn(rows, 100, generator=gen),
         "flat.weight": torch.zeros(checkpoint_diff.CHUNK * 2 + 5)}
    b = {"big.weight": a["big.weight"].clone(), "flat.weight": a["flat.weight"].clone()}
    b["big.weight"][-1, -1] += 2.0  # only in the last block
    b["flat.weight"][0], b["flat.weight"][-1] = -3.0, 4.0
    for suffix, save in ((".pt", lambda s, p: torch.save(s, p)),
                         (".safetensors", lambda s, p: save_file(s, str(p)))):
        pa, pb = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
        save(a, pa)
        save(b, pb)
        t = compare_checkpoints(pa, pb).table.set_index("name")
        big = t.loc["big.weight"]
        diff = b["big.weight"].double() - a["big.weight"].double()
        assert big["status"] == "changed"
        assert math.isclose(big["delta_norm"], float(diff.norm()), rel_tol=1e-12)
        assert math.isclose(big["norm_a"], float(a["big.weight"].double().norm()), rel_tol=1e-9)
        assert big["max_abs_diff"] == float(diff.abs().max())
        flat = t.loc["flat.weight"]
        assert (flat["max_abs_diff"], flat["delta_norm"], flat["norm_a"]) == (4.0, 5.0, 0.0)
        assert flat["relative_change"] == math.inf  # from all zeros


# ------------------------------------------------------------------ bad input
class _RunsCode:
    def __reduce__(self):
        return (print, ("this would run on load",))


def _bad_files(folder: Path) -> dict[str, Path]:
    data = STEP5.read_bytes()
    files = {name: folder / name for name in
             ("empty.pt", "truncated.pt", "junk.pt", "pickle.pt", "nothing_shared.pt",
              "no_state.pt", "junk.safetensors", "truncated.safetensors")}
    files["empty.pt"].write_bytes(b"")
    files["truncated.pt"].write_bytes(data[: len(data) // 2])
    files["junk.pt"].write_bytes(b"not a checkpoint\n" * 40)
    torch.save({"model": _model(STEP5), "extra": _RunsCode()}, files["pickle.pt"])
    torch.save({"other.weight": torch.ones(2)}, files["nothing_shared.pt"])
    torch.save({"step": 3, "lr": 0.1}, files["no_state.pt"])
    files["junk.safetensors"].write_bytes(b"junk" * 64)
    save_file({"x": torch.ones(8)}, str(folder / "whole.safetensors"))
    files["truncated.safetensors"].write_bytes(
        (folder / "whole.safetensors").read_bytes()[:-5])
    files["missing.pt"] = folder / "missing.pt"
    return files


@pytest.mark.parametrize("which, words", [
    ("missing.pt", ["no such checkpoint file", "missing.pt"]),
    ("empty.pt", ["empty.pt", "is empty"]),
    ("truncated.pt", ["truncated.pt", "not a readable PyTorch file"]),
    ("junk.pt", ["junk.pt", "not a readable PyTorch file"]),
    ("pickle.pt", ["pickle.pt", "arbitrary unpickling", "--trust-checkpoint"]),
    ("nothing_shared.pt", ["no tensor name in common", "'other.weight'", "not saves of the same"]),
    ("no_state.pt", ["no_state.pt", "no state dict of tensors"]),
    ("junk.safetensors", ["junk.safetensors", "not a readable safetensors file"]),
    ("truncated.safetensors", ["truncated.safetensors", "not a readable safetensors file"]),
])
@pytest.mark.parametrize("side", ["a", "b"])
def test_bad_input_is_one_line_diagkit_error(tmp_path, which, words, side):
    bad = _bad_files(tmp_path)[which]
    pair = (bad, STEP5) if side == "a" else (STEP5, bad)
    with pytest.raises(DiagkitError) as info:
        compare_checkpoints(*pair)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_trust_opts_in_to_arbitrary_unpickling(tmp_path, capfd):
    path = _bad_files(tmp_path)["pickle.pt"]
    cmp = compare_checkpoints(STEP5, path, trust=True)
    assert _codes(cmp) == ["nothing_changed"]
    assert "this would run on load" in capfd.readouterr().out


# ------------------------------------------------------------------ streaming
# One process imports diagkit, then forks a child for each format, which compares the small pair
# (first-call allocations, and the pages of the libraries it touches: a forked child maps them
# afresh) and then the large one; its peak resident size grows from there as a fresh process's.
_MEASURE = textwrap.dedent("""
    import json, os, resource, sys, traceback
    from diagkit.run.workbook.compare import compare_checkpoints

    def maxrss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    for i in range(1, len(sys.argv), 4):
        small_a, small_b, a, b = sys.argv[i:i + 4]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read)
                compare_checkpoints(small_a, small_b)  # first-call allocations: the baseline
                base = maxrss()
                cmp = compare_checkpoints(a, b)
                peak = maxrss()
                os.write(write, json.dumps({"grew_kib": peak - base,
                                            "summary": cmp.summary}).encode())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as f:
            line = f.read()
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, a
        print(line, flush=True)
""")
SUFFIXES = (".pt", ".safetensors")


@pytest.fixture(scope="module")
def streamed(tmp_path_factory) -> dict[str, tuple[dict, int]]:
    """Two saves of ~50 MB, as .pt and as .safetensors, each pair compared in a process of its
    own: {suffix: (what it measured, the size of one file)}."""
    folder = tmp_path_factory.mktemp("streaming")
    gen = torch.Generator().manual_seed(0)
    a = {f"layers.{i}.weight": torch.randn(512, 1024, generator=gen) for i in range(20)}
    a["embed.weight"] = torch.randn(2_600_000, generator=gen)  # one tensor of ~10 MB
    b = {k: (v + 0.01 if i % 2 else v) for i, (k, v) in enumerate(a.items())}
    args = []
    for suffix in SUFFIXES:
        paths = [folder / f"{n}{suffix}" for n in ("small_a", "small_b", "a", "b")]
        for state, path in zip(({"x.weight": torch.ones(4)}, {"x.weight": torch.zeros(4)}, a, b),
                               paths):
            if suffix == ".pt":
                torch.save({"model": state, "step": 1}, path)
            else:
                save_file(state, str(path))
        args += paths
    del a, b
    run = subprocess.run([sys.executable, "-c", _MEASURE, *map(str, args)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()[-len(SUFFIXES):]
    return {suffix: (json.loads(line), (folder / f"a{suffix}").stat().st_size)
            for suffix, line in zip(SUFFIXES, lines)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB on Linux")
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_streaming_peak_memory_stays_below_one_file(streamed, suffix):
    result, size = streamed[suffix]
    assert size > 45e6
    assert result["summary"]["tensors"] == 21 and result["summary"]["changed"] == 10
    grew = result["grew_kib"] * 1024
    assert grew < 1.0 * size, f"peak RSS grew by {grew / 2**20:.0f} MiB for two " \
                              f"{size / 2**20:.0f} MiB files"


# ------------------------------------------------------------------ presenting
def test_change_figure_marks_unchanged_tensors(demo):
    fig = comparison.change_figure(demo)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "unchanged (bitwise identical)" in labels and "changed" in labels
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ticks) == 20 and any(t.endswith("mem_tokens") for t in ticks)
    marked = next(c for c in ax.collections if c.get_label().startswith("unchanged"))
    assert len(marked.get_offsets()) == 12


def test_table_is_bounded_and_problems_first(tmp_path):
    a = {f"blocks.{i}.weight": torch.full((2,), float(i + 1)) for i in range(300)}
    b = {k: (v if i < 5 else v * (1 + i / 100)) for i, (k, v) in enumerate(a.items())}
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    cmp = compare_checkpoints(tmp_path / "a.pt", tmp_path / "b.pt")
    styler = comparison.table_styler(cmp, limit=50)
    shown = styler.data
    assert len(shown) == 50 and list(shown["status"][:5]) == ["unchanged"] * 5
    assert shown["name"].iloc[5] == "blocks.299.weight"  # then the largest relative change
    assert "50 of 300 tensors shown" in styler.to_html()
    fig = comparison.change_figure(cmp)
    ax = fig.axes[0]  # too many to name: rows are positions in the file
    assert not any("blocks" in t.get_text() for t in ax.get_yticklabels())
    assert ax.get_ylabel() == "300 tensors, in file order"
    assert len(ax.collections[0].get_offsets()) == 295


def test_write_outputs(tmp_path, demo):
    assert compare.write_outputs(demo, "") == []
    written = compare.write_outputs(demo, str(tmp_path / "out"))
    assert written == ["comparison.csv", "findings.json"]
    csv = (tmp_path / "out" / "comparison.csv").read_text().splitlines()
    assert len(csv) == 21 and csv[0].startswith("name,module,status")
    findings = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert findings["worst"] == "warning" and findings["summary"]["unchanged"] == 12
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == written  # no temp left


# ------------------------------------------------------------------ the notebook
def _execute(tmp_path, cwd, **parameters):
    out = tmp_path / "executed.ipynb"
    return papermill.execute_notebook(str(NOTEBOOK), str(out), parameters=parameters,
                                      kernel_name="python3", progress_bar=False, cwd=str(cwd))


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _html(nb) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in _outputs(nb))


@pytest.mark.parametrize("cwd", ["repo", "elsewhere"])
def test_notebook_runs_with_default_parameters(tmp_path, cwd):
    nb = _execute(tmp_path, REPO if cwd == "repo" else tmp_path,
                  out_dir=str(tmp_path / "out"))
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    page = _html(nb)
    assert "module.metamodel" in page and "mem_tokens" in page and "unchanged" in page
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert json.loads((tmp_path / "out" / "findings.json").read_text())["worst"] == "warning"
    assert (tmp_path / "out" / "comparison.csv").is_file()


def test_notebook_escapes_hostile_tensor_names(tmp_path):
    hostile = "<script>x</script>.weight"
    a = {hostile: torch.ones(3), "head.weight": torch.ones(2)}
    b = {hostile: torch.ones(3), "head.weight": torch.full((2,), 2.0), "<b>new</b>": torch.ones(1)}
    torch.save(a, tmp_path / "a.pt")
    torch.save({"model": b}, tmp_path / "b.pt")
    nb = _execute(tmp_path, tmp_path, checkpoint_a="a.pt", checkpoint_b="b.pt")
    assert not [o for o in _outputs(nb) if o.output_type == "error"]
    page = re.sub(r"<wbr/?>", "", _html(nb))  # a name's break opportunities after its dots
    assert "<script>x</script>" not in page and "<b>new</b>" not in page
    assert page.count("&lt;script&gt;x&lt;/script&gt;.weight") >= 2  # findings and table
    assert "&lt;b&gt;new&lt;/b&gt;" in page


# In the kernel: a name the notebook does not know, and a path looked up from its folder (a
# wrong type is refused by the same check: test_check_parameters_..., and test_workbook.py).
@pytest.mark.parametrize("parameters, words", [
    ({"steps": 2}, ["unknown", "'steps'", "checkpoint_a"]),
    ({"checkpoint_a": "nope.pt"}, ["checkpoint_a nope.pt not found (looked in", "nope.pt"]),
])
def test_notebook_rejects_bad_parameters(tmp_path, parameters, words):
    with pytest.raises(PapermillExecutionError) as info:
        _execute(tmp_path, tmp_path, **parameters)
    assert "DiagkitError" in info.value.ename
    for word in words:
        assert word in info.value.evalue


def test_check_parameters_resolves_repo_paths_and_checks_types(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = compare.check_parameters({})
    assert settings["checkpoint_a"] == str(STEP2) and settings["out_dir"] == ""
    (tmp_path / "data").mkdir()
    shutil.copy(STEP5, tmp_path / "data" / "meta_memory_step2.pt")
    local = compare.check_parameters({})["checkpoint_a"]
    assert local == str(tmp_path / "data" / "meta_memory_step2.pt")  # the working folder first
    with pytest.raises(DiagkitError, match="'out_dir' must be str or None"):
        compare.check_parameters({"out_dir": 3})
    with pytest.raises(DiagkitError, match="'trust_checkpoint' must be bool, got int"):
        compare.check_parameters({"trust_checkpoint": 1})
    with pytest.raises(DiagkitError, match="'checkpoint_a' must be str, got NoneType"):
        compare.check_parameters({"checkpoint_a": None})


def test_validate_fills_defaults():
    settings = compare.validate({"checkpoint_b": "b.pt"})
    assert settings == {"checkpoint_a": "data/meta_memory_step2.pt", "checkpoint_b": "b.pt",
                        "trust_checkpoint": False, "out_dir": ""}


DIAGKIT = str(Path(sys.executable).parent / "diagkit")


def _cli(*args, cwd=None):
    """`diagkit compare ARGS` in this process (tests/cli_inprocess.py)."""
    return run_cli("compare", *args, cwd=cwd, timeout=300)


def _console_script(*args, cwd=None):
    """`diagkit compare ARGS`: the installed console script, in a process of its own."""
    return subprocess.run([DIAGKIT, "compare", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_cli_on_the_demo_pair(tmp_path):
    run = _cli(STEP2, STEP5, "--fail-on", "warning", "--json", tmp_path / "c.json",
               "--out", tmp_path / "rep")
    assert run.returncode == 1, run.stderr  # an unchanged subtree is a warning
    assert MEM in run.stdout and "unchanged" in run.stdout
    payload = json.loads((tmp_path / "c.json").read_text())
    row = next(t for t in payload["tensors"] if t["name"] == MEM)
    assert row["identical"] is True and payload["worst"] == "warning"
    # --out: the report runner renders the compare notebook
    page = (tmp_path / "rep" / "report.html").read_text()
    assert MEM in page and "<script" not in page
    assert {"comparison.csv", "findings.json", "report.html"} <= {
        p.name for p in (tmp_path / "rep").iterdir()}
    assert json.loads((tmp_path / "rep" / "findings.json").read_text())["worst"] == "warning"
    # the real console script, in a subprocess (the module's other CLI runs are in-process)
    run = _console_script(STEP2, STEP5)
    assert run.returncode == 0, run.stderr  # default --fail-on error
    assert MEM in run.stdout and "12 unchanged" in run.stdout


@pytest.mark.parametrize("case, words", [
    ("missing", ["no such checkpoint file"]),
    ("garbage", ["not a readable"]),
    ("unrelated", ["no tensor name in common"]),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, case, words):
    other = tmp_path / f"{case}.pt"
    if case == "garbage":
        other.write_bytes(b"not a checkpoint\n" * 50)
    elif case == "unrelated":
        torch.save({"something.else": torch.ones(2)}, other)
    run = _cli(STEP2, other, "--json", tmp_path / "c.json")
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagkit: error:"), run.stderr
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "c.json").exists()
