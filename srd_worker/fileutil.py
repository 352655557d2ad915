"""Atomic file writes: the one way srdq replaces a file (object store folder, exports, ``srdq run``
output), so a reader sees the old bytes or the new ones, never a torn file; and the lock that keeps two
``srdq run`` processes off one run."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
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


class Locked(Exception):
    """``exclusive_lock``'s path is held by another process; ``holder`` is what it wrote there."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by {holder or 'another process'}")
        self.path, self.holder = path, holder


_HELD: set[int] = set()  # the descriptors of the locks this process holds


def _drop_held_in_child() -> None:
    """In a child forked while a lock is held (vLLM's engine process, a multiprocessing worker): close the
    inherited descriptors, so the lock stays the parent's alone and goes when the parent does."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_held_in_child)


@contextmanager
def exclusive_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an advisory lock on ``path`` (created if missing) for the ``with`` block, or raise ``Locked``
    at once when another process holds it. The lock is the kernel's (``flock``), so a process that dies,
    even killed outright, lets it go: no stale lock file to clear. While held the file says who holds it
    (pid, host, since when); it is emptied, not removed, on the way out. A child forked meanwhile does
    not keep it (``_drop_held_in_child``): an engine process outliving a killed parent does not block the
    resume. Where ``fcntl`` does not exist (Windows), or the file system refuses locks (some network
    mounts: a warning), nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        yield
        return
    import socket
    from datetime import UTC, datetime

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", errors="replace").strip()
            raise Locked(path, holder) from None
        except OSError as exc:  # a file system without locks (some network mounts): go on unguarded
            logging.getLogger(__name__).warning(
                "could not lock %s (%s): going on without the lock", path, exc
            )
            yield
            return
        since = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode(), 0)
        _HELD.add(fd)
        try:
            yield
        finally:
            _HELD.discard(fd)
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # lets the lock go
