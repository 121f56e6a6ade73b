"""A chunk's way through the network on the model's device: its rows scaled to side
information and base predictions (``gln.scaling``), their halfspace contexts (``gln.gating``),
then every layer over the chunk (``gln.network``, Algorithm 1).

Each step runs the kernels chosen once for the device (``gln.kernels``: compiled CPU code, or
CUDA), or the plain array code where ``use_kernels`` is off; both give the same bytes. Nothing
here moves rows between host and device: ``gln.staging`` hands a chunk over already on the
device, and the work reads and writes device arrays only.
"""

from __future__ import annotations

from typing import Any

from gln.backend import array_module, resolve_device
from gln.config import Config
from gln.kernels import contexts_for, fused_scaling_for, moments_fold_for, network_pass_for
from gln.scaling import RunningMoments, gaussian_blur_matrix, scale_inputs
from gln.state import State


class Pipeline:
    """The model's device (``device``: "cpu" or "cuda", resolved from the configuration's),
    its array module ``xp`` and the code paths chosen for it, and a chunk's work on it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.xp = array_module(self.device)
        use_kernels = config.use_kernels
        self.layer_contexts = contexts_for(self.xp, use_kernels)
        self.fused_scaling = fused_scaling_for(self.xp, use_kernels)
        self.moments_fold = moments_fold_for(self.xp, use_kernels)
        self.network_pass = network_pass_for(self.xp, use_kernels)
        # The GPU's scaling and moments kernels read a long chunk's float32 rows as they came
        # (as the float64 values they equal); the array code takes them widened, and so does
        # "unit_fixed", which scales in array code (float32 rows would be scaled in float32).
        self.scales_float32_rows = (self.device == "cuda" and use_kernels
                                    and config.input_scaling != "unit_fixed")
        self.blur = None
        if config.side_info_blur > 0:
            self.blur = tuple(
                self.xp.asarray(gaussian_blur_matrix(k, config.side_info_blur))
                for k in config.image_shape
            )

    @property
    def nbytes(self) -> int:
        """Bytes of what the device's code paths hold beside the state: the blur matrices, and
        the kernels' copy of the normals once a call has made it (16-bit on the CPU, int8
        slices on the GPU)."""
        blur = sum(b.nbytes for b in self.blur or ())
        return int(blur) + getattr(self.layer_contexts, "nbytes", 0)

    def outputs(
        self, state: State, rows: Any, count: Any, rates: Any, targets: Any, learning: bool,
        side_info: Any = None,
    ) -> tuple[Any, RunningMoments]:
        """A chunk through the network: outputs (n, G) and the moments after the chunk.

        ``rows`` (n, d) as ``scale`` takes them, ``count`` as ``scale`` takes it, ``rates``
        (n,) and one-vs-all ``targets`` (n, G) float32, read only when ``learning``, which
        updates the weights (and, on the GPU, the moments' totals) in place. ``side_info``
        (n, s) float32 on the device: the gating's input where the configuration's side
        information is ``"given"``.
        """
        config = self.config
        z, base_logits, after = self.scale(state, rows, count, learning, side_info)
        contexts = self.contexts(state, z)
        outputs = self.network_pass(
            state.weights, contexts, base_logits, targets, rates, bias_logit=config.bias_logit,
            pred_clip=config.pred_clip, weight_clip=config.weight_clip, learn=learning,
        )
        return outputs, after

    def scale(
        self, state: State, rows: Any, count: Any, learning: bool, side_info: Any = None
    ) -> tuple[Any, Any, RunningMoments]:
        """Side information z (``side_info`` where given), base logits, and the moments after
        the chunk (``rows``: float64, or float32 where the kernels read them so; ``count``:
        ``state.moments.count`` as a (1, 1) float64 array on the device)."""
        config, m, shift = self.config, state.moments, state.moments_shift
        if learning:
            counts, sums, sums_sq, after = self.moments_fold(m, rows, count, shift)
        else:
            counts, sums, sums_sq, after = count, m.total[None, :], m.total_sq[None, :], m
        z, base_logits = scale_inputs(
            self.xp, rows, counts, sums, sums_sq,
            mode=config.input_scaling, pred_clip=config.pred_clip, min_std=config.min_std,
            side_info=config.side_info, blur=self.blur, fused=self.fused_scaling, shift=shift,
            given=side_info,
        )
        return z, base_logits, after

    def contexts(self, state: State, z: Any) -> list[Any]:
        """Each layer's (n, G, K_l) int32 context indices of side information ``z``."""
        config = self.config
        return self.layer_contexts(z, state.normals, state.offsets, config.context_dim,
                                   config.num_glns, config.layer_sizes)
