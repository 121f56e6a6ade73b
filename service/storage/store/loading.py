"""How both stores load a snapshot: read the head, then the bytes it points to, and check them
against the head's length and SHA-256; when that fails because a concurrent save switched the
head meanwhile (and removed the old version), start over from the new head."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import TypeVar

from service.storage.store.interface import SnapshotCorruptError, SnapshotInfo

LOAD_ATTEMPTS = 5
"""How often ``load`` starts over when a concurrent save switched the head under it."""


def _verify(name: str, info: SnapshotInfo, blob: bytes) -> None:
    """Raise SnapshotCorruptError unless ``blob`` has the length and SHA-256 of ``info``."""
    if len(blob) != info.nbytes:
        raise SnapshotCorruptError(
            f"snapshot {name!r} v{info.version}: {len(blob)} bytes stored, "
            f"head says {info.nbytes}", info.version
        )
    digest = hashlib.sha256(blob).hexdigest()
    if digest != info.sha256:
        raise SnapshotCorruptError(
            f"snapshot {name!r} v{info.version}: sha256 {digest} != recorded {info.sha256}",
            info.version,
        )


Head = TypeVar("Head")  # a head as its store keeps it
Place = TypeVar("Place")  # where a store finds a version's bytes


def load_current(
    name: str,
    read_head: Callable[[], Head | None],
    parse_head: Callable[[Head], tuple[SnapshotInfo, Place]],
    read_blob: Callable[[SnapshotInfo, Place], bytes],
) -> tuple[bytes, SnapshotInfo] | None:
    """The current snapshot of ``name`` and its info, verified; None when it has none.

    ``read_head`` gives the head as stored (None when there is none); ``parse_head`` turns it
    into the snapshot's info and where its bytes are (raising SnapshotCorruptError for a head
    it cannot read); ``read_blob`` reads those bytes (raising SnapshotCorruptError for bytes
    that are gone). A read that fails while the head stays the same is corruption and raised;
    one whose head changed meanwhile lost a race with a save, which prunes the version it
    replaced, so the load starts over, up to ``LOAD_ATTEMPTS`` times.
    """
    for _ in range(LOAD_ATTEMPTS):
        head = read_head()
        if head is None:
            return None
        info, place = parse_head(head)
        try:
            blob = read_blob(info, place)
            _verify(name, info, blob)
        except SnapshotCorruptError:
            if read_head() != head:
                continue  # a concurrent save switched the head and removed what it pointed to
            raise
        return blob, info
    raise SnapshotCorruptError(
        f"snapshot of {name!r} kept changing while being read ({LOAD_ATTEMPTS} attempts)"
    )


def load_newest_valid(
    name: str, current: Callable[[], tuple[bytes, SnapshotInfo] | None],
    older: Callable[[int], list[tuple[SnapshotInfo, Callable[[], bytes]]]],
) -> tuple[bytes, SnapshotInfo] | None:
    """``current()`` (a ``load_current``), or where that is damaged, the newest of the older
    versions the store kept that is whole: ``older(version)`` gives those below ``version``,
    newest first, each as its info and a reader of its bytes. The info returned says what was
    damaged (``damage``); SnapshotCorruptError (the current one's) if none is whole."""
    try:
        return current()
    except SnapshotCorruptError as damage:
        error = damage
    found = [str(error)]
    for info, read in older(error.version if error.version is not None else 1 << 62):
        try:
            blob = read()
            _verify(name, info, blob)
        except SnapshotCorruptError as also:
            found.append(str(also))
            continue
        return blob, dataclasses.replace(info, damage="; ".join(found))
    raise error
