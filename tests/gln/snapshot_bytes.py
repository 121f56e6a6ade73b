"""Editing a ``GLN.to_bytes`` blob's header, shared by the tests of malformed snapshots."""

import json
import struct


def with_header(blob: bytes, edit) -> bytes:
    """``blob`` with its JSON header replaced by ``edit(header)`` (a str), or by ``edit`` itself
    (bytes); the payload's checksum still matches: it covers the payload only."""
    (length,) = struct.unpack("<I", blob[8:12])
    header = json.loads(blob[12:12 + length])
    encoded = edit(header).encode() if callable(edit) else edit
    return blob[:8] + struct.pack("<I", len(encoded)) + encoded + blob[12 + length:]


def with_config(blob: bytes, **changes) -> bytes:
    """``blob`` with ``changes`` made to the configuration in its header (payload untouched)."""
    return with_header(blob, lambda h: json.dumps({**h, "config": {**h["config"], **changes}}))
