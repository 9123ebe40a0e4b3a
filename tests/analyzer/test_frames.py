"""frames.rows / frames.records give what itertuples / to_dict("records") give, value and type."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer import frames

TEXT = st.one_of(st.none(), st.text(max_size=5))
NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**40), 2**40).map(float))


def column(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(values, max_size=8)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and (a is b or a == b)


def _frame(texts: list[str], numbers: list[float], mixed: list[object]) -> pd.DataFrame:
    n = min(len(texts), len(numbers), len(mixed))
    return pd.DataFrame(
        {
            "job_id": pd.Series(texts[:n], dtype="str"),
            "memory": pd.Series(numbers[:n], dtype="float64"),
            "gpus": pd.Series(range(n), dtype="int64"),
            "flag": pd.Series([i % 2 == 0 for i in range(n)], dtype="bool"),
            "mixed": pd.Series(mixed[:n], dtype="object"),
            "not an identifier": pd.Series(range(n), dtype="int64"),
        }
    )


@settings(max_examples=60, deadline=None)
@given(column(TEXT), column(NUMBER), column(st.one_of(TEXT, NUMBER)))
def test_rows_equal_itertuples_value_for_value(texts, numbers, mixed):
    frame = _frame(texts, numbers, mixed)
    expected, got = list(frame.itertuples(index=False)), list(frames.rows(frame))
    assert [r._fields for r in got] == [r._fields for r in expected]
    assert all(_same(a, b) for x, y in zip(expected, got, strict=True) for a, b in zip(x, y, strict=True))


@settings(max_examples=60, deadline=None)
@given(column(TEXT), column(NUMBER), column(st.one_of(TEXT, NUMBER)))
def test_records_equal_to_dict_value_for_value(texts, numbers, mixed):
    frame = _frame(texts, numbers, mixed)
    frame["numpy"] = pd.Series([np.float32(1.5)] * len(frame), dtype="object")  # boxed as to_dict does
    expected, got = frame.to_dict("records"), frames.records(frame)
    assert [list(r) for r in got] == [list(r) for r in expected]
    assert all(_same(x[k], y[k]) for x, y in zip(expected, got, strict=True) for k in x)


def test_a_masked_column_falls_back_to_pandas_own_iteration():
    frame = pd.DataFrame({"n": pd.array([1, None], dtype="Int64")})
    assert list(frames.rows(frame)) == list(frame.itertuples(index=False))
    assert frames.records(frame) == frame.to_dict("records")


def test_a_frame_without_columns_gives_one_empty_row_per_row():
    frame = pd.DataFrame(index=range(3))
    assert [tuple(r) for r in frames.rows(frame)] == [()] * 3
    assert frames.records(frame) == [{}] * 3
