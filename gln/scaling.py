"""Online input scaling: side information for gating and base predictions for layer 0.

Features arrive one example at a time, so their mean and variance are running statistics
(count, sum, sum of squares in float64). Row t of a chunk is scaled with the statistics of the
rows before it; those are prefix sums over the chunk, accumulated in order, so scaling a chunk
gives bit-for-bit what scaling its rows one call at a time gives. Before any data, the mean is 0
and the scale 1; ``"standardize"`` then gives z = 0 (no scale yet to judge a value by).

The sums are of the rows less a fixed ``shift``, the first row learned (``GLN`` keeps it; zero
before that row, and always in ``"unit"`` mode, whose inputs lie in [0, 1]). The variance is the
mean square less the squared mean, which cancels catastrophically when a feature's mean is
large against its spread: sums of raw values of 1e4 +- 0.05 gave a standard deviation 13% off
after a million rows, and of 3e7 +- 4 one of 0. Shifted, the sums are of the spread's size;
``x - shift`` is then standardised against them, which is the same z in exact arithmetic.

Three modes (``input_scaling``):

``"standardize"`` (default, any real-valued features)
    side information ``z = (x - mean) / max(std, min_std)`` per feature (0 before any row
    is learned, when there is no scale to judge a value by), so that unit-normal
    hyperplanes with N(0, 1) offsets cut through the data; base predictions are
    ``clip(sigmoid(z), eps, 1 - eps)``, whose logit is ``clip(z, -logit(1-eps), logit(1-eps))``.
    A constant feature gives z = 0 (never NaN). The statistics are all-time: one extreme
    outlier (1e6 in a feature of spread 1) widens that feature's spread for good, and its later
    values then scale to about 0. Clean or clip such inputs before they reach the model; z is
    bounded (``Z_LIMIT``) only so that an outlier never makes a NaN.

``"unit"`` (inputs already probabilities in [0, 1], e.g. pixel intensities)
    base predictions are the inputs themselves, ``clip(x, eps, 1 - eps)``; side information is
    the centred input divided by one pooled standard deviation (the root mean of the per-feature
    variances), which keeps the geometry of the input (cosine similarity, as the paper's
    halfspace argument wants) and does not blow up rare features such as border pixels.

``"unit_fixed"`` (inputs in [0, 1], and a stream whose statistics change)
    no statistics at all: a row's scaling depends on that row alone, so it never drifts. The
    running statistics of the other modes move whenever the stream's distribution does (each
    new task of permuted MNIST moves every pixel's mean), which changes the gating and the base
    predictions of every example learned before, and with them what the network predicts for
    earlier tasks. Base predictions map [0, 1] onto logits [0, logit(1 - eps)]: 0 (no ink) is
    the uninformative 1/2 and 1 is 1 - eps (the inputs themselves, as ``"unit"`` takes them,
    make every blank pixel a confident 0 that the weights must learn to discount). Side
    information is the row rescaled to norm sqrt(d), ``z = x sqrt(d) / |x|`` (0 for a row of
    zeros): not centred, so the cosine similarity of two rows, which the paper's halfspace
    argument is about, is kept, and rows of two permutations of the pixels stay far apart;
    at norm sqrt(d), a unit normal's dot product with z is of the order of the N(0, 1)
    offsets. The network is the paper's, exactly, on these inputs. It is array code on every
    device (no kernel of its own), so a GPU model's short calls are not replayed from captured
    graphs.

Side information for gating (``side_info``) is, by default, the scaled z above. With
``"per_row"`` it is instead each row on its own: centred on the row's mean, optionally smoothed
with a Gaussian of ``side_info_blur`` pixels when the rows are images of ``image_shape``, and
rescaled to norm sqrt(d) (so that z . v of a unit normal is of order 1, like the offsets). The
halfspace test then depends only on the shape of the input, not on its overall brightness or on
running statistics; base predictions are unchanged. On deskewed MNIST this gating (blur 1.5)
raised one-pass test accuracy from 97.45% to 97.9% (benchmarks/mnist_online.py).

With ``"given"`` the side information is not made from the rows at all: each row comes with
its own (``GLN.learn(X, y, side_info=Z)``), used by the gating as it is, while the rows are
only the base predictions. This is the paper's general form, in which the inputs p0 that
layer 1 mixes and the side information z that picks the weights may be different things (a
pixel's model in a density model mixes a few neighbouring pixels and is gated by everything
before its own, ``gln.density``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

INPUT_SCALINGS = ("standardize", "unit", "unit_fixed")
# Side information is bounded to +-Z_LIMIT before it becomes float32: an outlier far beyond the
# running statistics (a float32-sized value over a small spread) would otherwise be infinite,
# and its halfspace margins NaN. Far inside float32, so a unit normal's dot product with a
# whole row of bounded values stays finite; no value the data can reasonably reach is changed.
Z_LIMIT = 1e30
SIDE_INFOS = ("scaled", "per_row", "given")


class FusedScaling(NamedTuple):
    """Single-kernel versions of the scaling steps, for devices where launches are dear (the
    GPU), or where array calls cost more than a short chunk's arithmetic (the CPU, whose
    ``standardize`` is compiled and whose other two steps are the array code).

    ``standardize(x64, counts, sums, sums_sq, min_std, logit_cap, shift) -> (z, logits)``
    gives the bits of ``standardized``; ``unit(x64, counts, sums, sums_sq, min_std, pred_clip,
    want_z) -> (z or None, logits)`` and ``per_row_side_info(x64, blur) -> z`` (float32) equal
    ``unit_scaled`` and ``per_row_side_info`` up to the rounding of their sums.
    """

    standardize: Callable[..., tuple[Any, Any]]
    unit: Callable[..., tuple[Any, Any]]
    per_row_side_info: Callable[..., Any]


@dataclass
class RunningMoments:
    """Count, per-feature sum and sum of squares of every row learned so far."""

    count: int
    total: Any  # (d,) float64
    total_sq: Any  # (d,) float64


def moments_before_each_row(
    xp: ModuleType, moments: RunningMoments, x64: Any, shift: Any = None
) -> tuple[Any, Any, Any, RunningMoments]:
    """Statistics seen by each row of a chunk (before it), and the statistics after the chunk.

    Returns counts (n, 1), sums (n, d), sums of squares (n, d) and the updated moments, all of
    ``x64 - shift`` (of ``x64`` without a ``shift``). This array code is the specification:
    the devices' compiled folds (``gln.kernels.moments_fold_for``) give its bits.
    """
    if shift is not None:
        x64 = x64 - shift
    n = x64.shape[0]
    sums = xp.cumsum(xp.concatenate([moments.total[None, :], x64]), axis=0)
    sums_sq = xp.cumsum(xp.concatenate([moments.total_sq[None, :], x64 * x64]), axis=0)
    counts = (moments.count + xp.arange(n + 1, dtype=xp.float64))[:, None]
    after = RunningMoments(moments.count + n, sums[-1].copy(), sums_sq[-1].copy())
    return counts[:-1], sums[:-1], sums_sq[:-1], after


def scale_inputs(
    xp: ModuleType,
    x64: Any,
    counts: Any,
    sums: Any,
    sums_sq: Any,
    *,
    mode: str,
    pred_clip: float,
    min_std: float,
    side_info: str = "scaled",
    blur: tuple[Any, Any] | None = None,
    fused: FusedScaling | None = None,
    shift: Any = None,
    given: Any = None,
) -> tuple[Any, Any]:
    """Side information z (n, d) float32, or ``given`` (n, s) as it is for ``side_info=
    "given"``, and base-prediction logits (n, d) float32.

    ``shift``: what the running sums were taken less of (``moments_before_each_row``), for
    ``"standardize"``. ``fused`` replaces steps by single kernels (the GPU's) that compute what
    ``standardized``, ``unit_scaled`` and ``per_row_side_info`` compute.
    """
    logit_cap = math.log((1.0 - pred_clip) / pred_clip)
    if mode == "standardize":
        compute = fused.standardize if fused else functools.partial(standardized, xp)
        z, base_logits = compute(x64, counts, sums, sums_sq, min_std, logit_cap, shift)
    elif mode == "unit":
        compute = fused.unit if fused else functools.partial(unit_scaled, xp)
        # Per-row or given side information replaces z: no need to compute it.
        z, base_logits = compute(x64, counts, sums, sums_sq, min_std, pred_clip,
                                 side_info == "scaled")
    elif mode == "unit_fixed":
        z, base_logits = unit_fixed_scaled(xp, x64, pred_clip, side_info == "scaled")
    else:
        raise ValueError(f"input_scaling must be one of {INPUT_SCALINGS}, got {mode!r}")
    if side_info == "per_row":
        z = fused.per_row_side_info(x64, blur) if fused else per_row_side_info(xp, x64, blur)
    elif side_info == "given":
        if given is None:
            raise ValueError("side_info='given' needs the side information of each row")
        z = given
    elif side_info != "scaled":
        raise ValueError(f"side_info must be one of {SIDE_INFOS}, got {side_info!r}")
    return z.astype(xp.float32, copy=False), base_logits.astype(xp.float32, copy=False)


def standardized(
    xp: ModuleType, x64: Any, counts: Any, sums: Any, sums_sq: Any, min_std: float,
    logit_cap: float, shift: Any = None,
) -> tuple[Any, Any]:
    """``z = (x - mean) / max(std, min_std)`` (bounded to +-Z_LIMIT) and its logits clipped to
    +-logit_cap, float32; with a ``shift``, x is ``x64 - shift`` (that of the sums)."""
    mean, variance = _mean_and_variance(xp, counts, sums, sums_sq)
    centred = x64 if shift is None else x64 - shift
    z = (centred - mean) / xp.maximum(xp.sqrt(variance), min_std)
    z = xp.where(counts > 0, z, 0.0)  # nothing seen yet: no scale to judge a value by
    return (xp.clip(z, -Z_LIMIT, Z_LIMIT).astype(xp.float32),
            xp.clip(z, -logit_cap, logit_cap).astype(xp.float32))


def unit_scaled(
    xp: ModuleType, x64: Any, counts: Any, sums: Any, sums_sq: Any, min_std: float,
    pred_clip: float, want_z: bool = True,
) -> tuple[Any, Any]:
    """Mode ``"unit"``: ``z = (x - mean) / max(pooled std, min_std)`` bounded to +-Z_LIMIT
    (None unless ``want_z``) and the logits of ``clip(x, eps, 1 - eps)``, float64."""
    p0 = xp.clip(x64, pred_clip, 1.0 - pred_clip)
    base_logits = xp.log(p0 / (1.0 - p0))
    if not want_z:
        return None, base_logits
    mean, variance = _mean_and_variance(xp, counts, sums, sums_sq)
    pooled = xp.sqrt(variance.mean(axis=1, keepdims=True))
    z = (x64 - mean) / xp.maximum(pooled, min_std)
    return xp.clip(z, -Z_LIMIT, Z_LIMIT), base_logits


def unit_fixed_scaled(
    xp: ModuleType, x64: Any, pred_clip: float, want_z: bool = True
) -> tuple[Any, Any]:
    """Mode ``"unit_fixed"``: ``z = x sqrt(d) / |x|`` (0 for a row of zeros; None unless
    ``want_z``) and base logits ``clip(x, 0, 1) logit(1 - eps)``; no statistics, so each row's
    are its own."""
    base_logits = xp.clip(x64, 0.0, 1.0) * math.log((1.0 - pred_clip) / pred_clip)
    if not want_z:
        return None, base_logits
    norms = xp.sqrt((x64 * x64).sum(axis=1, keepdims=True))
    scale = xp.where(norms > 0, math.sqrt(x64.shape[1]) / xp.where(norms > 0, norms, 1.0), 0.0)
    return x64 * scale, base_logits


def _mean_and_variance(xp: ModuleType, counts: Any, sums: Any, sums_sq: Any) -> tuple[Any, Any]:
    """Mean and (population) variance from running sums; 0 and 1 before any row."""
    seen = counts > 0
    safe_counts = xp.maximum(counts, 1.0)
    mean = xp.where(seen, sums / safe_counts, 0.0)
    variance = xp.where(seen, xp.maximum(sums_sq / safe_counts - mean * mean, 0.0), 1.0)
    return mean, variance


def gaussian_blur_matrix(size: int, sigma: float) -> Any:
    """(size, size) float64 matrix B with ``B @ v`` = v smoothed by a Gaussian of std ``sigma``.

    Truncated at 4 sigma, zero outside the image (as ``scipy.ndimage.gaussian_filter`` with
    ``mode="constant"``).
    """
    import numpy as np  # noqa: PLC0415 - built once per model on the host

    radius = int(4.0 * sigma + 0.5)
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    taps /= taps.sum()
    # Filled one diagonal at a time: no temporaries of the matrix's size.
    matrix = np.zeros((size, size))
    for offset in range(-min(radius, size - 1), min(radius, size - 1) + 1):
        rows = np.arange(max(0, -offset), min(size, size - offset))
        matrix[rows, rows + offset] = taps[offset + radius]
    return matrix


def per_row_side_info(xp: ModuleType, x64: Any, blur: tuple[Any, Any] | None) -> Any:
    """Each row centred on its own mean, optionally blurred, at norm sqrt(d): (n, d) float64.

    ``blur`` is (B_rows, B_cols) from ``gaussian_blur_matrix`` for rows that are images, or
    None. A constant row gives z = 0.
    """
    n, d = x64.shape
    z = x64 - x64.mean(axis=1, keepdims=True)
    if blur is not None:
        rows, cols = blur
        z = (rows @ z.reshape(n, rows.shape[0], cols.shape[0]) @ cols.T).reshape(n, d)
    norms = xp.sqrt((z * z).sum(axis=1, keepdims=True))
    return xp.where(norms > 0, z * (math.sqrt(d) / xp.where(norms > 0, norms, 1.0)), 0.0)


def family_moments_before_each_row(
    xp: ModuleType, members: Any, x64: Any, shifts: Any, member_counts: Any, totals: Any,
    totals_sq: Any,
) -> tuple[Any, Any, Any]:
    """The statistics each row of a chunk sees: its member's count (n, 1), sums (n, d) and
    sums of squares (n, d) of ``x - shifts[member]`` over that member's rows before it. The
    members' counts (M,) and totals (M, d) are advanced in place to after the chunk.

    Each member's rows go through ``gln.scaling.moments_before_each_row`` with its own
    statistics: this is the specification the compiled fold
    (``gln.kernels.cpu_family.cpu_family_moments``) gives the bits of."""
    n, d = x64.shape
    counts, sums, sums_sq = xp.empty((n, 1)), xp.empty((n, d)), xp.empty((n, d))
    for member in xp.unique(members).tolist():
        rows = xp.flatnonzero(members == member)
        before = RunningMoments(int(member_counts[member]), totals[member], totals_sq[member])
        counts[rows], sums[rows], sums_sq[rows], after = moments_before_each_row(
            xp, before, x64[rows], shifts[member])
        member_counts[member], totals[member], totals_sq[member] = (
            after.count, after.total, after.total_sq)
    return counts, sums, sums_sq
