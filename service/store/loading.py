"""How both stores check a snapshot they read back: the bytes must have the length and SHA-256
their head records, and a load that concurrent saves keep overtaking gives up after a few
attempts."""

from __future__ import annotations

import hashlib

from service.store.interface import SnapshotCorruptError, SnapshotInfo

LOAD_ATTEMPTS = 5
"""How often ``load`` starts over when a concurrent save switched the head under it."""


def verify(name: str, info: SnapshotInfo, blob: bytes) -> None:
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
