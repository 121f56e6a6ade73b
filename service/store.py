"""Snapshot stores: where the service keeps each model's serialised bytes between restarts.

A snapshot is an opaque blob (the service makes it with ``GLN.to_bytes``; a store never looks
inside and never unpickles anything). Every store gives each save of a model the next version
number, records the blob's length and SHA-256, writes the blob completely *before* switching
the model's pointer ("head") to it in one atomic step, and only then removes older versions.
A reader therefore sees either the old complete snapshot or the new complete one, never a mix,
and a crash mid-save leaves the previous snapshot in place.

Two implementations share the :class:`SnapshotStore` interface:

* :class:`RedisSnapshotStore` splits the blob into chunks (Redis refuses values over 512 MB;
  we keep chunks around 16 MiB) and switches a small head hash inside MULTI/EXEC.
* :class:`DirectorySnapshotStore` writes one file per version and switches a ``HEAD`` file
  with temp file + fsync + ``os.replace``.

:func:`open_store` picks one from the service settings.

Each save may carry ``metadata`` (string keys and values), returned with the snapshot's
:class:`SnapshotInfo`. The service uses it to record, for instance, the id of the last
write-ahead-log entry the snapshot includes, so a restart knows where to resume replaying.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as tmp:
...     store = open_store(None, tmp)
...     info = store.save("spam", b"weights", metadata={"log_id": "7-0"})
...     blob, loaded = store.load("spam")
...     (info.version, blob, loaded.metadata, store.names())
(1, b'weights', {'log_id': '7-0'}, ['spam'])
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import redis

from service.storage import (
    ClosingMixin,
    RedisClient,
    check_name,
    is_model_name,
    model_dir_in,
    replace_atomically,
)

try:  # POSIX advisory locks keep two processes from saving the same model at once.
    import fcntl
except ImportError:  # pragma: no cover - Windows: the in-process lock still applies
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DirectorySnapshotStore",
    "RedisSnapshotStore",
    "SnapshotCorruptError",
    "SnapshotInfo",
    "SnapshotStore",
    "open_store",
]

DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024
"""Chunk size for Redis: far below Redis' 512 MB value limit, large enough to keep round trips
few, small enough that one chunk never stalls the server for long."""

_PIPELINE_BYTES = 64 * 1024 * 1024
"""Roughly how many chunk bytes one pipeline carries, so a huge blob is not buffered twice."""

_LOAD_ATTEMPTS = 5
"""How often ``load`` starts over when a concurrent save switched the head under it."""



class SnapshotCorruptError(ValueError):
    """A stored snapshot does not match its recorded length or SHA-256, or its head is unreadable.

    Raised by ``load`` instead of handing back bytes that would fail (or worse, half succeed)
    in ``GLN.from_bytes``.
    """


@dataclass(frozen=True)
class SnapshotInfo:
    """What a store knows about one saved snapshot of a model.

    ``version`` increases by one per save of the same model (it starts again at 1 after
    ``delete``). ``metadata`` holds the string pairs the caller passed to ``save``.
    """

    version: int
    created_at: float
    nbytes: int
    sha256: str
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_head(cls, head: Mapping[str, Any], where: str) -> SnapshotInfo:
        """The info a store's head holds (its fields as text or as JSON values);
        SnapshotCorruptError naming ``where`` if they are missing or unreadable."""
        try:
            return cls(
                version=int(head["version"]),
                created_at=float(head["created_at"]),
                nbytes=int(head["nbytes"]),
                sha256=str(head["sha256"]),
                metadata=_parse_metadata(head.get("metadata")),
            )
        except SnapshotCorruptError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotCorruptError(f"{where} is unreadable: {dict(head)!r}") from exc

    def head_fields(self) -> dict[str, Any]:
        """The fields a store's head keeps of this info (``from_head`` reads them back)."""
        return {"version": self.version, "nbytes": self.nbytes, "sha256": self.sha256,
                "created_at": self.created_at, "metadata": self.metadata}


@runtime_checkable
class SnapshotStore(Protocol):
    """The interface the service uses; both implementations are synchronous and thread-safe."""

    def save(
        self, name: str, blob: bytes, metadata: Mapping[str, str] | None = None
    ) -> SnapshotInfo:
        """Store ``blob`` as the next version of model ``name`` and make it the current one."""
        ...

    def load(self, name: str) -> tuple[bytes, SnapshotInfo] | None:
        """The current snapshot of ``name`` (checksum verified), or None if there is none."""
        ...

    def names(self) -> list[str]:
        """Sorted names of the models that have a snapshot."""
        ...

    def delete(self, name: str) -> None:
        """Remove every trace of model ``name``; a no-op for an unknown name."""
        ...

    def reconnect(self) -> None:
        """Connect afresh before the next call (a no-op where there is nothing to connect)."""
        ...

    def ping(self) -> bool:
        """True when the store can be used right now; never raises."""
        ...

    def close(self) -> None:
        """Release connections or handles."""
        ...


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """Copy ``metadata`` into a plain dict, refusing anything but string keys and values."""
    if metadata is None:
        return {}
    out: dict[str, str] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(
                f"metadata keys and values must be str, got {key!r}: {value!r}"
            )
        out[key] = value
    return out


def _as_bytes_view(blob: bytes) -> memoryview:
    """A flat byte view of ``blob`` (bytes, bytearray or memoryview), without copying it."""
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TypeError(f"blob must be bytes, got {type(blob).__name__}")
    return memoryview(blob).cast("B")


def _parse_metadata(value: object) -> dict[str, str]:
    """Check metadata read back from a head (a JSON text or an object) and return it as a dict.

    Raises SnapshotCorruptError if it is not a str -> str object.
    """
    if value is None or value == "":
        return {}
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SnapshotCorruptError(f"snapshot metadata is not JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SnapshotCorruptError("snapshot metadata is not a str -> str object")
    return value


class RedisSnapshotStore(RedisClient):
    """Snapshots in Redis: versioned chunk keys plus one head hash per model.

    Layout (``p`` is ``key_prefix``, ``n`` the model name, ``V`` a version)::

        p:models                     set of model names with a snapshot
        p:model:n:counter            INCR gives each save a version never used before
        p:model:n:versions           sorted set "V:nchunks" (score V) of versions with chunks
        p:model:n:vV:chunk:i         i-th chunk of version V (string, <= chunk_bytes)
        p:model:n:head               hash version, nchunks, nbytes, sha256, created_at, metadata

    A save takes a version from the counter, registers it in ``versions`` (so a crashed save's
    chunks are still found and removed later), writes all chunks with pipelines, then switches
    the head in one WATCH/MULTI/EXEC, refusing to move it back to an older version if a
    concurrent save got there first. Only after the switch are older versions' chunks deleted.
    A reader that read the old head and finds its chunks gone (or changed) starts over from
    the new head.

    ``chunk_bytes`` is the largest chunk in bytes; tests pass a tiny one to exercise chunking.
    ``socket_timeout`` bounds each Redis call in seconds (None waits forever).
    """

    def __init__(
        self,
        url: str,
        key_prefix: str = "gln",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        socket_connect_timeout: float = 5.0,
        socket_timeout: float | None = 60.0,
    ) -> None:
        super().__init__(url, key_prefix, socket_connect_timeout, socket_timeout)
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
        self.chunk_bytes = chunk_bytes

    def __repr__(self) -> str:
        return (
            f"RedisSnapshotStore(key_prefix={self.key_prefix!r}, "
            f"chunk_bytes={self.chunk_bytes})"
        )

    # -- key names -----------------------------------------------------------------------

    def _models_key(self) -> str:
        return f"{self.key_prefix}:models"

    def _model_key(self, name: str, suffix: str) -> str:
        return f"{self.key_prefix}:model:{name}:{suffix}"

    def _chunk_key(self, name: str, version: int, index: int) -> str:
        return self._model_key(name, f"v{version}:chunk:{index}")

    # -- the interface -------------------------------------------------------------------

    def save(
        self, name: str, blob: bytes, metadata: Mapping[str, str] | None = None
    ) -> SnapshotInfo:
        """Write ``blob`` as the next version of ``name``, switch the head to it, prune.

        If a save of a *newer* version of the same model finished while this one was being
        written, the newer one stays current and this version is discarded (its info is still
        returned). The service has one writer per model, so this only matters for two
        processes sharing a store.
        """
        check_name(name)
        meta = _check_metadata(metadata)
        view = _as_bytes_view(blob)
        nbytes = view.nbytes
        sha256 = hashlib.sha256(view).hexdigest()
        nchunks = math.ceil(nbytes / self.chunk_bytes)  # 0 for an empty blob
        versions_key = self._model_key(name, "versions")

        version = int(self._client.incr(self._model_key(name, "counter")))
        member = f"{version}:{nchunks}"
        self._client.zadd(versions_key, {member: version})
        try:
            self._write_chunks(name, version, view, nchunks)
            info = SnapshotInfo(
                version=version,
                created_at=time.time(),
                nbytes=nbytes,
                sha256=sha256,
                metadata=meta,
            )
            switched = self._switch_head(name, info, nchunks)
        except BaseException:
            # Never leave a half-written version behind if we can help it.
            with contextlib.suppress(redis.RedisError):
                self._drop_versions(name, [member])
            raise
        if switched:
            older = self._client.zrangebyscore(versions_key, "-inf", f"({version}")
            self._drop_versions(name, [m.decode() for m in older])
        else:
            self._drop_versions(name, [member])
        return info

    def load(self, name: str) -> tuple[bytes, SnapshotInfo] | None:
        """Read the head, then its chunks; verify length and SHA-256.

        Returns None when ``name`` has no snapshot. Raises :class:`SnapshotCorruptError` when
        the stored bytes do not match the head (and no concurrent save explains it).
        """
        check_name(name)
        head_key = self._model_key(name, "head")
        for _ in range(_LOAD_ATTEMPTS):
            head = self._client.hgetall(head_key)
            if not head:
                return None
            info, nchunks = self._parse_head(name, head)
            try:
                blob = self._read_chunks(name, info, nchunks)
            except SnapshotCorruptError:
                if self._client.hgetall(head_key) != head:
                    continue  # a concurrent save switched the head and pruned our chunks
                raise
            return blob, info
        raise SnapshotCorruptError(
            f"snapshot of {name!r} kept changing while being read ({_LOAD_ATTEMPTS} attempts)"
        )

    def names(self) -> list[str]:
        """Sorted names of the models with a snapshot under this key prefix."""
        return sorted(m.decode() for m in self._client.smembers(self._models_key()))

    def delete(self, name: str) -> None:
        """Remove the head, every registered version's chunks, the counter and the set entry."""
        check_name(name)
        members = self._client.zrange(self._model_key(name, "versions"), 0, -1)
        self._drop_versions(name, [m.decode() for m in members])
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(
            self._model_key(name, "head"),
            self._model_key(name, "counter"),
            self._model_key(name, "versions"),
        )
        pipe.srem(self._models_key(), name)
        pipe.execute()


    # -- helpers -------------------------------------------------------------------------

    def _write_chunks(self, name: str, version: int, view: memoryview, nchunks: int) -> None:
        """SET every chunk, a pipeline per ~64 MiB so a huge blob is not buffered twice."""
        pipe = self._client.pipeline(transaction=False)
        pending = 0
        for index in range(nchunks):
            start = index * self.chunk_bytes
            piece = view[start:start + self.chunk_bytes]
            pipe.set(self._chunk_key(name, version, index), piece)
            pending += piece.nbytes
            if pending >= _PIPELINE_BYTES:
                pipe.execute()
                pending = 0
        pipe.execute()

    def _switch_head(self, name: str, info: SnapshotInfo, nchunks: int) -> bool:
        """Point the head at ``info`` atomically unless it already holds a newer version."""
        head_key = self._model_key(name, "head")
        # A hash holds text: numbers as their repr, the metadata as JSON.
        mapping = {key: value if isinstance(value, str) else repr(value)
                   for key, value in info.head_fields().items() if key != "metadata"}
        mapping["metadata"] = json.dumps(info.metadata, sort_keys=True)
        mapping["nchunks"] = str(nchunks)

        def switch(pipe: redis.client.Pipeline) -> bool:
            current = pipe.hget(head_key, "version")
            if current is not None and int(current) >= info.version:
                return False
            pipe.multi()
            pipe.delete(head_key)  # drop fields a future layout might not rewrite
            pipe.hset(head_key, mapping=mapping)
            pipe.sadd(self._models_key(), name)
            return True

        return bool(self._client.transaction(switch, head_key, value_from_callable=True))

    def _drop_versions(self, name: str, members: list[str]) -> None:
        """Delete the chunks of the given "version:nchunks" members and unregister them."""
        if not members:
            return
        pipe = self._client.pipeline(transaction=False)
        for member in members:
            version_text, _, nchunks_text = member.partition(":")
            version, nchunks = int(version_text), int(nchunks_text or 0)
            keys = [self._chunk_key(name, version, i) for i in range(nchunks)]
            for start in range(0, len(keys), 1000):
                pipe.delete(*keys[start:start + 1000])
        pipe.zrem(self._model_key(name, "versions"), *members)
        pipe.execute()

    def _parse_head(self, name: str, head: dict[bytes, bytes]) -> tuple[SnapshotInfo, int]:
        """Turn the raw head hash into a SnapshotInfo and the chunk count."""
        where = f"head of {name!r}"
        try:
            fields = {k.decode(): v.decode() for k, v in head.items()}
            nchunks = int(fields["nchunks"])
        except (KeyError, ValueError) as exc:
            raise SnapshotCorruptError(f"{where} is unreadable: {head!r}") from exc
        return SnapshotInfo.from_head(fields, where), nchunks

    def _read_chunks(self, name: str, info: SnapshotInfo, nchunks: int) -> bytes:
        """GET the chunks in pipelines, join them, check length and SHA-256."""
        per_chunk = max(1, math.ceil(info.nbytes / nchunks)) if nchunks else 1
        batch = max(1, _PIPELINE_BYTES // per_chunk)
        pieces: list[bytes] = []
        for start in range(0, nchunks, batch):
            pipe = self._client.pipeline(transaction=False)
            for index in range(start, min(start + batch, nchunks)):
                pipe.get(self._chunk_key(name, info.version, index))
            for index, piece in enumerate(pipe.execute(), start):
                if piece is None:
                    raise SnapshotCorruptError(
                        f"snapshot {name!r} v{info.version}: chunk {index} of {nchunks} missing"
                    )
                pieces.append(piece)
        blob = b"".join(pieces)
        del pieces
        _verify(name, info, blob)
        return blob


def _verify(name: str, info: SnapshotInfo, blob: bytes) -> None:
    """Raise SnapshotCorruptError unless ``blob`` has the length and SHA-256 of ``info``."""
    if len(blob) != info.nbytes:
        raise SnapshotCorruptError(
            f"snapshot {name!r} v{info.version}: {len(blob)} bytes stored, "
            f"head says {info.nbytes}"
        )
    digest = hashlib.sha256(blob).hexdigest()
    if digest != info.sha256:
        raise SnapshotCorruptError(
            f"snapshot {name!r} v{info.version}: sha256 {digest} != recorded {info.sha256}"
        )


def _write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Replace ``path`` with ``data`` atomically (see ``replace_atomically``)."""
    replace_atomically(path, lambda fh: fh.write(data))


class DirectorySnapshotStore(ClosingMixin):
    """Snapshots as files: ``{path}/{name}/v{version}.snap`` plus a ``HEAD`` JSON pointer.

    ``HEAD`` holds version, nbytes, sha256, created_at and metadata. A save writes the version
    file and then ``HEAD``, each atomically (temp + fsync + ``os.replace``), then removes
    older version files and leftover temp files. Saves of one model are serialised by a lock
    (in-process, plus an advisory ``flock`` on ``{name}/.lock`` where the OS has one), so two
    processes sharing the directory do not collide. A reader whose version file vanished
    because a save just switched ``HEAD`` starts over from the new ``HEAD``.

    The directory is created if missing.
    """

    _VERSION_RE = re.compile(r"v(\d+)\.snap")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DirectorySnapshotStore({str(self.path)!r})"

    def _model_dir(self, name: str) -> Path:
        return model_dir_in(self.path, name)

    @contextlib.contextmanager
    def _locked(self, model_dir: Path) -> Iterator[None]:
        """Hold the in-process lock and, where available, an flock on the model's lock file."""
        with self._lock:
            if fcntl is None:  # pragma: no cover - Windows
                yield
                return
            with open(model_dir / ".lock", "a+b") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _read_head(self, model_dir: Path) -> dict[str, Any] | None:
        """The parsed HEAD file, or None when there is none."""
        try:
            raw = (model_dir / "HEAD").read_bytes()
        except FileNotFoundError:
            return None
        try:
            head = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SnapshotCorruptError(f"{model_dir / 'HEAD'} is not JSON: {exc}") from exc
        if not isinstance(head, dict):
            raise SnapshotCorruptError(f"{model_dir / 'HEAD'} is not a JSON object")
        return head

    def _versions_on_disk(self, model_dir: Path) -> list[int]:
        """Versions that have a ``v{N}.snap`` file."""
        found = []
        for entry in model_dir.iterdir():
            match = self._VERSION_RE.fullmatch(entry.name)
            if match:
                found.append(int(match.group(1)))
        return found

    def save(
        self, name: str, blob: bytes, metadata: Mapping[str, str] | None = None
    ) -> SnapshotInfo:
        """Write the next version file, switch ``HEAD`` to it, then remove older files."""
        model_dir = self._model_dir(name)
        meta = _check_metadata(metadata)
        view = _as_bytes_view(blob)
        sha256 = hashlib.sha256(view).hexdigest()
        model_dir.mkdir(exist_ok=True)
        with self._locked(model_dir):
            head = self._read_head(model_dir)
            previous = [*self._versions_on_disk(model_dir)]
            if head is not None:
                previous.append(int(head.get("version", 0)))
            version = max(previous, default=0) + 1
            info = SnapshotInfo(
                version=version,
                created_at=time.time(),
                nbytes=view.nbytes,
                sha256=sha256,
                metadata=meta,
            )
            _write_atomically(model_dir / f"v{version}.snap", view)
            head_json = json.dumps(info.head_fields(), sort_keys=True)
            _write_atomically(model_dir / "HEAD", head_json.encode())
            for entry in model_dir.iterdir():
                match = self._VERSION_RE.fullmatch(entry.name)
                stale = match is not None and int(match.group(1)) < version
                if stale or entry.name.startswith(".tmp-"):
                    with contextlib.suppress(FileNotFoundError):
                        entry.unlink()
        return info

    def load(self, name: str) -> tuple[bytes, SnapshotInfo] | None:
        """Read ``HEAD``, then its version file; verify length and SHA-256."""
        model_dir = self._model_dir(name)
        for _ in range(_LOAD_ATTEMPTS):
            head = self._read_head(model_dir)
            if head is None:
                return None
            info = SnapshotInfo.from_head(head, str(model_dir / "HEAD"))
            try:
                blob = (model_dir / f"v{info.version}.snap").read_bytes()
                _verify(name, info, blob)
            except (FileNotFoundError, SnapshotCorruptError) as exc:
                if self._read_head(model_dir) != head:
                    continue  # a concurrent save switched HEAD and removed our file
                if isinstance(exc, FileNotFoundError):
                    raise SnapshotCorruptError(
                        f"snapshot {name!r} v{info.version}: file missing"
                    ) from exc
                raise
            return blob, info
        raise SnapshotCorruptError(
            f"snapshot of {name!r} kept changing while being read ({_LOAD_ATTEMPTS} attempts)"
        )

    def names(self) -> list[str]:
        """Sorted names of the subdirectories that hold a ``HEAD``."""
        out = []
        for entry in self.path.iterdir():
            if is_model_name(entry.name) and (entry / "HEAD").is_file():
                out.append(entry.name)
        return sorted(out)

    def delete(self, name: str) -> None:
        """Remove the model's directory (HEAD, version files, lock file)."""
        model_dir = self._model_dir(name)
        if not model_dir.exists():
            return
        with self._locked(model_dir):
            shutil.rmtree(model_dir, ignore_errors=True)

    def reconnect(self) -> None:
        """Nothing to reconnect: files."""

    def ping(self) -> bool:
        """True when a file can be created (and removed) in the snapshot directory."""
        try:
            with tempfile.TemporaryFile(dir=self.path, prefix=".tmp-ping-"):
                pass
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Nothing to release; present for the interface."""


def open_store(
    redis_url: str | None, snapshot_dir: str, *, key_prefix: str = "gln"
) -> SnapshotStore:
    """The Redis store when ``redis_url`` is set (non-empty), else the directory store."""
    if redis_url:
        return RedisSnapshotStore(redis_url, key_prefix=key_prefix)
    return DirectorySnapshotStore(snapshot_dir)
