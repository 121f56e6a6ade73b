"""Learning-rate schedules: the step size for the t-th example (t counts from 1).

A schedule is evaluated for a whole chunk of example indices at once, so the per-example
loop never calls back into Python. The paper's MNIST run used ``min(100 / t, 0.01)``, which
is ``InverseTime(scale=100, cap=0.01)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gln import checks

# The largest constant rate or cap: the neurons compute in float32, where a larger step times
# a logit could overflow (and an infinite step times a zero logit is NaN).
MAX_RATE = 1e6


@dataclass(frozen=True)
class Constant:
    """The same step size for every example."""

    rate: float

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return np.full(t.shape, self.rate, dtype=np.float64)

    def to_config(self) -> float:
        """The config value that rebuilds this schedule: the rate itself."""
        return self.rate


@dataclass(frozen=True)
class InverseTime:
    """``min(scale / t, cap)``: the paper's 1/t decay, capped early on."""

    scale: float
    cap: float

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return np.minimum(self.scale / t.astype(np.float64), self.cap)

    def to_config(self) -> dict[str, Any]:
        """The config value that rebuilds this schedule."""
        return {"schedule": "inverse_time", "scale": self.scale, "cap": self.cap}


@dataclass(frozen=True)
class PerExample:
    """Wraps a user callable ``f(t) -> float`` (not serialisable: ``to_bytes`` refuses it)."""

    function: Callable[[int], float]

    def __call__(self, t: np.ndarray) -> np.ndarray:
        """The rates for the example indices ``t``; ``ValueError`` naming the first that is
        not a number in (0, MAX_RATE] (a NaN or negative rate would spoil every weight)."""
        rates = np.array([self._rate(int(i)) for i in t], dtype=np.float64)
        valid = (rates > 0) & (rates <= MAX_RATE)
        if not valid.all():
            first = int(np.argmin(valid))
            raise ValueError(f"learning_rate({int(t[first])}) must be a number in "
                             f"(0, {MAX_RATE:g}], got {rates[first]!r}")
        return rates

    def _rate(self, t: int) -> float:
        """The callable's rate for example ``t``, as a float (``ValueError`` naming it if the
        callable returns something else, an array say)."""
        value = self.function(t)
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"learning_rate({t}) must return a number, got "
                             f"{type(value).__name__}: {error}") from None

    def to_config(self) -> None:
        """None: a callable cannot be written into a config (nor a snapshot)."""
        return None


@dataclass(frozen=True)
class Evaluated:
    """The rates of examples ``first``, ``first + 1``, ... computed beforehand: a user's
    callable is called once per example, and checked before a call learns anything."""

    first: int
    rates: np.ndarray

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return self.rates[t - self.first]

    def to_config(self) -> None:
        """None: rates computed from a callable cannot be written into a config."""
        return None


Schedule = Constant | InverseTime | PerExample | Evaluated

# GLN's default rate, min(10 / t, 0.1): large steps while a neuron's weights are far off, then
# the 1/t decay online convex optimisation wants. The constant 0.01 before it learned small
# tabular streams more slowly than a standardised online logistic regression
# (benchmarks/paper/uci.py; the measurement is in the commit that chose it). Frozen, so the
# shared default cannot be changed through a model.
DEFAULT_LEARNING_RATE = InverseTime(scale=10.0, cap=0.1)


def make_schedule(spec: Any) -> Schedule:
    """Build a schedule from what a user may pass as ``learning_rate``.

    Accepted: a positive number; ``{"schedule": "inverse_time", "scale": s, "cap": c}``;
    a schedule object (``Constant`` and ``InverseTime`` checked as their configuration is); or
    a callable of the 1-based example index.
    """
    if isinstance(spec, PerExample):
        return spec
    if isinstance(spec, Constant | InverseTime):
        return make_schedule(spec.to_config())
    if isinstance(spec, bool | np.bool_):
        raise ValueError(f"learning_rate must be a positive number, got {spec!r}")
    if checks.is_number(spec):
        try:
            rate = float(spec)
        except OverflowError:
            rate = math.inf
        if not 0 < rate <= MAX_RATE:
            raise ValueError(f"learning_rate must be a number in (0, {MAX_RATE:g}], got {spec!r}")
        return Constant(rate)
    if isinstance(spec, dict):
        kind = spec.get("schedule")
        if kind == "inverse_time":
            unknown = set(spec) - {"schedule", "scale", "cap"}
            if unknown:
                raise ValueError(f"unknown learning_rate keys {sorted(unknown)}")
            schedule = InverseTime(
                checks.number_in("learning_rate.scale", spec.get("scale"), 0.0, math.inf),
                checks.number_in("learning_rate.cap", spec.get("cap"), 0.0, math.inf),
            )
            if schedule.cap > MAX_RATE:
                raise ValueError(f"learning_rate.cap must be <= {MAX_RATE:g}, got {schedule.cap:g}")
            return schedule
        raise ValueError(
            "learning_rate dict must be {'schedule': 'inverse_time', 'scale': s, 'cap': c}, "
            f"got {spec!r}"
        )
    if callable(spec):
        return PerExample(spec)
    raise ValueError(f"learning_rate must be a number, a schedule dict or a callable: {spec!r}")
