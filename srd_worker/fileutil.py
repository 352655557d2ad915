"""Atomic file writes: the one way srdq replaces a file (object store folder, exports, ``srdq run``
output), so a reader sees the old bytes or the new ones, never a torn file."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_atomic(
    path: str | os.PathLike[str], data: bytes, *, tmp_suffix: str = ".tmp", mode: int = 0o666
) -> None:
    """Write ``data`` to a temp file beside ``path`` (``.<name>.<pid>.<random><tmp_suffix>``, created
    with ``mode`` less the umask), fsync it, replace ``path`` with it, then fsync the folder. Creates
    missing parent folders. Raises ``OSError``; the temp file never outlives a failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{tmp_suffix}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
