"""Snapshots as bytes: a small versioned JSON header followed by raw little-endian arrays.

Layout::

    b"GLNSNAP\\0"  | uint32 LE header length | header (UTF-8 JSON) | array bytes ...

The header holds the format version, the model's configuration, counters, the name, dtype
and shape of every array in payload order, the SHA-256 of the payload, and the SHA-256 of the
rest of the header (in a canonical JSON form), since a corrupt configuration or layout would
read an intact payload into a wrong model. Snapshots from before the header's checksum load
without it. Loading checks all of it and never unpickles anything, so a snapshot from an
untrusted store cannot run code. (The checksums find corruption, not forgery: a blob's
author can write any header and recompute them; the header's checks are what hold then.)
A snapshot taken on a GPU loads on a CPU-only machine and the other way round.

This module knows a model by its configuration (a dict, ``GLN.config``) and its state
(``gln.state.State``); ``GLN.from_bytes`` builds the model of what ``read_snapshot`` and
``load_state`` return.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from gln.backend import copy_to_host, to_numpy
from gln.state import Layout, State

MAGIC = b"GLNSNAP\x00"
FORMAT_VERSION = 1
_LENGTH = struct.Struct("<I")
# A header is a few KiB (configuration, array names and shapes): a longer one is not parsed,
# and counters beyond these are no real model's (an import could otherwise plant a count that
# the next learn overflows, and a snapshot that no later start-up loads).
MAX_HEADER_BYTES = 1 << 20
MAX_COUNT = 1 << 62


class SnapshotFormatError(ValueError):
    """The bytes are not a valid GLN snapshot (wrong magic, version, checksum or shapes)."""


def snapshot_bytes(config: dict[str, Any], state: State) -> bytes:
    """A snapshot of a model's configuration and state.

    The arrays are hashed in place and copied once, into the result, not three times. A host
    that must keep the model still while it is read uses ``SnapshotBuffer`` instead, which
    holds it for a copy alone.
    """
    arrays = [(name, np.ascontiguousarray(to_numpy(a))) for name, a in state.arrays().items()]
    little_endian = [a.astype(a.dtype.newbyteorder("<"), copy=False) for _, a in arrays]
    digest = hashlib.sha256()
    for array in little_endian:
        digest.update(array)
    layout = {name: (a.shape, a.dtype) for name, a in arrays}
    prefix = _prefix(_header(config, state.examples_seen, state.moments.count, layout,
                             digest.hexdigest()))
    return b"".join((prefix, *little_endian))


class SnapshotBuffer:
    """One snapshot of a model, taken in three steps so that the model stands still only while
    its arrays are copied.

    ``to_bytes`` reads, hashes and copies the state in one go: about 110 ms for the MNIST
    network's 107 MB, more in memory not touched before, and a host that serialises under the
    model's lock stalls learning for all of it. Here the memory is allocated and touched first
    (``SnapshotBuffer(model)``, with the model free to learn), ``capture`` copies the state into
    it (the one step that needs the model still), and ``seal`` hashes the copy and writes the
    header in front of it, once the model may learn again. ``seal`` returns the very bytes that
    ``to_bytes`` would have returned at ``capture``, as a view of the buffer.

    ``model``: a ``gln.GLN``, read through its ``config`` and its state (``model._state``).
    """

    def __init__(self, model: Any) -> None:
        self._layout = _layout_of(model._state)
        # The header's length varies with the two counters only: room for the longest
        # (counters of 2**63 - 1, beyond the MAX_COUNT a loader accepts) before the payload.
        longest = _header(model.config, 2**63 - 1, 2**63 - 1, self._layout, "0" * 64)
        self._payload_at = len(_prefix(longest))
        sizes = [dtype.itemsize * math.prod(shape) for shape, dtype in self._layout.values()]
        self._memory = np.empty(self._payload_at + sum(sizes), dtype=np.uint8)
        self._memory[::_PAGE] = 0  # fault the pages in now, not while the model waits
        self._arrays, at = {}, self._payload_at
        for (name, (shape, dtype)), size in zip(self._layout.items(), sizes, strict=True):
            little = dtype.newbyteorder("<")
            self._arrays[name] = self._memory[at:at + size].view(little).reshape(shape)
            at += size
        self._counters: tuple[dict[str, Any], int, int] | None = None

    def capture(self, model: Any) -> None:
        """Copy the model's state (and its counters) into the buffer: the model must not learn
        meanwhile. ``ValueError`` if its arrays are not laid out as when the buffer was made."""
        state: State = model._state
        if _layout_of(state) != self._layout:
            raise ValueError("the model's arrays changed shape since this buffer was made")
        for name, array in state.arrays().items():
            copy_to_host(array, self._arrays[name])
        self._counters = model.config, state.examples_seen, state.moments.count

    def seal(self) -> memoryview:
        """The snapshot of the captured state: its header, then the arrays (``to_bytes``'s
        bytes). Needs nothing of the model, which may have learned since ``capture``."""
        if self._counters is None:
            raise ValueError("nothing captured: call capture(model) first")
        config, examples_seen, moments_count = self._counters
        digest = hashlib.sha256(self._memory[self._payload_at:]).hexdigest()
        prefix = _prefix(_header(config, examples_seen, moments_count, self._layout, digest))
        start = self._payload_at - len(prefix)
        if start < 0:
            raise ValueError("the snapshot header outgrew the room kept for it")
        self._memory[start:self._payload_at] = np.frombuffer(prefix, dtype=np.uint8)
        return memoryview(self._memory[start:])


_PAGE = 4096  # bytes between the touches that fault a fresh buffer's pages in


def _layout_of(state: State) -> Layout:
    """The shape and dtype of each of ``state``'s arrays, by name, in snapshot order."""
    return {name: (tuple(a.shape), np.dtype(a.dtype)) for name, a in state.arrays().items()}


def _header(
    config: dict[str, Any], examples_seen: int, moments_count: int, layout: Layout,
    payload_sha256: str,
) -> dict[str, Any]:
    """A snapshot's header: the configuration, the counters, every array's name, dtype and
    shape in payload order, and the checksum of the payload."""
    header = {
        "format": "gln-snapshot",
        "version": FORMAT_VERSION,
        "config": config,
        "examples_seen": examples_seen,
        "moments_count": moments_count,
        "arrays": [
            {"name": name, "dtype": dtype.newbyteorder("<").str, "shape": list(shape)}
            for name, (shape, dtype) in layout.items()
        ],
        "payload_sha256": payload_sha256,
    }
    header["header_sha256"] = header_digest(header)
    return header


def header_digest(header: dict[str, Any]) -> str:
    """The SHA-256 of a header less its two checksums, as canonical JSON (sorted keys, no
    spaces), which a parsed header gives again bit for bit."""
    rest = {k: v for k, v in header.items() if k not in ("payload_sha256", "header_sha256")}
    return hashlib.sha256(
        json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def _prefix(header: dict[str, Any]) -> bytes:
    """What stands before the payload: the magic bytes, the header's length, the header."""
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return b"".join((MAGIC, _LENGTH.pack(len(encoded)), encoded))


def _parse_header(view: memoryview) -> tuple[dict[str, Any], int]:
    """A snapshot's header (magic, format and version checked) and where its payload starts."""
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise SnapshotFormatError("not a GLN snapshot (bad magic bytes)")
    start = len(MAGIC) + _LENGTH.size
    if len(view) < start:
        raise SnapshotFormatError("truncated GLN snapshot header")
    (length,) = _LENGTH.unpack(view[len(MAGIC):start])
    if length > MAX_HEADER_BYTES:
        raise SnapshotFormatError(
            f"GLN snapshot header of {length} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(bytes(view[start:start + length]))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise SnapshotFormatError(f"corrupt GLN snapshot header: {error}") from None
    if not isinstance(header, dict) or header.get("format") != "gln-snapshot":
        raise SnapshotFormatError("not a GLN snapshot header")
    if header.get("version") != FORMAT_VERSION:
        raise SnapshotFormatError(
            f"unsupported GLN snapshot version {header.get('version')!r} "
            f"(this library reads version {FORMAT_VERSION})"
        )
    recorded = header.get("header_sha256")  # absent from snapshots written before it
    if recorded is not None and recorded != header_digest(header):
        raise SnapshotFormatError("GLN snapshot header checksum mismatch (corrupt header)")
    return header, start + length


def _config_of(header: dict[str, Any]) -> dict[str, Any]:
    config = header.get("config")
    if not isinstance(config, dict):
        raise SnapshotFormatError("GLN snapshot header holds no configuration")
    return dict(config)


def read_header(blob: bytes) -> tuple[dict[str, Any], memoryview]:
    """The checked header and the payload of a snapshot."""
    view = memoryview(blob)
    header, start = _parse_header(view)
    payload = view[start:]
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise SnapshotFormatError("GLN snapshot checksum mismatch (corrupt or truncated)")
    return header, payload


def snapshot_config(blob: bytes) -> dict[str, Any]:
    """The configuration a snapshot was saved with, from its header alone.

    Cheap (the payload is neither hashed nor read), so a host can size the model a blob would
    build (``GLN.estimate_nbytes``) before it builds it; ``read_snapshot`` checks the rest.
    """
    header, _ = _parse_header(memoryview(blob))
    return _config_of(header)


def _arrays_and_counters(
    header: dict[str, Any],
) -> tuple[list[tuple[str, np.dtype, tuple[int, ...]]], int, int]:
    """The arrays (name, dtype, shape) in payload order and the two counters, as the header
    gives them; SnapshotFormatError if it lacks or mangles any (a blob's checksum covers the
    payload only, so a header may be anything)."""
    try:
        arrays = [
            (str(entry["name"]), _dtype(entry["dtype"]), tuple(_side(d) for d in entry["shape"]))
            for entry in header["arrays"]
        ]
        counters = header["moments_count"], header["examples_seen"]
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise SnapshotFormatError(f"malformed GLN snapshot header: {error!r}") from None
    for key, value in zip(("moments_count", "examples_seen"), counters, strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNT:
            raise SnapshotFormatError(
                f"malformed GLN snapshot header: {key} must be a count (an integer in "
                f"[0, 2**62)), got {value!r}"
            )
    return arrays, *counters


# The dtypes a state holds, as a header writes them; a string is matched before NumPy parses it
# (np.dtype reads struct and tuple notation, which a crafted header could abuse).
_DTYPES = {f"{order}{kind}{size}" for order in "<>|=" for kind in "fiub" for size in (1, 2, 4, 8)}


def _dtype(text: Any) -> np.dtype:
    if not isinstance(text, str) or text not in _DTYPES:
        raise ValueError(f"dtype {text!r} is none of a state's")
    return np.dtype(text)


def _side(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNT:
        raise ValueError(f"array side {value!r} is not a size")
    return value


@dataclass(frozen=True)
class Snapshot:
    """A snapshot read and checked but not yet loaded: the configuration it was saved with,
    its arrays (name, dtype, shape) in payload order, its counters and its payload."""

    config: dict[str, Any]
    arrays: list[tuple[str, np.dtype, tuple[int, ...]]]
    moments_count: int
    examples_seen: int
    payload: memoryview


def read_snapshot(blob: bytes) -> Snapshot:
    """A snapshot's header and payload, checked (magic, version, both checksums, counters);
    ``SnapshotFormatError`` otherwise. Its arrays are checked against a configuration's
    layout by ``load_state``."""
    header, payload = read_header(blob)
    config = _config_of(header)
    arrays, moments_count, examples_seen = _arrays_and_counters(header)
    return Snapshot(config, arrays, moments_count, examples_seen, payload)


def check_arrays(snapshot: Snapshot, expected: Layout) -> None:
    """``SnapshotFormatError`` unless the snapshot's arrays are ``expected``'s (the layout of
    the configuration it is loaded with; one saved before ``moments_shift`` may lack that) and
    fill its payload exactly: checked before anything of that size is allocated."""
    named = {name: (shape, dtype) for name, dtype, shape in snapshot.arrays}
    for name, layout in named.items():
        if expected.get(name) != layout:
            raise SnapshotFormatError(f"snapshot array {name!r} does not fit the configuration")
    if len(named) != len(snapshot.arrays) or set(expected) - set(named) - {"moments_shift"}:
        raise SnapshotFormatError("GLN snapshot arrays do not match the configuration")
    size = sum(dtype.itemsize * math.prod(shape) for shape, dtype in named.values())
    if size != len(snapshot.payload):
        raise SnapshotFormatError(f"GLN snapshot payload of {len(snapshot.payload)} bytes, "
                                  f"where its arrays take {size}")


def load_state(snapshot: Snapshot, expected: Layout, xp: Any) -> State:
    """The state a snapshot holds, on ``xp``'s device: each array checked against
    ``expected`` (the layout of the configuration it is loaded with) before it is read, every
    value finite; ``SnapshotFormatError`` otherwise."""
    payload, offset, loaded = snapshot.payload, 0, {}
    for name, dtype, shape in snapshot.arrays:
        if expected.get(name) != (shape, dtype):
            raise SnapshotFormatError(
                f"snapshot array {name!r} does not fit the configuration"
            )
        size = dtype.itemsize * int(np.prod(shape))
        if offset + size > len(payload):
            raise SnapshotFormatError("truncated GLN snapshot payload")
        host = np.frombuffer(payload[offset:offset + size], dtype=dtype).reshape(shape)
        if dtype.kind == "f" and not np.isfinite(host).all():
            raise SnapshotFormatError(f"snapshot array {name!r} holds NaN or infinity")
        # A CPU model owns a writable copy; CuPy copies to the device anyway.
        native = host.astype(dtype.newbyteorder("="), copy=xp is np)
        loaded[name] = xp.asarray(native)
        offset += size
    if set(expected) - set(loaded) == {"moments_shift"}:
        # Saved before the running sums were shifted: they are sums of the rows themselves.
        shape, dtype = expected["moments_shift"]
        loaded["moments_shift"] = xp.zeros(shape, dtype=dtype)
    if set(loaded) != set(expected) or offset != len(payload):
        raise SnapshotFormatError("GLN snapshot arrays do not match the configuration")
    return State(loaded, snapshot.moments_count, snapshot.examples_seen)
