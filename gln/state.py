"""The model's state: the arrays a GLN learns, how they are laid out, how they start, and
their size.

The state is the hyperplanes (``normals``, ``offsets``), the running input statistics
(``moments``, ``moments_shift``) and each layer's weights, plus the two counters
``moments.count`` and ``examples_seen``; everything else a model holds follows from its
configuration (``gln.config``). ``state_layout`` names every array with its shape and dtype
in one order: the order of a snapshot's payload (``gln.serialize``) and of the sizes that
``estimate_nbytes`` adds up before a model is built.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gln import checks
from gln.gating import restrict_to_windows, sample_halfspaces
from gln.scaling import RunningMoments

# GLN's default network: one layer of 32 neurons of context dimension 3 and the output neuron.
# On small tabular streams (benchmarks/paper/uci.py --tune) it learned faster than the deeper
# (32, 32, 1) of context dimension 4, whose 16 weight vectors a neuron each saw a sixteenth of
# the rows (prequential log loss on training rows only, mean of 7 sets: 0.325 against 0.533).
DEFAULT_LAYER_SIZES = (32, 1)
DEFAULT_CONTEXT_DIM = 3

if TYPE_CHECKING:
    from gln.config import Config

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]


def state_layout(
    num_features: int, num_glns: int, layer_sizes: Sequence[int], context_dim: int,
    gating_features: int | None = None,
) -> Layout:
    """Shape and dtype of every array of a model's state, by name, in snapshot order: the
    hyperplanes (``context_dim`` per neuron, GLN by GLN, layer by layer, in the space of
    ``gating_features``: the side information given with each row, default the rows), the
    running input statistics, and each layer's weights (G, K, 2^m, inputs with the bias)."""
    planes = num_glns * sum(layer_sizes) * context_dim
    inputs = [1 + k for k in (num_features, *layer_sizes[:-1])]
    float32, float64 = np.dtype(np.float32), np.dtype(np.float64)
    return {
        "normals": ((planes, gating_features or num_features), float32),
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


def layout_of(config: Config) -> Layout:
    """``state_layout`` of a model of ``config``."""
    return state_layout(config.num_features, config.num_glns, config.layer_sizes,
                        config.context_dim, config.gating_features)


def initial_state(config: Config, xp: Any) -> State:
    """The paper's initial state on ``xp``'s device: sampled hyperplanes, every weight 1/K, no
    statistics."""
    layout = layout_of(config)
    rng = np.random.default_rng(config.seed)
    planes = layout["normals"][0][0]
    normals, offsets = sample_halfspaces(rng, planes, config.gating_features,
                                         config.offset_scale)
    if config.gating_window:
        normals = restrict_to_windows(rng, normals, config.image_shape, config.gating_window)
    arrays = {"normals": xp.asarray(normals), "offsets": xp.asarray(offsets)}
    for name, (shape, dtype) in layout.items():
        if name.startswith("weights_"):  # paper: w_ikc = 1 / K_{i-1}, a geometric average
            arrays[name] = xp.full(shape, 1.0 / shape[-1], dtype=dtype)
        elif name.startswith("moments_"):
            arrays[name] = xp.zeros(shape, dtype=dtype)
    return State(arrays, moments_count=0, examples_seen=0)


class State:
    """A model's arrays (on its device) and counters, taken from ``arrays`` laid out as
    ``state_layout`` says. Learning updates the weights in place, and replaces ``moments`` and
    ``examples_seen``."""

    def __init__(self, arrays: dict[str, Any], moments_count: int, examples_seen: int) -> None:
        self.normals, self.offsets = arrays["normals"], arrays["offsets"]
        self.moments = RunningMoments(
            moments_count, arrays["moments_total"], arrays["moments_total_sq"]
        )
        self.moments_shift = arrays["moments_shift"]  # what the sums are of: x - shift
        layers = sum(name.startswith("weights_") for name in arrays)
        self.weights = [arrays[f"weights_{i}"] for i in range(layers)]
        self.examples_seen = examples_seen

    def arrays(self) -> dict[str, Any]:
        """Every array, named and ordered as ``state_layout``: the inverse of the constructor."""
        return {
            "normals": self.normals,
            "offsets": self.offsets,
            "moments_total": self.moments.total,
            "moments_total_sq": self.moments.total_sq,
            "moments_shift": self.moments_shift,
            **{f"weights_{i}": w for i, w in enumerate(self.weights)},
        }

    @property
    def device_arrays(self) -> tuple[Any, ...]:
        """The arrays a chunk's work reads or updates in place: a captured graph holds their
        addresses, so it is captured again where any of them was replaced."""
        return (*self.weights, self.normals, self.offsets, self.moments.total,
                self.moments.total_sq, self.moments_shift)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays."""
        return int(sum(a.nbytes for a in self.device_arrays))


def estimate_nbytes(config: dict[str, Any]) -> int:
    """``GLN.estimate_nbytes``: the state's bytes, the copy of the normals the device's
    kernels make, and the blur matrices, of a configuration not built."""
    features = checks.positive_int("num_features", config.get("num_features"))
    classes = checks.num_classes(config.get("num_classes", 2))
    sizes = checks.layer_sizes(config.get("layer_sizes", DEFAULT_LAYER_SIZES))
    context_dim = checks.context_dim(config.get("context_dim", DEFAULT_CONTEXT_DIM))
    side_info_size = checks.integer("side_info_size", config.get("side_info_size", 0))
    gating = side_info_size if side_info_size > 0 else features
    layout = state_layout(features, 1 if classes == 2 else classes, sizes, context_dim, gating)
    state = sum(dtype.itemsize * math.prod(shape) for shape, dtype in layout.values())
    planes, dim = layout["normals"][0]
    # gln.kernels.cpu_int16_gating.Int16Normals: int16 values; per plane a float32 scale
    # and two float64 norms (the module is not imported here: it loads Numba).
    int16_copy = 2 * planes * dim + (4 + 8 + 8) * planes
    # gln.kernels.int8_gating.Int8Planes: three int8 slices of a row padded to 16 columns;
    # per plane a float64 scale, three slices' norms, an L1 norm and a length; 64 warps'
    # six partial maxima (the module is not imported here: it is the GPU's).
    int8_cut = planes * (3 * -(-dim // 16) * 16 + 8 * 6) + 64 * 6 * 8
    blur = checks.number_in("side_info_blur", config.get("side_info_blur", 0.0), 0.0,
                            100.0, closed=True)
    image_shape = checks.image_shape(config.get("image_shape"), gating)
    copy = {"cpu": int16_copy, "cuda": int8_cut}.get(config.get("device", "cpu"),
                                                      max(int16_copy, int8_cut))
    return state + copy + _blur_matrices_nbytes(image_shape, blur)


@contextlib.contextmanager
def allocating(config: Config, device: str) -> Iterator[None]:
    """Allocating a state for ``config`` on ``device``: running out of memory is a
    ``ValueError`` that says how much the model needs, as for any configuration the host
    cannot hold."""
    try:
        yield
    except MemoryError:
        raise ValueError(
            f"the model needs about {estimate_nbytes(config.for_estimate(device))} bytes, "
            "more memory than is available"
        ) from None
