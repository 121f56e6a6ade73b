"""The model's state: the arrays a GLN holds, how they are laid out, how they start, and
their size.

The state is the hyperplanes (``normals``, ``offsets``), the running input statistics
(``moments``, ``moments_shift``) and each layer's weights, plus the two counters
``moments.count`` and ``examples_seen``; everything else a model holds follows from its
configuration (``gln.config``). ``_state_layout`` names every array with its shape and dtype
in one order: the order of a snapshot's payload (``gln.serialize``) and of the sizes that
``estimate_nbytes`` adds up before a model is built.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from gln import checks
from gln.gating import restrict_to_windows, sample_halfspaces
from gln.scaling import RunningMoments


def _state_layout(
    num_features: int, num_glns: int, layer_sizes: Sequence[int], context_dim: int
) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array of a model's state, by name, in snapshot order: the
    hyperplanes (``context_dim`` per neuron, GLN by GLN, layer by layer), the running input
    statistics, and each layer's weights (G, K, 2^m, inputs with the bias)."""
    planes = num_glns * sum(layer_sizes) * context_dim
    inputs = [1 + k for k in (num_features, *layer_sizes[:-1])]
    float32, float64 = np.dtype(np.float32), np.dtype(np.float64)
    return {
        "normals": ((planes, num_features), float32),
        "offsets": ((planes,), float32),
        "moments_total": ((num_features,), float64),
        "moments_total_sq": ((num_features,), float64),
        "moments_shift": ((num_features,), float64),
        **{f"weights_{i}": ((num_glns, k, 2**context_dim, n), float32)
           for i, (k, n) in enumerate(zip(layer_sizes, inputs, strict=True))},
    }


def _blur_matrices_nbytes(image_shape: tuple[int, int] | None, side_info_blur: float) -> int:
    """Bytes of the two float64 blur matrices (height^2 and width^2) a blurring model holds:
    small for images, but a long thin "image" (1 x 60,000) would need 29 GB."""
    if image_shape is None or side_info_blur <= 0:
        return 0
    return 8 * sum(k * k for k in image_shape)


class StateMixin:
    """The state part of ``gln.model.GLN``: its arrays made (the paper's initial state), read
    and replaced (for snapshots), and counted in bytes, built or not. Reads the configuration
    that ``gln.config`` checked and keeps (``num_features``, ``layer_sizes``, ``_xp`` ...).
    """

    @property
    def num_glns(self) -> int:
        """One GLN for a binary problem, one per class otherwise."""
        return 1 if self.num_classes == 2 else self.num_classes

    def _init_state(self) -> None:
        """The paper's initial state: sampled hyperplanes, every weight 1/K, no statistics."""
        xp = self._xp
        layout = self._state_layout()
        rng = np.random.default_rng(self.seed)
        planes = layout["normals"][0][0]
        normals, offsets = sample_halfspaces(rng, planes, self.num_features, self.offset_scale)
        if self.gating_window:
            normals = restrict_to_windows(rng, normals, self.image_shape, self.gating_window)
        arrays = {"normals": xp.asarray(normals), "offsets": xp.asarray(offsets)}
        for name, (shape, dtype) in layout.items():
            if name.startswith("weights_"):  # paper: w_ikc = 1 / K_{i-1}, a geometric average
                arrays[name] = xp.full(shape, 1.0 / shape[-1], dtype=dtype)
            elif name.startswith("moments_"):
                arrays[name] = xp.zeros(shape, dtype=dtype)
        self._set_state(arrays, moments_count=0, examples_seen=0)

    def _state_layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of every array of the model's state, by name, in snapshot order."""
        return _state_layout(self.num_features, self.num_glns, self.layer_sizes, self.context_dim)

    def _state_arrays(self) -> dict[str, Any]:
        """Every array of the model's state, named and ordered as ``_state_layout``."""
        return {
            "normals": self.normals,
            "offsets": self.offsets,
            "moments_total": self.moments.total,
            "moments_total_sq": self.moments.total_sq,
            "moments_shift": self.moments_shift,
            **{f"weights_{i}": w for i, w in enumerate(self.weights)},
        }

    def _set_state(self, arrays: dict[str, Any], moments_count: int, examples_seen: int) -> None:
        """Take ``arrays`` (laid out as ``_state_layout`` says, on the model's device) and the
        two counters as the model's state: the inverse of ``_state_arrays``."""
        self.normals, self.offsets = arrays["normals"], arrays["offsets"]
        self.moments = RunningMoments(
            moments_count, arrays["moments_total"], arrays["moments_total_sq"]
        )
        self.moments_shift = arrays["moments_shift"]  # what the sums are of: x - shift
        self.weights = [arrays[f"weights_{i}"] for i in range(len(self.layer_sizes))]
        self.examples_seen = examples_seen

    @property
    def nbytes(self) -> int:
        """Bytes held by the model's arrays (weights, hyperplanes, statistics) and its copy of
        the normals, once a call has made it: 16-bit on the CPU (a short call), int8 slices on
        the GPU (a long chunk)."""
        arrays = [*self.weights, self.normals, self.offsets, self.moments.total,
                  self.moments.total_sq, self.moments_shift]
        arrays += self._blur or ()
        copies = getattr(self._layer_contexts, "nbytes", 0)  # the kernels' contexts have one
        return int(sum(a.nbytes for a in arrays)) + copies

    def config_for_estimate(self) -> dict[str, Any]:
        """The size-determining arguments, as ``estimate_nbytes`` takes them."""
        return {"num_features": self.num_features, "num_classes": self.num_classes,
                "device": self._device,
                "layer_sizes": self.layer_sizes, "context_dim": self.context_dim,
                "side_info_blur": self.side_info_blur,
                "image_shape": None if self.image_shape is None else list(self.image_shape)}

    @staticmethod
    def estimate_nbytes(config: dict[str, Any]) -> int:
        """Bytes a model with this configuration may hold, computed without building it.

        Lets a host refuse a configuration before allocating it. Needs ``num_features`` and
        optionally ``num_classes``, ``layer_sizes``, ``context_dim``, ``side_info_blur`` and
        ``image_shape`` (constructor defaults otherwise); raises the constructor's
        ``ValueError`` for any of them it would refuse.
        Counts the copy of the normals that a model on ``device`` (the constructor's,
        default "cpu") makes: the 16-bit one of a CPU model's first call of a few rows
        (``gln.kernels.cpu_int16_gating``), the int8 slices of a GPU model's first long chunk
        (``gln.kernels.int8_gating``); the larger of the two for "auto" or an unknown device.
        """
        features = checks.positive_int("num_features", config.get("num_features"))
        classes = checks.num_classes(config.get("num_classes", 2))
        sizes = checks.layer_sizes(config.get("layer_sizes", (32, 32, 1)))
        context_dim = checks.context_dim(config.get("context_dim", 4))
        layout = _state_layout(features, 1 if classes == 2 else classes, sizes, context_dim)
        state = sum(dtype.itemsize * math.prod(shape) for shape, dtype in layout.values())
        planes, dim = layout["normals"][0]
        # gln.kernels.cpu_int16_gating.Int16Normals: int16 values; per plane a float32 scale
        # and two float64 norms (the module is not imported here: it loads Numba).
        int16_copy = 2 * planes * features + (4 + 8 + 8) * planes
        # gln.kernels.int8_gating.Int8Planes: three int8 slices of a row padded to 16 columns;
        # per plane a float64 scale, three slices' norms, an L1 norm and a length; 64 warps'
        # six partial maxima (the module is not imported here: it is the GPU's).
        int8_cut = planes * (3 * -(-dim // 16) * 16 + 8 * 6) + 64 * 6 * 8
        blur = checks.number_in("side_info_blur", config.get("side_info_blur", 0.0), 0.0,
                                100.0, closed=True)
        image_shape = checks.image_shape(config.get("image_shape"), features)
        copy = {"cpu": int16_copy, "cuda": int8_cut}.get(config.get("device", "cpu"),
                                                          max(int16_copy, int8_cut))
        return state + copy + _blur_matrices_nbytes(image_shape, blur)

    @contextlib.contextmanager
    def _memory_as_value_error(self) -> Iterator[None]:
        """Allocating the model's state: running out of memory is a ``ValueError`` that says
        how much the model needs, as for any configuration the host cannot hold."""
        try:
            yield
        except MemoryError:
            raise ValueError(
                f"the model needs about {self.estimate_nbytes(self.config_for_estimate())} bytes, "
                "more memory than is available"
            ) from None
