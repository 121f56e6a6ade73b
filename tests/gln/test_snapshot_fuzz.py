"""Hostile snapshots: whatever bytes ``GLN.from_bytes`` is given, it returns a model or raises
``SnapshotFormatError``, quickly and in little memory, because every size in a header is
checked against the bytes that follow it before anything is allocated.

The mutations rewrite the header and recompute both checksums, as a blob's author can: the
checksums find corruption, not forgery, so the header's own checks are what must hold.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from gln import GLN, SnapshotFormatError
from tests.support.forged_snapshots import blob, forge, mutate, split

MUTATIONS = 2000
MAX_SECONDS_PER_BLOB = 1.0
MAX_BYTES_PER_BLOB = 64 * 2**20

def _load(blob: bytes) -> tuple[str, float, int]:
    """What loading ``blob`` gave ("model" or the error's type), its seconds and peak bytes."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        GLN.from_bytes(blob)
        outcome = "model"
    except SnapshotFormatError:
        outcome = "refused"
    except Exception as error:  # what the test exists to catch
        outcome = f"{type(error).__name__}: {error}"
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return outcome, seconds, peak


def test_a_forged_header_cannot_make_a_large_model_of_a_small_blob():
    header, payload = split(blob())
    header["config"].update(num_features=9_000_000, image_shape=[3000, 3000],
                            side_info_blur=50.0)
    for entry in header["arrays"]:
        entry["shape"] = [9_000_000 if d == 16 else d for d in entry["shape"]]
    outcome, seconds, peak = _load(forge(header, payload))
    assert outcome == "refused"
    assert seconds < MAX_SECONDS_PER_BLOB and peak < MAX_BYTES_PER_BLOB


def test_a_crafted_dtype_is_refused_before_numpy_parses_it():
    header, payload = split(blob())
    header["arrays"][0]["dtype"] = "[('a', '<f4', (2**40,))]"
    with pytest.raises(SnapshotFormatError, match="dtype"):
        GLN.from_bytes(forge(header, payload))


def test_thousands_of_mutations_load_or_raise_snapshot_format_error_only():
    header, payload = split(blob())
    assert _load(forge(header, payload))[0] == "model"  # the forging itself is faithful
    rng = np.random.default_rng(48)
    outcomes: dict[str, int] = {}
    worst_seconds, worst_peak = 0.0, 0
    for _ in range(MUTATIONS):
        outcome, seconds, peak = _load(mutate(rng, header, payload))
        assert outcome in ("model", "refused"), outcome
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        worst_seconds, worst_peak = max(worst_seconds, seconds), max(worst_peak, peak)
    assert outcomes.get("refused", 0) > MUTATIONS // 2  # most mutations are caught
    assert worst_seconds < MAX_SECONDS_PER_BLOB, worst_seconds
    assert worst_peak < MAX_BYTES_PER_BLOB, worst_peak
