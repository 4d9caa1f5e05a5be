"""Checkpoint comparison (`diagkit.compare`) of hand-made files: identical, re-shaped,
re-typed and large tensors, the problems listed first in a bounded table; each bad input is
one line; two saves of ~50 MB compared in bounded memory, one piece at a time."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from checkpoint_pairs import STEP2, STEP5, codes_of, saved_model, status_of
from diagkit import DiagkitError
from diagkit.measure.checkpoints import diff as checkpoint_diff
from diagkit.present import comparison
from diagkit.run.workbook.compare import compare_checkpoints


# ------------------------------------------------------------------ hand-made pairs
def test_identical_files_everything_unchanged_but_no_unchanged_finding(tmp_path):
    copy = tmp_path / "copy.pt"
    shutil.copy(STEP5, copy)
    for other, same_file in ((STEP5, True), (copy, False)):
        cmp = compare_checkpoints(STEP5, other)
        assert set(cmp.table["status"]) == {"unchanged"} and cmp.table["identical"].all()
        assert codes_of(cmp) == ["nothing_changed"]
        f = cmp.findings[0]
        assert f.severity == "info" and f.count == 20 and "nothing changed" in f.message
        assert ("same file" in f.message) is same_file
        assert cmp.worst() == "info" and not cmp.fails("warning")


def test_shape_mismatch_is_a_warning(tmp_path):
    state = saved_model(STEP5)
    state["module.lm_head.weight"] = torch.zeros(80, 32)
    state["module.lm_head.bias"] = torch.zeros(80)
    path = tmp_path / "wider.pt"
    torch.save(state, path)
    cmp = compare_checkpoints(STEP2, path)
    assert status_of(cmp)["module.lm_head.weight"] == "shape_mismatch"
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
    status = status_of(cmp)
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
    torch.save({"model": saved_model(STEP5), "extra": _RunsCode()}, files["pickle.pt"])
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
    assert codes_of(cmp) == ["nothing_changed"]
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
