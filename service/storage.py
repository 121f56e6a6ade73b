"""What the snapshot stores (``service/store.py``) and the write-ahead logs (``service/wal/``)
build on alike: model names that are safe as Redis key parts and directory names, one Redis
client per store or log, and files replaced atomically and durably."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

import redis

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def is_model_name(text: object) -> bool:
    """True for a safe model name: 1-64 characters from [A-Za-z0-9_.-], not '.' or '..'."""
    return isinstance(text, str) and bool(_NAME_RE.fullmatch(text)) and text not in {".", ".."}


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe model name, else raise ValueError.

    The service validates names already; this is defence in depth, because a name becomes a
    Redis key part and a directory name (``..`` or ``a/b`` must never reach the filesystem).
    """
    if not is_model_name(name):
        raise ValueError(
            f"name must be 1-64 characters from [A-Za-z0-9_.-] and not '.' or '..', "
            f"got {name!r}"
        )
    return name


def model_dir_in(root: Path, name: str) -> Path:
    """``root / name`` for a checked model name, refusing anything that resolves elsewhere."""
    model_dir = root / check_name(name)
    # Defence in depth: the name check already rules this out.
    if model_dir.resolve().parent != root.resolve():
        raise ValueError(f"name {name!r} escapes the directory {root}")
    return model_dir


class ClosingMixin:
    """``with store:`` closes the store at the end of the block."""

    def close(self) -> None:  # pragma: no cover - overridden
        """Release resources."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedisClient(ClosingMixin):
    """What every Redis-backed class here shares: one client, health by PING, closing."""

    _client: redis.Redis

    def __init__(
        self, url: str, key_prefix: str, socket_connect_timeout: float,
        socket_timeout: float | None,
    ) -> None:
        """Check the key prefix and make the client (it connects on first use)."""
        if not isinstance(key_prefix, str) or not key_prefix:
            raise ValueError(f"key_prefix must be a non-empty str, got {key_prefix!r}")
        self.url = url
        self.key_prefix = key_prefix
        # Raw bytes in and out: chunks and log entries are binary; text is decoded by hand.
        self._client = redis.Redis.from_url(
            url,
            decode_responses=False,
            socket_connect_timeout=socket_connect_timeout,
            socket_timeout=socket_timeout,
        )

    def ping(self) -> bool:
        """True when Redis answers PING; False on any connection or server error."""
        try:
            return bool(self._client.ping())
        except (redis.RedisError, OSError):
            return False

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (POSIX); silently skipped where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_atomically(
    path: Path, write: Callable[[BinaryIO], object], *, tmp_prefix: str = ".tmp-"
) -> None:
    """Replace ``path`` with what ``write`` writes, so readers see the old file or the new one.

    Temp file in the same directory, fsync, ``os.replace`` (atomic on POSIX and Windows),
    then fsync the directory so the rename itself survives a power cut. A failure leaves the
    old file and removes the temp file.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=tmp_prefix, suffix=f"-{path.name}")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
