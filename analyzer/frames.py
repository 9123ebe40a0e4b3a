"""Row access to DataFrames at C speed: what `itertuples` and `to_dict("records")` give, faster.

pandas 3 keeps text in Arrow arrays, and both `DataFrame.itertuples` and `to_dict("records")`
walk those one element at a time in Python (`ArrowExtensionArray.__iter__`, ~1 us a value):
on 10,000 jobs x 80 columns that was a second of the analyzer's run. `Series.tolist()` converts a
whole column in C with the same values (pandas' NA value for missing text, Python scalars for
numbers), so these build the same rows from whole columns.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pandas.core.dtypes.cast import maybe_box_native  # what to_dict applies to object columns


def columns(frame: pd.DataFrame) -> list[list[Any]]:
    """Each column as a Python list (the values iterating the column gives)."""
    return [frame.iloc[:, k].tolist() for k in range(frame.shape[1])]


def _plain(frame: pd.DataFrame) -> bool:
    """Every column numpy-backed or text: where `tolist` gives exactly what iteration gives (a
    masked integer column iterates as numpy scalars but lists as Python ints)."""
    return frame.shape[1] > 0 and all(isinstance(dtype, np.dtype | pd.StringDtype) for dtype in frame.dtypes)


def _tuples(frame: pd.DataFrame, boxed: bool = False) -> Iterator[tuple[Any, ...]]:
    values = columns(frame)
    if boxed:  # to_dict's numpy scalars in object columns as Python ones
        for k, dtype in enumerate(frame.dtypes):
            if dtype == np.dtype(object):
                values[k] = [maybe_box_native(v) for v in values[k]]
    return zip(*values, strict=True)


def rows(frame: pd.DataFrame, name: str = "Pandas") -> Iterator[Any]:
    """`frame.itertuples(index=False, name=name)`: one namedtuple per row, fields renamed as there."""
    if not _plain(frame):
        tuples: Iterator[Any] = frame.itertuples(index=False, name=name)
        return tuples
    row = namedtuple(name, [str(c) for c in frame.columns], rename=True)  # type: ignore[misc]
    return map(row._make, _tuples(frame))


def records(frame: pd.DataFrame) -> list[dict[Any, Any]]:
    """`frame.to_dict("records")`: one dict per row, keyed by column."""
    if not _plain(frame):
        dicts: list[dict[Any, Any]] = frame.to_dict("records")
        return dicts
    keys = list(frame.columns)
    return [dict(zip(keys, values, strict=True)) for values in _tuples(frame, boxed=True)]
