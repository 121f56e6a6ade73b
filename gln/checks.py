"""Checks of constructor arguments and of input batches, each error naming what is wrong.

A wrong argument raises ``ValueError`` naming the argument and what it may be; a bad batch
names the first bad value by its place (row and column, or label index), so that a caller
with thousands of rows can find it. Nothing here changes a model: the model checks a whole
batch before it learns any of it.

>>> positive_int("num_features", 0)
Traceback (most recent call last):
...
ValueError: num_features must be a positive int, got 0
>>> checked_features([[1.0, 2.0], [3.0]], num_features=2)
Traceback (most recent call last):
...
ValueError: each row must have 2 features, row 1 has 1
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gln.backend import is_device_array, to_numpy

# The smallest magnitude that rounds to infinity as a float32 (float32's largest value plus half
# its last step): every value below it rounds to a finite float32, 3.4028235e38 (as float32's
# largest value is printed) included.
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
# Dtypes every value of which is a float32 as it is: rows of them need no check of their values
# (none is NaN, infinite or beyond float32), and a GPU model's long prediction sends them in
# their own bytes, a quarter of float32's for pixels (``gln.kernels.uploads``).
EXACT_IN_FLOAT32 = frozenset(map(np.dtype, (np.bool_, np.int8, np.uint8, np.int16, np.uint16)))
# Far deeper than any use (the paper's networks have 2-4 layers), and small enough that a
# model's cost follows its size: a model of 200,000 one-neuron layers is 9 MB and takes
# seconds per row, a layer at a time.
MAX_LAYERS = 64


# ------------------------------------------------------------------ constructor arguments
def integer(name: str, value: Any) -> int:
    """``value`` as an int (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return int(value)


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def num_classes(value: Any) -> int:
    """The number of classes: an int >= 2 (a binary model has two)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {value!r}")
    return int(value)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number: a Python or NumPy int or float (a sweep's
    ``np.linspace`` values too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def number_in(name: str, value: Any, low: float, high: float, closed: bool = False) -> float:
    """``value`` as a finite float inside (low, high), or [low, high] when ``closed``."""
    if not is_number(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large a number") from None
    if not math.isfinite(value):  # a config holding it would not survive JSON either
        raise ValueError(f"{name} must be a finite number, got {value}")
    inside = low <= value <= high if closed else low < value < high
    if not inside:
        interval = f"[{low}, {high}]" if closed else f"({low}, {high})"
        raise ValueError(f"{name} must be in {interval}, got {value}")
    return value


def layer_sizes(sizes: Any) -> tuple[int, ...]:
    """Neurons per layer as a tuple of positive ints ending in the single output neuron."""
    sizes = _listed(sizes)
    if isinstance(sizes, str | bytes) or not isinstance(sizes, Sequence):
        raise ValueError(f"layer_sizes must be a sequence of ints, got {sizes!r}")
    if len(sizes) > MAX_LAYERS:
        raise ValueError(f"layer_sizes may hold at most {MAX_LAYERS} layers, got {len(sizes)}")
    checked = tuple(positive_int(f"layer_sizes[{i}]", k) for i, k in enumerate(sizes))
    if not checked or checked[-1] != 1:
        raise ValueError(f"layer_sizes must end in a single neuron (1), got {list(checked)}")
    return checked


def context_dim(m: Any) -> int:
    """m as a positive int small enough that a neuron's 2^m weight rows stay addressable."""
    checked = positive_int("context_dim", m)
    if checked > 16:
        raise ValueError(f"context_dim must be <= 16 (2^m weight rows), got {m}")
    return checked


def image_shape(shape: Any, num_features: int) -> tuple[int, int] | None:
    """``shape`` as (height, width) with height * width = num_features, or None."""
    if shape is None:
        return None
    shape = _listed(shape)
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        raise ValueError(f"image_shape must be (height, width), got {shape!r}")
    checked = tuple(positive_int(f"image_shape[{i}]", k) for i, k in enumerate(shape))
    if len(checked) != 2 or math.prod(checked) != num_features:
        raise ValueError(
            f"image_shape must be (height, width) with height * width = {num_features}, "
            f"got {shape!r}"
        )
    return checked  # type: ignore[return-value]


def _listed(values: Any) -> Any:
    """A 1-D NumPy array as the list of its values (which the sequence checks take), anything
    else as it is."""
    return values.tolist() if isinstance(values, np.ndarray) and values.ndim == 1 else values


MAX_NAME_CHARS = 200
# Names live in the snapshot's header (gln.serialize.MAX_HEADER_BYTES is 1 MiB): all of a
# model's names together stay well inside it.
MAX_NAMES_CHARS = 256 * 1024


def names(name: str, values: Any, count: int) -> tuple[str, ...] | None:
    """``values`` (None, or ``count`` distinct strings of 1 to 200 characters) as a tuple."""
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise ValueError(f"{name} must be a list of {count} strings, got {values!r}")
    listed = list(values)
    if len(listed) != count:
        raise ValueError(f"{name} must give one name per {name.removesuffix('_names')} "
                         f"({count}), got {len(listed)}")
    for index, value in enumerate(listed):
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_CHARS:
            raise ValueError(f"{name}[{index}] must be a string of 1 to {MAX_NAME_CHARS} "
                             f"characters, got {_shown(value)}")
    if len(set(listed)) != count:
        twice = next(value for value in listed if listed.count(value) > 1)
        raise ValueError(f"{name} must be distinct: {twice!r} appears twice")
    if sum(map(len, listed)) > MAX_NAMES_CHARS:
        raise ValueError(f"{name} must hold at most {MAX_NAMES_CHARS} characters in all")
    return tuple(listed)


# ------------------------------------------------------------------ input batches
def rows_by_name(X: Any, feature_names: tuple[str, ...] | None) -> Any:
    """Rows given by feature name (a list of mappings, or a DataFrame) as lists of values in
    the model's order of ``feature_names``; any other ``X`` as it is. ``ValueError`` naming the
    first row that lacks a name or holds one the model does not have, and for named rows sent
    to a model without ``feature_names``."""
    if _is_dataframe(X) and feature_names is not None:
        missing = [name for name in feature_names if name not in X.columns]
        unknown = [str(column) for column in X.columns if column not in set(feature_names)]
        if missing or unknown:
            raise ValueError(_names_message("the DataFrame", missing, unknown, feature_names))
        return X[list(feature_names)].to_numpy()
    if not (isinstance(X, list | tuple) and X and isinstance(X[0], Mapping)):
        return X
    if feature_names is None:
        raise ValueError("features: rows given by name need a model with feature_names; "
                         "send each row as a list of its values")
    rows = []
    wanted = len(feature_names)
    for index, row in enumerate(X):
        if not isinstance(row, Mapping):
            raise ValueError(f"features: row {index} is not given by name as row 0 is, got "
                             f"{_shown(row)}")
        try:
            rows.append([row[name] for name in feature_names])
        except KeyError:
            pass
        else:
            if len(row) == wanted:
                continue
        missing = [name for name in feature_names if name not in row]
        unknown = [str(key) for key in row if key not in set(feature_names)]
        raise ValueError(_names_message(f"row {index}", missing, unknown, feature_names))
    return rows


def _names_message(where: str, missing: list[str], unknown: list[str],
                   feature_names: tuple[str, ...]) -> str:
    """Which feature names ``where`` lacks and which it has that the model does not."""
    parts = []
    if missing:
        parts.append(f"lacks {', '.join(map(repr, missing[:5]))}"
                     + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    if unknown:
        parts.append(f"has unknown {', '.join(map(repr, unknown[:5]))}"
                     + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
    shown_names = ", ".join(map(repr, feature_names[:10]))
    more = f", ... ({len(feature_names)} in all)" if len(feature_names) > 10 else ""
    return f"features: {where} {' and '.join(parts)}; the model's features are {shown_names}{more}"


def labels_by_name(y: Any, class_names: tuple[str, ...] | None) -> Any:
    """Labels given as class names (strings) as class indices; others as they are. A list may
    mix names and indices. ``ValueError`` naming the first name the model does not have."""
    if class_names is None:
        return y
    if isinstance(y, np.ndarray):
        if y.dtype.kind not in "USO":
            return y
        y = y.tolist()
    elif _is_series(y):
        y = y.tolist()
    if not isinstance(y, list | tuple) or not any(isinstance(label, str) for label in y):
        return y
    index_of = {name: index for index, name in enumerate(class_names)}
    labels = []
    for position, label in enumerate(y):
        if isinstance(label, str):
            if label not in index_of:
                shown_names = ", ".join(map(repr, class_names[:10]))
                more = f", ... ({len(class_names)} in all)" if len(class_names) > 10 else ""
                raise ValueError(f"labels[{position}] is {_shown(label)}, which is no class "
                                 f"of this model: its classes are {shown_names}{more}")
            label = index_of[label]
        labels.append(label)
    return labels


def _is_dataframe(X: Any) -> bool:
    """Whether ``X`` is a pandas DataFrame (pandas is not imported here for it)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(X, pandas.DataFrame)


def _is_series(y: Any) -> bool:
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(y, pandas.Series)


def checked_features(X: Any, num_features: int, unit_interval: str | None = None) -> np.ndarray:
    """Features as C-contiguous float32 (n, num_features), or ``ValueError`` naming the first
    bad value: a wrong shape, a ragged row, NaN, inf or a magnitude beyond float32, or, with
    ``unit_interval`` (the input scaling that takes [0, 1] only, named in the error), a value
    outside [0, 1].

    Valid batches cost two reductions (min and max propagate NaN and show inf or a value
    beyond float32), not a mask per check: a 4,096-row batch is checked in a fraction of
    the time a model takes to learn it. Rows of a dtype in ``EXACT_IN_FLOAT32`` (pixels as
    uint8) need none of that, and go to float32 in one conversion, without a float64 copy.
    """
    if is_device_array(X):
        X = to_numpy(X)
    X = _unmasked(X, "features")
    try:
        values = np.asarray(X)
        if values.dtype.kind not in "biufO":  # strings, complex numbers, dates: not features
            raise TypeError(f"got dtype {values.dtype}")
        if values.dtype != np.float32 and values.dtype not in EXACT_IN_FLOAT32:
            values = values.astype(np.float64, copy=False)
    except OverflowError:  # a Python int beyond any float, from JSON
        raise ValueError(_huge_value_message(X)) from None
    except (TypeError, ValueError) as error:
        raise ValueError(
            _ragged_row_message(X, num_features)
            or f"features must be a 2-D array of real numbers: {error}"
        ) from None
    if values.ndim != 2:
        raise ValueError(f"features must be 2-D (rows, {num_features}), got {values.ndim}-D")
    if values.shape[1] != num_features:
        raise ValueError(f"each row must have {num_features} features, got {values.shape[1]}")
    if values.size and (unit_interval or values.dtype not in EXACT_IN_FLOAT32):
        low, high = float(values.min()), float(values.max())
        if not (-FLOAT32_OVERFLOW < low and high < FLOAT32_OVERFLOW):  # False for NaN too
            _raise_first_bad_feature(values.astype(np.float64))
        if unit_interval and not (0.0 <= low and high <= 1.0):
            row, col = np.argwhere((values < 0) | (values > 1))[0]
            raise ValueError(
                f"input_scaling={unit_interval!r} takes features in [0, 1]: row {row}, column "
                f"{col} is {values[row, col]} (scale them to [0, 1], or use "
                "input_scaling='standardize')")
    return np.ascontiguousarray(values, dtype=np.float32)


def checked_side_info(side_info: Any, side_info_size: int, num_rows: int) -> np.ndarray | None:
    """Side information given with ``num_rows`` rows as C-contiguous float32
    (num_rows, side_info_size), where a model takes it (``side_info_size`` > 0), else None;
    ``ValueError`` where it is missing, not wanted, or has a bad value (as ``checked_features``
    says, prefixed ``side_info:``)."""
    if not side_info_size:
        if side_info is not None:
            raise ValueError("side_info is given, but the model makes its own from the rows "
                             "(configure side_info='given' and side_info_size to give it)")
        return None
    if side_info is None:
        raise ValueError(f"the model's gating needs side_info, {side_info_size} values per row "
                         "(side_info='given')")
    try:
        values = checked_features(side_info, side_info_size)
    except ValueError as error:
        raise ValueError(f"side_info: {error}") from None
    if len(values) != num_rows:
        raise ValueError(f"side_info must have one row per row of X ({num_rows}), "
                         f"got {len(values)}")
    return values


def checked_labels(y: Any, num_classes: int, num_rows: int | None = None) -> np.ndarray:
    """Labels as int64 (n,), each a class index in [0, num_classes); ``num_rows``: how many
    there must be. ``ValueError`` names the first label (by its index) that is not one."""
    try:
        labels = np.asarray(to_numpy(y) if is_device_array(y) else _unmasked(y, "labels"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"labels must be a 1-D array of class indices: {error}") from None
    if labels.ndim != 1 or (num_rows is not None and labels.shape[0] != num_rows):
        one_per_row = "" if num_rows is None else f" with one label per row ({num_rows})"
        raise ValueError(f"labels must be 1-D{one_per_row}, got shape {labels.shape}")
    if labels.dtype.kind == "O":  # Python ints beyond int64, or other objects: name the first
        labels = np.asarray([_class_index(label, num_classes, index)
                             for index, label in enumerate(labels.tolist())], dtype=np.int64)
    if labels.dtype.kind in "US":
        raise ValueError(_name_without_classes(y, labels))
    if labels.dtype.kind not in "biuf":
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.dtype.kind in "iu" and (
        labels.size == 0 or (labels.min() >= 0 and labels.max() < num_classes)
    ):
        return labels.astype(np.int64, copy=False)  # the common case, checked cheaply
    as_float = labels.astype(np.float64)
    valid = np.isfinite(as_float) & (as_float == np.round(as_float))
    valid &= (as_float >= 0) & (as_float < num_classes)
    if not valid.all():
        index = int(np.argmin(valid))
        raise ValueError(
            f"labels must be class indices in [0, {num_classes}); "
            f"labels[{index}] is {labels[index].item()!r}"
        )
    return as_float.astype(np.int64)


def _name_without_classes(y: Any, labels: np.ndarray) -> str:
    """The error for labels by name sent to a model without class names, naming the first
    (NumPy makes every label of a list a string when one is: the list says which was)."""
    listed = y if isinstance(y, list | tuple) else labels.tolist()
    at = next((i for i, label in enumerate(listed) if isinstance(label, str | bytes)), 0)
    return (f"labels[{at}] is {_shown(listed[at])}: labels by name need a model with "
            "class_names (this one takes class indices)")


def _unmasked(values: Any, what: str) -> Any:
    """``values`` without the mask of a NumPy masked array, or ``ValueError`` naming its first
    masked value: a model has no notion of a missing value, and a masked one's data (which
    NumPy's reductions would skip in the checks) is whatever the array holds there."""
    if not np.ma.isMaskedArray(values):
        return values
    masked = np.ma.getmaskarray(values)
    if masked.any():
        first = np.argwhere(masked)[0].tolist()
        place = f"row {first[0]}, column {first[1]}" if len(first) == 2 else f"{what}{first}"
        raise ValueError(f"{what} must not hold masked values: {place} is masked "
                         "(fill them first, e.g. with .filled())")
    return np.ma.getdata(values)


def _class_index(label: Any, num_classes: int, index: int) -> int:
    """``label`` (an element of an object array) as a class index, or ``ValueError`` naming it
    as the label checks do. A bool is class 0 or 1, as in a bool array."""
    if isinstance(label, bool | np.bool_):
        label = int(label)
    integral = isinstance(label, numbers.Integral) or (
        isinstance(label, numbers.Real) and float(label).is_integer())
    if not integral or not 0 <= label < num_classes:
        raise ValueError(
            f"labels must be class indices in [0, {num_classes}); labels[{index}] is "
            f"{_shown(label)}"
        )
    return int(label)


def _shown(value: Any) -> str:
    """``repr(value)``, but an integer too long to read by its number of digits."""
    if isinstance(value, int) and len(str(abs(value))) > 30:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def _huge_value_message(X: Any) -> str:
    """The error for rows holding a number too large for a float, naming its place when the
    rows are lists."""
    for row_index, row in enumerate(X if isinstance(X, list | tuple) else ()):
        for col, value in enumerate(row if isinstance(row, list | tuple) else ()):
            if isinstance(value, int) and abs(value) >= FLOAT32_OVERFLOW:
                return (f"features must fit in float32 (|x| <= 3.4e38): row {row_index}, "
                        f"column {col} is {_shown(value)}")
    return "features must fit in float32 (|x| <= 3.4e38): a value is too large for a float"


def _ragged_row_message(X: Any, num_features: int) -> str | None:
    """Name the first row of a list of rows that is not ``num_features`` long, if there is one
    (NumPy's own error for ragged rows names neither the row nor its length)."""
    if not isinstance(X, list | tuple):
        return None
    for index, row in enumerate(X):
        if isinstance(row, Mapping):
            return (f"row {index} is given by name (an object), row 0 as a list: send every "
                    "row the same way")
        if isinstance(row, list | tuple) and len(row) != num_features:
            return f"each row must have {num_features} features, row {index} has {len(row)}"
    return None


def _raise_first_bad_feature(X64: np.ndarray) -> None:
    """The ``ValueError`` for the first value that is not finite or does not fit in float32."""
    finite = np.isfinite(X64)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        raise ValueError(f"features must be finite: row {row}, column {col} is {X64[row, col]}")
    row, col = np.argwhere(np.abs(X64) >= FLOAT32_OVERFLOW)[0]
    raise ValueError(
        f"features must fit in float32 (|x| <= 3.4e38): row {row}, column {col} is "
        f"{X64[row, col]}"
    )
