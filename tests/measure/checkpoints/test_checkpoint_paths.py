"""What `checkpoint_kind.locate` says of a path that is no checkpoint file or folder (issue 36,
R11 and R18): a FIFO, a device or a socket is refused from its stat, before anything opens it
(opening a FIFO blocks until a writer comes: forever); a path the system cannot look up (a
symlink loop, a name too long, a file used as a folder) is one line with the system's reason,
a DiagkitError, never an OSError that the command line calls an internal error. And a
checkpoint whose file name is not UTF-8 is read, not called unreadable.

Each `locate` runs on a thread joined with a timeout, so a regression that opens a FIFO fails
the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest
import torch

from diagkit.core.errors import DiagkitError
from diagkit.measure.checkpoints.kind import FILE, locate
from diagkit.measure.checkpoints.read import read_checkpoint

BOUND_S = 20


def _located(path):
    """`locate(path)`'s result or its exception, from a thread that must end in BOUND_S."""
    out = {}

    def work():
        try:
            out["value"] = locate(path)
        except BaseException as exc:  # noqa: BLE001 - handed to the test as is
            out["error"] = exc

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"locate({path!r}) blocked for {BOUND_S} s"
    return out


def _refusal(path) -> str:
    out = _located(path)
    assert isinstance(out.get("error"), DiagkitError), out
    return str(out["error"])


def test_a_fifo_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "ckpt.pt"
    os.mkfifo(fifo)
    assert _refusal(fifo) == (f"checkpoint {fifo} is not a regular file (a FIFO): give a "
                              "checkpoint file or folder")


def test_a_character_device_is_not_a_regular_file_not_missing():
    line = _refusal("/dev/null")  # only looked at: stat, never opened
    assert "/dev/null is not a regular file (a character device)" in line
    assert "no such" not in line


def test_a_socket_is_refused(tmp_path):
    where = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(where))
        assert "is not a regular file (a socket)" in _refusal(where)


def test_a_symlink_to_a_fifo_is_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link.pt").symlink_to(tmp_path / "pipe")
    assert "(a FIFO)" in _refusal(tmp_path / "link.pt")


@pytest.mark.parametrize("case, reason", [
    ("loop", "symbolic link loop"),
    ("long_name", "File name too long"),
    ("under_a_file", "Not a directory"),
])
def test_a_path_the_system_cannot_look_up_is_one_line_with_its_reason(tmp_path, case, reason):
    if case == "loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        path = tmp_path / "a"
    elif case == "long_name":
        path = tmp_path / ("c" * 300 + ".pt")
    else:
        (tmp_path / "weights.pt").write_bytes(b"x")
        path = tmp_path / "weights.pt" / "inner.pt"
    assert _refusal(path) == f"checkpoint {path}: {reason}"


def test_a_missing_path_is_still_missing(tmp_path):
    assert _refusal(tmp_path / "gone.pt") == f"no such checkpoint file or folder: " \
                                             f"{tmp_path / 'gone.pt'}"


def test_a_fifo_inside_a_folder_is_not_taken_for_its_checkpoint(tmp_path):
    """A folder is read by the files in it: a FIFO named like its index or its single weights
    file is not one (reading it would block), so the folder is no checkpoint, in one line."""
    os.mkfifo(tmp_path / "model.safetensors.index.json")
    os.mkfifo(tmp_path / "model.safetensors")
    line = _refusal(tmp_path)
    assert "is not a checkpoint diagkit can read" in line


def test_a_regular_file_is_still_a_file(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    assert _located(tmp_path / "ok.pt")["value"].kind == FILE


def test_a_checkpoint_whose_name_is_not_utf8_is_read(tmp_path):
    """Python keeps a name's non-UTF-8 bytes as surrogates; torch's reader takes UTF-8 names
    only ("surrogates not allowed"), so the file used to be called unreadable."""
    name = tmp_path / os.fsdecode(b"caf\xe9.pt")  # Latin-1 bytes, as another locale saved it
    try:
        torch.save({"w": torch.arange(3.0)}, tmp_path / "plain.pt")
        os.rename(tmp_path / "plain.pt", name)
    except (OSError, UnicodeError):  # pragma: no cover - a file system that refuses the bytes
        pytest.skip("this file system does not take non-UTF-8 names")
    assert locate(name).kind == FILE
    assert torch.equal(read_checkpoint(name)["w"], torch.arange(3.0))
