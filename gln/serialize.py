"""Snapshots as bytes: a small versioned JSON header followed by raw little-endian arrays.

Layout::

    b"GLNSNAP\\0"  | uint32 LE header length | header (UTF-8 JSON) | array bytes ...

The header holds the format version, the model's configuration, counters, the name, dtype
and shape of every array in payload order, and the SHA-256 of the payload. Loading checks all
of it and never unpickles anything, so a snapshot from an untrusted store cannot run code.
A snapshot taken on a GPU loads on a CPU-only machine and the other way round.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from gln.backend import to_numpy

if TYPE_CHECKING:
    from gln.model import GLN

MAGIC = b"GLNSNAP\x00"
FORMAT_VERSION = 1
_LENGTH = struct.Struct("<I")


class SnapshotFormatError(ValueError):
    """The bytes are not a valid GLN snapshot (wrong magic, version, checksum or shapes)."""


def model_to_bytes(model: GLN) -> bytes:
    """Serialise a model's configuration and state.

    The arrays are hashed in place and copied once, into the result, not three times: a host
    that snapshots under the model's lock holds it for that copy and the hash alone (for an
    MNIST-sized model's 107 MB, half the time).
    """
    arrays = [
        (name, np.ascontiguousarray(to_numpy(a))) for name, a in model._state_arrays().items()
    ]
    little_endian = [a.astype(a.dtype.newbyteorder("<"), copy=False) for _, a in arrays]
    digest = hashlib.sha256()
    for array in little_endian:
        digest.update(array)
    header = {
        "format": "gln-snapshot",
        "version": FORMAT_VERSION,
        "config": model.config,
        "examples_seen": model.examples_seen,
        "moments_count": model.moments.count,
        "arrays": [
            {"name": name, "dtype": a.dtype.newbyteorder("<").str, "shape": list(a.shape)}
            for name, a in arrays
        ],
        "payload_sha256": digest.hexdigest(),
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return b"".join((MAGIC, _LENGTH.pack(len(encoded)), encoded, *little_endian))


def _parse_header(view: memoryview) -> tuple[dict[str, Any], int]:
    """A snapshot's header (magic, format and version checked) and where its payload starts."""
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise SnapshotFormatError("not a GLN snapshot (bad magic bytes)")
    start = len(MAGIC) + _LENGTH.size
    if len(view) < start:
        raise SnapshotFormatError("truncated GLN snapshot header")
    (length,) = _LENGTH.unpack(view[len(MAGIC):start])
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
    return header, start + length


def _config_of(header: dict[str, Any]) -> dict[str, Any]:
    config = header.get("config")
    if not isinstance(config, dict):
        raise SnapshotFormatError("GLN snapshot header holds no configuration")
    return dict(config)


def read_header(blob: bytes) -> tuple[dict[str, Any], memoryview]:
    """The validated header and the payload of a snapshot."""
    view = memoryview(blob)
    header, start = _parse_header(view)
    payload = view[start:]
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise SnapshotFormatError("GLN snapshot checksum mismatch (corrupt or truncated)")
    return header, payload


def snapshot_config(blob: bytes) -> dict[str, Any]:
    """The configuration a snapshot was saved with, from its header alone.

    Cheap (the payload is neither hashed nor read), so a host can size the model a blob would
    build (``GLN.estimate_nbytes``) before it builds it; ``model_from_bytes`` checks the rest.
    """
    header, _ = _parse_header(memoryview(blob))
    return _config_of(header)


def _layout(header: dict[str, Any]) -> tuple[list[tuple[str, np.dtype, tuple[int, ...]]], int, int]:
    """The arrays (name, dtype, shape) in payload order and the two counters, as the header
    gives them; SnapshotFormatError if it lacks or mangles any (a blob's checksum covers the
    payload only, so a header may be anything)."""
    try:
        arrays = [
            (str(entry["name"]), np.dtype(entry["dtype"]), tuple(int(d) for d in entry["shape"]))
            for entry in header["arrays"]
        ]
        counters = header["moments_count"], header["examples_seen"]
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise SnapshotFormatError(f"malformed GLN snapshot header: {error!r}") from None
    for key, value in zip(("moments_count", "examples_seen"), counters, strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise SnapshotFormatError(
                f"malformed GLN snapshot header: {key} must be a count (an integer >= 0), "
                f"got {value!r}"
            )
    return arrays, *counters


def model_from_bytes(
    cls: type[GLN], blob: bytes, device: str | None = None, use_kernels: bool = True
) -> GLN:
    """Rebuild a model; ``device`` overrides the device it was saved on."""
    header, payload = read_header(blob)
    config = _config_of(header)
    arrays, moments_count, examples_seen = _layout(header)
    if device is not None:
        config["device"] = device
    # Configured without sampling a state that the payload would overwrite.
    model = cls._configured(config, use_kernels)
    expected = model._state_layout()
    xp, offset, loaded = model._xp, 0, {}
    with model._memory_as_value_error():
        for name, dtype, shape in arrays:
            if expected.get(name) != (shape, dtype):
                raise SnapshotFormatError(
                    f"snapshot array {name!r} does not fit the configuration"
                )
            size = dtype.itemsize * int(np.prod(shape))
            if offset + size > len(payload):
                raise SnapshotFormatError("truncated GLN snapshot payload")
            host = np.frombuffer(payload[offset:offset + size], dtype=dtype).reshape(shape)
            # A CPU model owns a writable copy; CuPy copies to the device anyway.
            native = host.astype(dtype.newbyteorder("="), copy=xp is np)
            loaded[name] = xp.asarray(native)
            offset += size
    if set(loaded) != set(expected) or offset != len(payload):
        raise SnapshotFormatError("GLN snapshot arrays do not match the configuration")
    model._set_state(loaded, moments_count, examples_seen)
    return model
