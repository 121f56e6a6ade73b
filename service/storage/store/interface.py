"""What the service relies on of a snapshot store: the ``SnapshotStore`` interface, what a store
knows of one saved snapshot (``SnapshotInfo``, kept in the store's head), the error a damaged
snapshot raises, and the checks of what ``save`` is given. ``service.storage.store`` describes the
stores as a whole."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class SnapshotCorruptError(ValueError):
    """A stored snapshot does not match its recorded length or SHA-256, or its head is unreadable.

    Raised by ``load`` instead of handing back bytes that would fail (or worse, half succeed)
    in ``GLN.from_bytes``. ``version``: the version found damaged, where one was.
    """

    def __init__(self, message: str, version: int | None = None) -> None:
        super().__init__(message)
        self.version = version


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
    # Set by a ``load`` that fell back to this version, an older one the store kept
    # (GLN_SNAPSHOT_KEEP): what was wrong with the newer ones.
    damage: str = field(default="", compare=False)

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

    def kept(self, name: str) -> list[SnapshotInfo]:
        """The infos of the versions kept of ``name`` (the newest ``keep``), oldest first;
        ``load`` falls back on them when the current one is damaged."""
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


def check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
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


def as_bytes_view(blob: bytes) -> memoryview:
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
