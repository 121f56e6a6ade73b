"""Snapshots in Redis: versioned chunk keys plus one head hash per model."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import time
from collections.abc import Mapping

import redis

from service.storage.common import PrimaryUnconfirmedError, RedisClient, check_name
from service.storage.store.interface import (
    SnapshotCorruptError,
    SnapshotInfo,
    as_bytes_view,
    check_metadata,
)
from service.storage.store.loading import load_current, load_newest_valid

DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024
"""Chunk size for Redis: far below Redis' 512 MB value limit, large enough to keep round trips
few, small enough that one chunk never stalls the server for long."""

_PIPELINE_BYTES = 64 * 1024 * 1024
"""Roughly how many chunk bytes one pipeline carries, so a huge blob is not buffered twice."""


class RedisSnapshotStore(RedisClient):
    """Snapshots in Redis: versioned chunk keys plus one head hash per model.

    Layout (``p`` is ``key_prefix``, ``n`` the model name, ``V`` a version)::

        p:models                     set of model names with a snapshot
        p:model:n:counter            INCR gives each save a version never used before
        p:model:n:versions           sorted set "V:nchunks" (score V) of versions with chunks
        p:model:n:vV:chunk:i         i-th chunk of version V (string, <= chunk_bytes)
        p:model:n:head               hash version, nchunks, nbytes, sha256, created_at, metadata
        p:model:n:v{V}:head          the same hash for version V alone, while V is kept

    A save takes a version from the counter, registers it in ``versions`` (so a crashed save's
    chunks are still found and removed later), writes all chunks with pipelines, then switches
    the head in one WATCH/MULTI/EXEC, refusing to move it back to an older version if a
    concurrent save got there first. Only after the switch are versions older than the newest
    ``keep`` deleted: a load whose current version is damaged falls back to the newest whole
    one of those kept (each has a head of its own).
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
        keep: int = 3,
    ) -> None:
        super().__init__(url, key_prefix, socket_connect_timeout, socket_timeout)
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self.chunk_bytes = chunk_bytes
        self.keep = keep

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
        processes sharing a store. Through a Sentinel URL, PrimaryUnconfirmedError when the
        Sentinels may have failed the primary over during the save: the snapshot may be
        gone, and the log must not be trimmed past it.
        """
        check_name(name)
        meta = check_metadata(metadata)
        view = as_bytes_view(blob)
        nbytes = view.nbytes
        sha256 = hashlib.sha256(view).hexdigest()
        nchunks = math.ceil(nbytes / self.chunk_bytes)  # 0 for an empty blob
        versions_key = self._model_key(name, "versions")

        primary = self._primary_token()
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
            older = self._client.zrangebyscore(versions_key, "-inf", version - self.keep)
            self._drop_versions(name, [m.decode() for m in older])
        else:
            self._drop_versions(name, [member])
        # A snapshot on a primary that a failover may discard must not let the log be trimmed
        # past it (the caller trims only after a save returns).
        if (unconfirmed := self._primary_unconfirmed(primary)) is not None:
            raise PrimaryUnconfirmedError(
                f"snapshot v{version} of {name!r} may not stay where it was written: "
                f"{unconfirmed}")
        return info

    def load(self, name: str) -> tuple[bytes, SnapshotInfo] | None:
        """Read the head, then its chunks; verify length and SHA-256.

        Returns None when ``name`` has no snapshot. Raises :class:`SnapshotCorruptError` when
        the stored bytes do not match the head (and no concurrent save explains it).
        """
        check_name(name)
        head_key = self._model_key(name, "head")
        return load_newest_valid(name, lambda: load_current(
            name,
            read_head=lambda: self._client.hgetall(head_key) or None,
            parse_head=lambda head: self._parse_head(name, head),
            read_blob=lambda info, nchunks: self._read_chunks(name, info, nchunks),
        ), lambda below: [
            (info, functools.partial(self._read_chunks, name, info, nchunks))
            for info, nchunks in self._kept_heads(name, below)])

    def kept(self, name: str) -> list[SnapshotInfo]:
        """The infos of the versions kept of ``name`` (each with a head of its own), oldest
        first."""
        check_name(name)
        return [info for info, _ in reversed(self._kept_heads(name, 1 << 62))]

    def _kept_heads(self, name: str, below: int) -> list[tuple[SnapshotInfo, int]]:
        """The registered versions below ``below`` with a readable head of their own (info,
        chunks), newest first."""
        members = self._client.zrevrangebyscore(self._model_key(name, "versions"),
                                                f"({below}", "-inf")
        kept = []
        for member in members:
            version = int(member.decode().partition(":")[0])
            head = self._client.hgetall(self._model_key(name, f"v{version}:head"))
            if not head:
                continue  # being written, or saved before versions had heads of their own
            try:
                kept.append(self._parse_head(name, head))
            except SnapshotCorruptError:
                continue
        return kept

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
            pipe.hset(self._model_key(name, f"v{info.version}:head"), mapping=mapping)
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
            keys.append(self._model_key(name, f"v{version}:head"))
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
        """GET the chunks in pipelines and join them (``load_current`` checks the result)."""
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
                        f"snapshot {name!r} v{info.version}: chunk {index} of {nchunks} missing",
                        info.version,
                    )
                pieces.append(piece)
        return b"".join(pieces)
