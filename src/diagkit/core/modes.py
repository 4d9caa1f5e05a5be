"""The modes a new file or folder gets under the process's umask, read without changing it:
what a file swapped into place (`files`, `swap`) is given, so that it is as readable as one
written in place.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process's umask, read without changing it where Linux tells it (`/proc/self/status`):
    `os.umask` can only set it, and a thread that creates a file between setting and
    restoring it would get a wrong mode."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def shared_mode(folder: bool) -> int:
    """The mode `open()` or `mkdir()` would give under the umask. `tempfile.mkstemp` and
    `mkdtemp` make 0600 and 0700 whatever the umask, so a folder or file swapped into place
    from one would be unreadable by a teammate the umask lets read it."""
    return (0o777 if folder else 0o666) & ~umask()
