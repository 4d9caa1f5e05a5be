"""A save killed between its two renames is put right by the next save or read (issue 36, R8;
docs/result.md, "Saved folders"). The state between the renames is made here as `core.swap`
names its folders: `diag` moved aside to `.diag.old-X`, the complete new one waiting as
`.diag.new-Y`."""

from __future__ import annotations

import os

import pytest
import torch

import diagkit
from diagkit.core import saved, swap
from diagkit.run.workbook.notebook import load_saved


def _diagnose(steps: int):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return diagkit.diagnose(model, opt, batch_fn=lambda: torch.ones(3, 2),
                            loss_fn=lambda m, b: m(b).sum(), steps=steps)


@pytest.fixture(scope="module")
def old_and_new():
    """Two saves told apart by their steps: 2 observed, then 3."""
    return _diagnose(2), _diagnose(3)


def killed_between_the_renames(tmp_path, old, new, *, with_new: bool = True):
    """`diag` saved as `old`; a save of `new` killed after `diag` went aside."""
    target = old.save(tmp_path / "diag")
    os.rename(target, tmp_path / ".diag.old-k1ll3d")
    if with_new:
        new.save(tmp_path / "scratch")
        os.rename(tmp_path / "scratch", tmp_path / ".diag.new-k1ll3d")
    assert not target.exists()
    return target


def steps_observed(folder) -> int:
    return diagkit.load(folder).meta["steps_observed"]


@pytest.mark.parametrize("reader", [diagkit.load, load_saved], ids=["load", "report_from"])
def test_a_read_swaps_the_complete_new_folder_in(old_and_new, tmp_path, reader):
    target = killed_between_the_renames(tmp_path, *old_and_new)
    assert reader(target).meta["steps_observed"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["diag"]  # both leftovers gone


def test_explore_reads_it_too(old_and_new, tmp_path):
    pytest.importorskip("ipywidgets")
    target = killed_between_the_renames(tmp_path, *old_and_new)
    assert diagkit.explore(target) is not None
    assert [p.name for p in tmp_path.iterdir()] == ["diag"]


def test_without_a_complete_new_folder_the_old_one_comes_back(old_and_new, tmp_path):
    """What an earlier diagkit left (its scratch folder cannot be told complete): the old."""
    target = killed_between_the_renames(tmp_path, *old_and_new, with_new=False)
    (tmp_path / ".diag.tmp-h4lfwr1t").mkdir()  # a save killed while writing: left alone
    assert steps_observed(target) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".diag.tmp-h4lfwr1t", "diag"]


def test_the_next_save_puts_it_right_then_replaces_it(old_and_new, tmp_path):
    old, new = old_and_new
    target = killed_between_the_renames(tmp_path, old, new)
    old.save(target)
    assert steps_observed(target) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["diag"]


def test_leftovers_of_another_folder_are_not_taken(old_and_new, tmp_path):
    old, new = old_and_new
    killed_between_the_renames(tmp_path, old, new)
    other = tmp_path / "diag.new-3"  # its leftovers start with `.diag.new-`, as ours do
    with pytest.raises(diagkit.DiagkitError, match="does not exist"):
        diagkit.load(other)
    assert not other.exists()
    assert steps_observed(tmp_path / "diag") == 3


def test_an_interrupt_between_the_renames_puts_the_old_folder_back(old_and_new, tmp_path,
                                                                 monkeypatch):
    old, new = old_and_new
    target = old.save(tmp_path / "diag")
    rename = os.replace

    def interrupted(src, dst):
        if ".diag.new-" in str(src):  # the second rename: Ctrl-C just before it
            raise KeyboardInterrupt
        rename(src, dst)
    monkeypatch.setattr(swap.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        new.save(target)
    monkeypatch.undo()
    assert steps_observed(target) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["diag"]


def test_a_read_that_meets_a_swap_reads_the_new_folder_whole(old_and_new, tmp_path,
                                                           monkeypatch):
    """A save swaps the folder while a read is half-way (the old folder's files gone): the
    read starts again, on the new one, instead of calling it damaged."""
    old, new = old_and_new
    target = old.save(tmp_path / "diag")
    read_once = saved._read
    calls = []

    def swapped_meanwhile(folder):
        calls.append(folder.path)
        if len(calls) == 1:
            new.save(target)  # the opened folder is now gone, its files with it
        return read_once(folder)
    monkeypatch.setattr(saved, "_read", swapped_meanwhile)
    assert diagkit.load(target).meta["steps_observed"] == 3
    assert len(calls) == 2
