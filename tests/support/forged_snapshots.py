"""Forged GLN snapshots, as a hostile blob's author makes them: headers rewritten and both
checksums recomputed (the checksums find corruption, not forgery). Shared by the library's fuzz
test and the service's import test."""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from typing import Any

import numpy as np

from gln import GLN
from gln.serialize import MAGIC, header_digest

HOSTILE_VALUES: list[Any] = [
    None, True, -1, 0, 1, 2**31, 2**63, 10**30, 1e308, float("nan"), "", "x" * 1000,
    "(i4,(100000000,))", "<f4", "|O", "O", [], [1] * 5, [3000, 3000], {"a": 1}, [[1, 2]],
    0.5, -0.0, "per_row", "unit", 1e-300,
]


def blob() -> bytes:
    """A real snapshot of a small model with per-row side information."""
    model = GLN(num_features=16, num_classes=3, layer_sizes=(4, 1), context_dim=2,
                side_info="per_row", image_shape=(4, 4), side_info_blur=0.5, seed=1)
    rng = np.random.default_rng(0)
    model.learn(rng.random((20, 16)), rng.integers(0, 3, 20))
    return model.to_bytes()


def split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack("<I", blob[len(MAGIC):len(MAGIC) + 4])
    start = len(MAGIC) + 4
    return json.loads(blob[start:start + length]), blob[start + length:]


def forge(header: dict[str, Any], payload: bytes) -> bytes:
    """A blob of ``header`` and ``payload`` with both checksums recomputed."""
    header = dict(header, payload_sha256=hashlib.sha256(payload).hexdigest())
    header["header_sha256"] = header_digest(header)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(encoded)) + encoded + payload


def mutate(rng: np.random.Generator, header: dict[str, Any], payload: bytes) -> bytes:
    """One forged blob: a config value, an array's description, a counter or the payload
    changed, a model far larger than its bytes claimed, or raw bytes flipped."""
    header = copy.deepcopy(header)
    kind = rng.integers(6)
    if kind == 0:  # a config value
        key = str(rng.choice(sorted(header["config"])))
        header["config"][key] = HOSTILE_VALUES[rng.integers(len(HOSTILE_VALUES))]
    elif kind == 1:  # an array's dtype, shape or name
        entry = header["arrays"][rng.integers(len(header["arrays"]))]
        field = str(rng.choice(["dtype", "shape", "name"]))
        entry[field] = HOSTILE_VALUES[rng.integers(len(HOSTILE_VALUES))]
    elif kind == 2:  # a counter, or a key dropped
        key = str(rng.choice(sorted(header)))
        if rng.random() < 0.5:
            del header[key]
        else:
            header[key] = HOSTILE_VALUES[rng.integers(len(HOSTILE_VALUES))]
    elif kind == 3:  # the payload cut or extended
        cut = int(rng.integers(len(payload) + 1))
        payload = payload[:cut] if rng.random() < 0.5 else payload + bytes(cut)
    elif kind == 4:  # a model far larger than its bytes: the amplification attack
        side = int(rng.choice([300, 3000, 30000]))
        header["config"].update(num_features=side * side, image_shape=[side, side],
                                side_info_blur=float(rng.choice([1.5, 50.0])))
        for entry in header["arrays"]:
            entry["shape"] = [side * side if d == 16 else d for d in entry["shape"]]
    else:  # raw bytes flipped anywhere (the checksums left as they are)
        raw = bytearray(forge(header, payload))
        for _ in range(int(rng.integers(1, 8))):
            raw[int(rng.integers(len(raw)))] = int(rng.integers(256))
        return bytes(raw)
    return forge(header, payload)
