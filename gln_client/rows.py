"""Rows as the caller has them, turned into the arrays the service takes.

Rows come as a NumPy array ``(n, num_features)`` (or one row ``(num_features,)``), a list of
lists, a pandas DataFrame, a list of dicts or one dict. A dict or a DataFrame names its
features, so it needs the model's feature order (``feature_names``); its other keys or columns
(a label, an id) are left out, and a missing one is an error naming it, so a renamed column
cannot shift the features silently. pandas is never imported here: a DataFrame can only
reach this module from a program that imported pandas itself.

>>> as_rows([{"b": 2.0, "a": 1.0, "note": "x"}], ["a", "b"])
array([[1., 2.]])
>>> as_rows({"a": 1.0}, ["a", "b"])
Traceback (most recent call last):
...
ValueError: row 0 has no feature 'b' (the features are a, b)
>>> as_rows([1, 2, 3], None).shape
(1, 3)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

NAMES_NEEDED = ("dict rows and DataFrames need the model's feature order: give "
                "feature_names=[...] to this call or to the client")


def named(rows: Any) -> bool:
    """Whether ``rows`` name their features (dicts, a DataFrame), so need ``feature_names``."""
    return (isinstance(rows, Mapping) or _is_dataframe(rows)
            or (isinstance(rows, list | tuple) and bool(rows) and isinstance(rows[0], Mapping)))


def as_rows(rows: Any, feature_names: Sequence[str] | None) -> np.ndarray:
    """``rows`` as a 2-D array of numbers, one row per example; ``ValueError`` if they are not.

    Numbers keep their dtype (the service reads every value as the float32 it rounds to), so a
    ``uint8`` image travels as bytes.
    """
    if named(rows):
        if feature_names is None:
            raise ValueError(NAMES_NEEDED)
        rows = _by_name(rows, list(feature_names))
    array = np.asarray(rows)
    if array.ndim == 1:
        array = array.reshape(1, -1)  # one row
    if array.ndim != 2 or not array.size:
        raise ValueError(f"rows: a 2-D array of at least one row, got shape {array.shape}")
    if array.dtype.kind not in "biuf":
        raise ValueError(f"rows must hold numbers, got dtype {array.dtype}")
    return array


def as_labels(labels: Any) -> np.ndarray:
    """``labels`` (a list, an array, a pandas Series, or one label) as a 1-D array: class
    indices, or class names for a model with ``class_names``."""
    array = np.asarray(labels)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1 or array.dtype.kind not in "biufU":
        raise ValueError(f"labels: one class index or name per row, got shape {array.shape} "
                         f"of {array.dtype}")
    return array


def as_ids(ids: Any) -> list[str]:
    """``ids`` (one or many; anything that prints as an id, such as an int) as strings."""
    if isinstance(ids, str | int):
        return [str(ids)]
    return [str(i) for i in (ids.tolist() if isinstance(ids, np.ndarray) else ids)]


def _is_dataframe(rows: Any) -> bool:
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(rows, pandas.DataFrame)


def _by_name(rows: Any, names: list[str]) -> Any:
    if _is_dataframe(rows):
        missing = [n for n in names if n not in rows.columns]
        if missing:
            raise ValueError(f"the DataFrame has no column {', '.join(map(repr, missing))} "
                             f"(the features are {', '.join(names)})")
        return rows[names].to_numpy()
    dicts = [rows] if isinstance(rows, Mapping) else rows
    table = []
    for index, row in enumerate(dicts):
        try:
            table.append([row[name] for name in names])
        except KeyError as exc:
            raise ValueError(f"row {index} has no feature {exc.args[0]!r} "
                             f"(the features are {', '.join(names)})") from None
    return table
