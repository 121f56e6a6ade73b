"""One server per data directory: the snapshots and the file log of a directory have one writer.

Without Redis, a server keeps its snapshots and its write-ahead log in local directories
(``GLN_SNAPSHOT_DIR``, ``GLN_WAL_DIR``). Two processes on the same directory would both
acknowledge learning, each from its own copy of the models in memory, and each snapshot
and log append would overwrite or interleave with the other's: examples acknowledged by one
are lost at the next restart. (The Redis log notices a second writer at its next append; a
file log read once at start-up cannot.) So a server holds an exclusive lock on each
directory it writes for as long as it runs, and a second server on the same directory
refuses to start, naming the process that holds it.

The lock is ``flock`` on a ``.gln-service.lock`` file in the directory: the kernel drops it
when the holder exits, however it exits, so a crashed server never leaves a stale lock. The
file is never deleted (that would race with a server taking it); it holds the holder's pid
for the message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from service.settings import Settings

LOCK_NAME = ".gln-service.lock"


class DirectoryInUseError(RuntimeError):
    """Another process (or another app in this one) holds the directory's lock."""


class DirectoryLock:
    """An exclusive lock on one data directory, held until :meth:`release` (or exit)."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the directory up (a no-op once released)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def lock_directory(path: str | os.PathLike[str]) -> DirectoryLock:
    """Create ``path`` if needed and lock it; DirectoryInUseError naming the holder if another
    holds it, OSError if it cannot be a directory."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DirectoryInUseError(
            f"{directory.resolve()} is in use by another gln-service (pid {holder}): two "
            "servers on one directory would each overwrite what the other acknowledged. Stop "
            "that one first, or give this one its own GLN_SNAPSHOT_DIR (and GLN_WAL_DIR)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DirectoryLock(directory, fd)


def data_directories(settings: Settings) -> list[Path]:
    """The local directories a server with ``settings`` writes: the snapshot directory and
    the file log's (with ``GLN_WAL_ENABLED=false`` too: a log left there is read, and a deleted
    model's entries are removed from it), none with Redis (which keeps both)."""
    if settings.redis_url:
        return []
    directories = [Path(settings.snapshot_dir)]
    if settings.wal_dir:
        directories.append(Path(settings.wal_dir))
    unique: dict[Path, Path] = {}
    for directory in directories:
        unique.setdefault(directory.resolve(), directory)
    return list(unique.values())


def lock_data_directories(settings: Settings) -> list[DirectoryLock]:
    """Lock every directory of :func:`data_directories`, or none (the error of the first that
    cannot be locked is raised, the ones already taken are released)."""
    locks: list[DirectoryLock] = []
    try:
        for directory in data_directories(settings):
            locks.append(lock_directory(directory))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks
