"""Input scaling on the CPU in compiled passes: the running moments and the standardisation of
a chunk, each one loop over its rows.

The array code (``gln.scaling``) spends a one-row call's time in a dozen NumPy calls on arrays
of a few numbers (cumsum, concatenate, where, maximum, clip ...), each far dearer than its
arithmetic. These loops make the same float64 operations on the same values in the same order,
without fast-math (no reassociation, no fused multiply-adds), so they give NumPy's bits: the
tests compare them with the array code on random chunks, counts 0, constant features and
values beyond the clips. A long chunk gains too: one pass over its rows instead of ten.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from gln.scaling import Z_LIMIT, RunningMoments


@numba.njit(nogil=True, cache=True)
def _moments(count, total, total_sq, x64, shift, counts, sums, sums_sq, after, after_sq):
    # The array code's cumsum over [total; x - shift]: row t's sums are the totals plus the
    # rows before it, added one row at a time in order; its squares are (x - shift) ** 2.
    n, d = x64.shape
    for i in range(d):
        after[i] = total[i]
        after_sq[i] = total_sq[i]
    for t in range(n):
        counts[t, 0] = np.float64(count) + np.float64(t)
        for i in range(d):
            sums[t, i] = after[i]
            sums_sq[t, i] = after_sq[i]
            centred = x64[t, i] - shift[i]
            after[i] += centred
            after_sq[i] += centred * centred


def cpu_moments_before_each_row(
    moments: RunningMoments, x64: np.ndarray, shift: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, RunningMoments]:
    """``gln.scaling.moments_before_each_row`` for float64 NumPy arrays, bit for bit."""
    n, d = x64.shape
    counts, sums, sums_sq = np.empty((n, 1)), np.empty((n, d)), np.empty((n, d))
    after = RunningMoments(moments.count + n, np.empty(d), np.empty(d))
    _moments(moments.count, moments.total, moments.total_sq, x64, _shift_or_zeros(shift, d),
             counts, sums, sums_sq, after.total, after.total_sq)
    return counts, sums, sums_sq, after


@numba.njit(nogil=True, cache=True)
def _standardize(x64, counts, sums, sums_sq, min_std, logit_cap, shift, z, logits):
    # The array code, element by element: the mean and the divisor of row t's statistics (or of
    # one frozen set for every row, when predicting, taken once), then z and its two clips.
    n, d = x64.shape
    per_row = counts.shape[0] == n
    mean, divisor = np.empty(d), np.empty(d)
    for t in range(n):
        r = t if per_row else 0
        count = counts[r, 0]
        seen = count > 0.0
        if seen and (per_row or t == 0):  # as _mean_and_variance
            safe_count = max(count, 1.0)
            for i in range(d):
                mean[i] = sums[r, i] / safe_count
                variance = max(sums_sq[r, i] / safe_count - mean[i] * mean[i], 0.0)
                divisor[i] = max(np.sqrt(variance), min_std)
        for i in range(d):
            # nothing seen yet: no scale to judge a value by
            value = (x64[t, i] - shift[i] - mean[i]) / divisor[i] if seen else 0.0
            z[t, i] = np.float32(min(max(value, -Z_LIMIT), Z_LIMIT))
            logits[t, i] = np.float32(min(max(value, -logit_cap), logit_cap))


def cpu_standardize(
    x64: np.ndarray, counts: np.ndarray, sums: np.ndarray, sums_sq: np.ndarray, min_std: float,
    logit_cap: float, shift: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``gln.scaling.standardized`` for float64 NumPy arrays, bit for bit: ``counts`` (n, 1)
    with sums (n, d) per row, or (1, 1) and (1, d) for every row."""
    n, d = x64.shape
    z, logits = np.empty((n, d), np.float32), np.empty((n, d), np.float32)
    _standardize(x64, counts, sums, sums_sq, min_std, logit_cap, _shift_or_zeros(shift, d), z,
                 logits)
    return z, logits


def _shift_or_zeros(shift: Any, d: int) -> np.ndarray:
    # x - 0.0 is x, bit for bit (-0.0 included): no shift is a shift of zeros.
    return np.zeros(d) if shift is None else shift
