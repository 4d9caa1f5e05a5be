"""What an output path is, and how it is written (issue 36, R2, R18, R21; docs/cli.md, "Command
line"): a regular file is swapped in whole; a symbolic link is written through and stays a
link; a character device or a FIFO is written into, never replaced; this process's standard
output gets the text after what was printed; a link loop is one line; what is written gets
the mode the umask gives.

Nothing here writes a system file: a device or a stream is reached through a link made in
tmp_path (as root, a rename over `/dev/null` itself would replace it)."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
import torch

import diagkit
from diagkit import DiagkitError
from diagkit.core.files import check_output, write_json_atomic
from diagkit.core.modes import shared_mode, umask


@pytest.fixture(scope="module")
def diag():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return diagkit.diagnose(model, opt, batch_fn=lambda: torch.ones(3, 2),
                            loss_fn=lambda m, b: m(b).sum(), steps=2)


# ------------------------------------------------------------------ R2: links, devices, FIFOs
def test_json_through_a_link_updates_the_file_it_points_to_and_the_link_stays(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    check_output(link, "--json")
    write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "real.json"]


def test_json_into_a_fifo_is_written_and_the_fifo_stays(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the reader waits first, as `cat` would
    try:
        check_output(fifo, "--json")
        write_json_atomic(fifo, {"through": "fifo"})
        received = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert json.loads(received) == {"through": "fifo"}
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file left


def test_json_into_a_character_device_is_written_into_never_replaced(tmp_path):
    """`--json /dev/null` discards; here through a link to it, so that the code before the fix
    (a rename over the path) replaced the link in tmp_path, not the system's device."""
    link = tmp_path / "null"
    link.symlink_to(os.devnull)
    check_output(link, "--json")
    write_json_atomic(link, {"discarded": True})
    assert link.is_symlink() and os.readlink(link) == os.devnull
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


def test_json_to_this_process_standard_output_is_printed_after_what_was(tmp_path, capfd):
    link = tmp_path / "stdout"
    link.symlink_to(f"/proc/self/fd/{1}")  # what /dev/stdout is, made in tmp_path
    print("the findings", flush=True)
    check_output(link, "--json")
    write_json_atomic(link, {"printed": True})
    out = capfd.readouterr().out
    assert out.startswith("the findings\n")
    assert json.loads(out[len("the findings\n"):]) == {"printed": True}
    assert link.is_symlink()


def test_a_socket_is_refused_in_one_line(tmp_path):
    import socket
    where = tmp_path / "s"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(where))
    except OSError:  # a tmp_path too long for a socket's name
        pytest.skip("socket path too long here")
    try:
        with pytest.raises(DiagkitError, match="is a socket"):
            check_output(where, "--json")
        with pytest.raises(DiagkitError, match="is a socket"):
            write_json_atomic(where, {})
    finally:
        sock.close()
    assert stat.S_ISSOCK(os.lstat(where).st_mode)


def test_save_through_a_linked_folder_saves_into_its_target_and_the_link_stays(diag, tmp_path):
    real = tmp_path / "runs" / "diag"
    real.parent.mkdir()
    diag.save(real)
    link = tmp_path / "diag"
    link.symlink_to(real)
    check_output(link, "--save")
    assert diag.save(link) == link
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diag", "runs"]
    assert sorted(p.name for p in real.parent.iterdir()) == ["diag"]  # no hidden leftover
    assert diagkit.load(link).findings == diagkit.load(real).findings == diag.findings


# ------------------------------------------------------------------ R18: link loops
@pytest.mark.parametrize("option", ["--json", "--save", "--out"])
def test_a_link_loop_is_one_line_naming_the_option(tmp_path, option):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for path in (tmp_path / "a", tmp_path / "a" / "below"):
        with pytest.raises(DiagkitError) as info:
            check_output(path, option)
        assert str(info.value) == f"{option} {path}: symbolic link loop"


def test_writing_through_a_link_loop_is_refused_and_the_links_stay(diag, tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(DiagkitError, match="symbolic link loop"):
        write_json_atomic(tmp_path / "a", {})
    with pytest.raises(DiagkitError, match="symbolic link loop"):
        diag.save(tmp_path / "a")
    assert all((tmp_path / n).is_symlink() for n in "ab")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


# ------------------------------------------------------------------ R21: the umask's modes
@pytest.fixture
def mask_027():
    before = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(before)


def test_umask_is_read_without_changing_it(mask_027):
    assert umask() == 0o027 and umask() == 0o027
    assert shared_mode(folder=True) == 0o750 and shared_mode(folder=False) == 0o640


def test_a_saved_folder_and_its_files_get_the_umask_modes(diag, tmp_path, mask_027):
    folder = diag.save(tmp_path / "diag")
    diag.save(folder)  # replaced: the new folder too
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o750
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == dict.fromkeys(
        ["advice.json", "findings.json", "params.parquet", "run.json", "steps.parquet"], 0o640)


def test_a_json_file_gets_the_umask_mode_and_a_replaced_one_keeps_its_own(tmp_path, mask_027):
    new = tmp_path / "new.json"
    write_json_atomic(new, {"a": 1})
    assert stat.S_IMODE(new.stat().st_mode) == 0o640
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    kept.chmod(0o604)
    write_json_atomic(kept, {"a": 2})
    assert stat.S_IMODE(kept.stat().st_mode) == 0o604 and json.loads(kept.read_text()) == {"a": 2}


def test_umask_read_from_another_thread_sees_the_process_mask(mask_027):
    seen = []
    thread = threading.Thread(target=lambda: seen.append(umask()))
    thread.start()
    thread.join()
    assert seen == [0o027]
