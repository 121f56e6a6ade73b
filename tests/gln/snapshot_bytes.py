"""Editing a ``GLN.to_bytes`` blob's header, shared by the tests of malformed and older
snapshots."""

import hashlib
import json
import struct

import numpy as np

from gln.serialize import header_digest


def with_header(blob: bytes, edit) -> bytes:
    """``blob`` with its JSON header replaced by ``edit(header)`` (a str), or by ``edit`` itself
    (bytes), as a blob's author may write it: the header's checksum is recomputed for an
    edited header that is still a JSON object (the payload's covers the payload only)."""
    (length,) = struct.unpack("<I", blob[8:12])
    header = json.loads(blob[12:12 + length])
    encoded = edit(header).encode() if callable(edit) else edit
    try:
        edited = json.loads(encoded)
    except (ValueError, RecursionError):
        edited = None
    if isinstance(edited, dict) and "header_sha256" in edited:
        encoded = json.dumps({**edited, "header_sha256": header_digest(edited)}).encode()
    return blob[:8] + struct.pack("<I", len(encoded)) + encoded + blob[12 + length:]


def with_config(blob: bytes, **changes) -> bytes:
    """``blob`` with ``changes`` made to the configuration in its header (payload untouched)."""
    return with_header(blob, lambda h: json.dumps({**h, "config": {**h["config"], **changes}}))


def without_array(blob: bytes, name: str) -> bytes:
    """``blob`` as a library that did not have the array ``name`` wrote it: that array out of
    the header and the payload, the checksum recomputed."""
    (length,) = struct.unpack("<I", blob[8:12])
    header = json.loads(blob[12:12 + length])
    payload, kept, at = blob[12 + length:], [], 0
    pieces = []
    for entry in header["arrays"]:
        size = np.dtype(entry["dtype"]).itemsize * int(np.prod(entry["shape"]))
        if entry["name"] != name:
            kept.append(entry)
            pieces.append(payload[at:at + size])
        at += size
    payload = b"".join(pieces)
    header = {**header, "arrays": kept, "payload_sha256": hashlib.sha256(payload).hexdigest()}
    header.pop("header_sha256")  # as written before the header had a checksum
    encoded = json.dumps(header).encode()
    return blob[:8] + struct.pack("<I", len(encoded)) + encoded + payload
