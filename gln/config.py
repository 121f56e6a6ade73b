"""The model's configuration: the constructor's arguments, checked once and kept as given.

The arguments are described on ``gln.model.GLN``. ``Config.as_dict`` is what ``GLN.config``
returns and what a snapshot's header keeps (``gln.serialize``): ``GLN(**model.config)``
rebuilds a model from it. What the configuration chooses for the model's device is
``gln.pipeline``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gln import checks
from gln.scaling import INPUT_SCALINGS, SIDE_INFOS
from gln.schedules import make_schedule

# The neurons compute in float32: below 2**-24, 1 - pred_clip rounds to 1 and a saturated
# prediction's logit is infinite (then NaN). A weight bound of 1e6 (and learning rates of at
# most gln.schedules.MAX_RATE) keeps every mixed logit and update far inside float32.
MIN_PRED_CLIP = 2.0**-24
MAX_WEIGHT_CLIP = 1e6


class Config:
    """The constructor's arguments, each checked (``ValueError`` naming it and what it may
    be) and kept as given, with what the model derives from them once: its learning-rate
    schedule and the bias input's logit. Every argument is a keyword; the defaults are
    ``GLN``'s."""

    def __init__(
        self,
        *,
        num_features: int,
        num_classes: int,
        layer_sizes: Sequence[int],
        context_dim: int,
        learning_rate: Any,
        pred_clip: float,
        weight_clip: float,
        bias: float,
        offset_scale: float,
        input_scaling: str,
        min_std: float,
        side_info: str,
        side_info_size: int,
        side_info_blur: float,
        image_shape: Sequence[int] | None,
        gating_window: int,
        seed: int,
        feature_names: Sequence[str] | None,
        class_names: Sequence[str] | None,
        device: str,
        use_kernels: bool,
    ) -> None:
        """Check the constructor's arguments, in their order, and keep them."""
        self.num_features = checks.positive_int("num_features", num_features)
        self.num_classes = checks.num_classes(num_classes)
        self.layer_sizes = checks.layer_sizes(layer_sizes)
        self.context_dim = checks.context_dim(context_dim)
        self.schedule = make_schedule(learning_rate)
        self.learning_rate = learning_rate
        self.pred_clip = checks.number_in("pred_clip", pred_clip, 0.0, 0.5)
        if self.pred_clip < MIN_PRED_CLIP:
            raise ValueError(
                f"pred_clip must be >= 2**-24 (about 6e-8), got {pred_clip}: below it 1 - eps "
                "rounds to 1 in float32, and a saturated neuron's logit is infinite"
            )
        self.weight_clip = checks.number_in("weight_clip", weight_clip, 0.0, MAX_WEIGHT_CLIP)
        self.bias = checks.number_in("bias", bias, 0.0, 1.0)
        if not self.pred_clip <= self.bias <= 1.0 - self.pred_clip:
            raise ValueError(
                f"bias must be in [pred_clip, 1 - pred_clip] = [{self.pred_clip:g}, "
                f"{1.0 - self.pred_clip:g}], got {self.bias:g}: the bias input is a clipped "
                "probability too (the default, sigmoid(1) = 0.731, needs pred_clip <= 0.268)"
            )
        if self.bias == 0.5:
            raise ValueError("bias must not be 0.5 (its logit would be 0: no bias at all)")
        # The bias input of every layer, logit(beta) in float32; taken by every call.
        self.bias_logit = float(np.float32(math.log(self.bias / (1.0 - self.bias))))
        self.offset_scale = checks.number_in("offset_scale", offset_scale, 0.0, math.inf,
                                             closed=True)
        if input_scaling not in INPUT_SCALINGS:
            raise ValueError(
                f"input_scaling must be one of {INPUT_SCALINGS}, got {input_scaling!r}"
            )
        self.input_scaling = input_scaling
        self.min_std = checks.number_in("min_std", min_std, 0.0, math.inf)
        if side_info not in SIDE_INFOS:
            raise ValueError(f"side_info must be one of {SIDE_INFOS}, got {side_info!r}")
        self.side_info = side_info
        self.side_info_size = checks.integer("side_info_size", side_info_size)
        if (side_info == "given") != (self.side_info_size > 0) or self.side_info_size < 0:
            raise ValueError(
                f"side_info_size must be >= 1 with side_info='given' (the width of the side "
                f"information given with each row) and 0 otherwise, got {side_info_size} with "
                f"side_info={side_info!r}"
            )
        self.side_info_blur = checks.number_in("side_info_blur", side_info_blur, 0.0, 100.0,
                                               closed=True)
        self.image_shape = checks.image_shape(image_shape, self.gating_features)
        if self.side_info_blur > 0 and (side_info != "per_row" or self.image_shape is None):
            raise ValueError("side_info_blur needs side_info='per_row' and an image_shape")
        self.gating_window = checks.integer("gating_window", gating_window)
        if self.gating_window < 0:
            raise ValueError(f"gating_window must be >= 0, got {gating_window}")
        if self.gating_window:
            if self.image_shape is None:
                raise ValueError("gating_window needs an image_shape")
            if not 1 <= self.gating_window <= min(self.image_shape):
                raise ValueError(
                    f"gating_window must be 0 or 1..{min(self.image_shape)} (the image's "
                    f"shorter side), got {gating_window}"
                )
        self.seed = checks.integer("seed", seed)
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.feature_names = checks.names("feature_names", feature_names, self.num_features)
        self.class_names = checks.names("class_names", class_names, self.num_classes)
        self.device = device
        self.use_kernels = bool(use_kernels)

    @property
    def gating_features(self) -> int:
        """The width of what the halfspace gating sees: the side information given with each
        row, else the rows themselves."""
        return self.side_info_size or self.num_features

    @property
    def num_glns(self) -> int:
        """One GLN for a binary problem, one per class otherwise."""
        return 1 if self.num_classes == 2 else self.num_classes

    def as_dict(self) -> dict[str, Any]:
        """The constructor arguments, JSON-serialisable; ``GLN(**config.as_dict())`` rebuilds
        the model (without ``use_kernels``, the host's choice). Names are there only when
        given, so a model without them has the header it had before names existed."""
        rate = self.schedule.to_config()
        if rate is None:
            raise ValueError("a callable learning_rate cannot be serialised; use a number or dict")
        return {
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "layer_sizes": list(self.layer_sizes),
            "context_dim": self.context_dim,
            "learning_rate": rate,
            "pred_clip": self.pred_clip,
            "weight_clip": self.weight_clip,
            "bias": self.bias,
            "offset_scale": self.offset_scale,
            "input_scaling": self.input_scaling,
            "min_std": self.min_std,
            "side_info": self.side_info,
            **({"side_info_size": self.side_info_size} if self.side_info_size else {}),
            "side_info_blur": self.side_info_blur,
            "image_shape": None if self.image_shape is None else list(self.image_shape),
            "gating_window": self.gating_window,
            "seed": self.seed,
            **({} if self.feature_names is None else {"feature_names": list(self.feature_names)}),
            **({} if self.class_names is None else {"class_names": list(self.class_names)}),
            "device": self.device,
        }

    def checked_rows(self, X: Any, *, strict: bool = False) -> np.ndarray:
        """``X`` as float32 (n, num_features), rows by name where the model has names;
        ``ValueError`` naming what is wrong (``GLN.check_input`` says what ``strict`` adds)."""
        unit = strict and self.input_scaling in ("unit", "unit_fixed")
        return checks.checked_features(checks.rows_by_name(X, self.feature_names),
                                       self.num_features, self.input_scaling if unit else None)

    def checked_labels(self, y: Any, num_rows: int | None = None) -> np.ndarray:
        """``y`` as class indices int64 (n,), by name where the model has class names."""
        return checks.checked_labels(checks.labels_by_name(y, self.class_names),
                                     self.num_classes, num_rows)

    def class_of(self, probabilities: np.ndarray) -> np.ndarray:
        """The most probable class of each row: its name where the model has class names."""
        best = np.argmax(probabilities, axis=1)
        return best if self.class_names is None else np.asarray(self.class_names)[best]

    def for_estimate(self, device: str) -> dict[str, Any]:
        """The size-determining arguments, as ``gln.state.estimate_nbytes`` takes them, for a
        model on ``device`` (the one resolved)."""
        return {"num_features": self.num_features, "num_classes": self.num_classes,
                "device": device,
                "layer_sizes": self.layer_sizes, "context_dim": self.context_dim,
                "side_info_blur": self.side_info_blur,
                "image_shape": None if self.image_shape is None else list(self.image_shape),
                **({"side_info_size": self.side_info_size} if self.side_info_size else {})}
