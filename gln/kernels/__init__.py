"""Fused per-chunk kernels for the sequential part of learning, one per device.

``layer_pass_for(xp)`` returns the fastest layer pass available for an array module and falls
back to the plain-array reference in ``gln.network``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from gln.gating import layer_contexts
from gln.network import (
    LayerPass,
    network_pass,
    reference_family_layer_pass,
    reference_layer_pass,
)
from gln.scaling import (
    FusedScaling,
    RunningMoments,
    family_moments_before_each_row,
    moments_before_each_row,
    per_row_side_info,
    unit_scaled,
)


def layer_pass_for(xp: ModuleType, use_kernels: bool = True) -> LayerPass:
    """The layer pass for ``xp``: the fused kernel when ``use_kernels``, else the reference."""
    if use_kernels and xp is np:
        from gln.kernels.cpu import cpu_layer_pass  # noqa: PLC0415 - compiles on first use

        return cpu_layer_pass
    if use_kernels and xp.__name__ == "cupy":
        from gln.kernels.cuda import cuda_layer_pass  # noqa: PLC0415 - needs CuPy

        return cuda_layer_pass
    return reference_layer_pass(xp)


def contexts_for(xp: ModuleType, use_kernels: bool = True) -> Callable[..., Any]:
    """``f(z, normals, offsets, context_dim, num_glns, layer_sizes)``: each layer's (n, G, K_l)
    int32 context indices (``gln.gating.layer_contexts``) for ``xp``. Call it once per model:
    on the CPU it is a ``CpuLayerContexts``, which keeps a 16-bit copy of that model's normals,
    on the GPU a ``CudaLayerContexts``, which keeps them cut into int8 slices."""
    if use_kernels and xp is np:
        from gln.kernels.cpu_gating import CpuLayerContexts  # noqa: PLC0415

        return CpuLayerContexts()
    if use_kernels and xp.__name__ == "cupy":
        from gln.kernels.cuda import CudaLayerContexts  # noqa: PLC0415 - needs CuPy

        return CudaLayerContexts()
    return functools.partial(layer_contexts, xp)


def fused_scaling_for(xp: ModuleType, use_kernels: bool = True) -> FusedScaling | None:
    """The single-kernel scaling steps for ``scale_inputs`` on ``xp``, or None (array code)."""
    if use_kernels and xp is np:  # the standardisation in one compiled pass
        from gln.kernels.cpu_scaling import cpu_standardize  # noqa: PLC0415 - loads Numba

        return FusedScaling(cpu_standardize, functools.partial(unit_scaled, np),
                            functools.partial(per_row_side_info, np))
    if use_kernels and xp.__name__ == "cupy":
        from gln.kernels.cuda import (  # noqa: PLC0415
            cuda_per_row_side_info,
            cuda_standardize,
            cuda_unit_scaling,
        )

        return FusedScaling(cuda_standardize, cuda_unit_scaling, cuda_per_row_side_info)
    return None


MomentsFold = Callable[[RunningMoments, Any, Any, Any], tuple[Any, Any, Any, RunningMoments]]


def moments_fold_for(xp: ModuleType, use_kernels: bool = True) -> MomentsFold:
    """``f(moments, x64, count, shift)``: ``gln.scaling.moments_before_each_row`` on ``xp``, with
    the same bits. ``count`` is ``moments.count`` as a one-element device array, which only the
    GPU's fold reads (from memory, so a captured launch can be replayed).

    On the GPU the fold is the sequential kernel even without ``use_kernels``: CuPy's cumsum is
    a parallel scan, which would sum in another order than NumPy and the CPU's fold.
    """
    if xp.__name__ == "cupy":
        from gln.kernels.cuda import moments_before_each_row as sequential  # noqa: PLC0415

        return sequential
    if use_kernels and xp is np:  # one compiled pass, the same additions in the same order
        from gln.kernels.cpu_scaling import cpu_moments_before_each_row  # noqa: PLC0415

        return lambda moments, x64, count, shift: cpu_moments_before_each_row(moments, x64, shift)
    return lambda moments, x64, count, shift: moments_before_each_row(xp, moments, x64, shift)


def network_pass_for(xp: ModuleType, use_kernels: bool = True) -> Callable[..., Any]:
    """``f(weights, contexts, base_logits, targets, rates, *, bias_logit, pred_clip,
    weight_clip, learn)``: every layer over a chunk (``gln.network.network_pass``) on ``xp``.

    On the GPU each layer's kernel also writes the next layer's inputs, which saves a launch per
    layer; elsewhere it is ``network_pass`` with ``layer_pass_for(xp, use_kernels)``.
    """
    if use_kernels and xp.__name__ == "cupy":
        from gln.kernels.cuda import cuda_network_pass  # noqa: PLC0415 - needs CuPy

        return cuda_network_pass
    return functools.partial(network_pass, xp, layer_pass_for(xp, use_kernels))


def family_layer_pass_for(xp: ModuleType, use_kernels: bool = True) -> Callable[..., Any]:
    """``f(weights, members, contexts, inputs, targets, rates, pred_clip, weight_clip, learn,
    probs)``: one layer over rows of many members of a family (``gln.family``) on ``xp``: the
    compiled CPU kernel or the CUDA kernel (one launch, the rows grouped by member) when
    ``use_kernels``, else the array code each gives a device's bytes of. ``members`` (n,)
    int64 on the host."""
    if use_kernels and xp is np:
        from gln.kernels.cpu_family import cpu_family_layer_pass  # noqa: PLC0415 - compiles

        return cpu_family_layer_pass
    if use_kernels and xp.__name__ == "cupy":
        from gln.kernels.cuda import cuda_family_layer_pass  # noqa: PLC0415 - needs CuPy

        return cuda_family_layer_pass
    return reference_family_layer_pass(xp)


def family_network_pass_for(xp: ModuleType, use_kernels: bool = True) -> Callable[..., Any]:
    """``f(weights, members, contexts, base_logits, targets, rates, *, bias_logit, pred_clip,
    weight_clip, learn)``: every layer over a family chunk's rows (``network_pass_for`` with
    row t's weights its member's, ``members[t]``, int64 on the host; rows grouped by member).

    On the GPU each layer is one launch for every member's rows, which also writes the next
    layer's inputs; elsewhere it is ``network_pass`` with ``family_layer_pass_for``."""
    if use_kernels and xp.__name__ == "cupy":
        from gln.kernels.cuda import cuda_family_network_pass  # noqa: PLC0415 - needs CuPy

        return cuda_family_network_pass
    layer_pass = family_layer_pass_for(xp, use_kernels)

    def family_network_pass(weights, members, contexts, base_logits, targets, rates, **options):
        def members_layer_pass(layer_weights, *arguments):  # gln.network.LayerPass, by member
            layer_pass(layer_weights, members, *arguments)

        return network_pass(xp, members_layer_pass, weights, contexts, base_logits, targets,
                            rates, **options)

    return family_network_pass


def family_moments_fold_for(xp: ModuleType, use_kernels: bool = True) -> Callable[..., Any]:
    """``f(members, x64, shifts, member_counts, totals, totals_sq) -> (counts, sums,
    sums_sq)``: ``gln.scaling.family_moments_before_each_row`` on ``xp``, with the same bits.
    ``members`` and ``member_counts`` (M,) are host arrays, the rows grouped by member.

    On the GPU it is the sequential kernel even without ``use_kernels``, for the reason
    ``moments_fold_for`` gives."""
    if xp.__name__ == "cupy":
        from gln.kernels.cuda import cuda_family_moments  # noqa: PLC0415 - needs CuPy

        return cuda_family_moments
    if use_kernels and xp is np:
        from gln.kernels.cpu_family import cpu_family_moments  # noqa: PLC0415 - loads Numba

        return cpu_family_moments
    return functools.partial(family_moments_before_each_row, xp)
