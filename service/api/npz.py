"""Binary rows: request and answer bodies as NumPy ``.npz`` archives (``application/x-npz``).

Why ``.npz``: every client that has NumPy writes it (``np.savez(f, features=X, labels=y)``),
it names its arrays so one body carries rows, labels and ids, and it is read here without
pickle and without a Python loop over the numbers: each array's bytes are taken as they are.
(Arrow IPC would do as well, at the price of a 100 MB dependency on both sides.)

Bytes from outside are hostile until every size in them is checked: an archive's members are
read only up to the body's own size (a compressed member may claim more), and an array's
header must describe exactly the bytes that follow it before anything is allocated.

>>> import io, numpy as np
>>> buffer = io.BytesIO()
>>> np.savez(buffer, features=np.ones((2, 3), np.float32), labels=np.array([0, 1]))
>>> arrays = read_npz(buffer.getvalue(), max_bytes=1 << 20)
>>> arrays["features"].shape, arrays["labels"].tolist()
((2, 3), [0, 1])
>>> read_npz(b"not a zip", max_bytes=1 << 20)
Traceback (most recent call last):
...
ValueError: not an .npz archive (write it with numpy.savez)
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np

NPZ = "application/x-npz"

# Array kinds a body may hold: numbers for features, numbers or class names for labels, text
# for ids and a stream batch's idempotency key.
_KINDS = {"features": "biuf", "labels": "biufU", "ids": "U", "key": "U"}


def read_npz(body: bytes, max_bytes: int) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` body, by name; ``ValueError`` naming what is wrong.

    ``max_bytes`` bounds what its members may unpack to, together.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError):
        raise ValueError("not an .npz archive (write it with numpy.savez)") from None
    if sum(member.file_size for member in members) > max_bytes:
        raise ValueError(f"its arrays unpack to more than {max_bytes} bytes "
                         "(GLN_MAX_BODY_BYTES)")
    arrays = {}
    for member in members:
        name = member.filename.removesuffix(".npy")
        if name not in _KINDS:
            raise ValueError(f"unknown array {name!r}; the arrays are "
                             f"{', '.join(sorted(_KINDS))}")
        try:
            with archive.open(member) as stream:
                data = stream.read(member.file_size + 1)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError) as exc:
            raise ValueError(f"array {name!r} cannot be read ({exc})") from None
        arrays[name] = _array(name, data)
    return arrays


def _array(name: str, data: bytes) -> np.ndarray:
    """One ``.npy`` member as an array over ``data``, its header checked against its size."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    except (ValueError, TypeError, SyntaxError, EOFError) as exc:
        raise ValueError(f"array {name!r} is not a .npy array ({exc})") from None
    if dtype.hasobject or dtype.kind not in _KINDS[name]:
        wanted = "text" if _KINDS[name] == "U" else "numbers"
        raise ValueError(f"array {name!r} must hold {wanted}, got dtype {dtype.str}")
    count = 1
    for side in shape:
        count *= side
    offset = stream.tell()
    if count * dtype.itemsize != len(data) - offset:
        raise ValueError(f"array {name!r} claims shape {shape} of {dtype.str}, which is "
                         f"not the {len(data) - offset} bytes it holds")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return array.reshape(shape, order="F" if fortran else "C")


def write_npz(payload: dict[str, Any]) -> bytes:
    """``payload`` as an ``.npz``: arrays as they are, numbers and text as 0-d arrays, and
    fields that are None left out (an archive has no null)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{key: np.asarray(value) for key, value in payload.items()
                        if value is not None})
    return buffer.getvalue()
