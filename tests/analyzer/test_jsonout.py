"""The analyzer's JSON writer: valid JSON that reads back as the standard library's would, with
non-finite floats as null and types JSON lacks as their str()."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from decimal import Decimal

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer.jsonout import dumps

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too: orjson refuses them, the fallback writes them
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.decimals(allow_nan=False).map(Decimal)  # not JSON: written as its str()
)
KEYS = st.text() | st.integers(-(2**63), 2**63 - 1) | st.booleans() | st.none()
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(KEYS, inner, max_size=5)
    ),
    max_leaves=40,
)


def _key(key: object) -> str:
    """A dict key as JSON writes it (an object's keys are strings)."""
    if isinstance(key, bool) or key is None:
        return json.dumps(key)
    return str(key)


def _expected(value: object) -> object:
    """What the standard library's text reads back as, non-finite floats as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_key(k): _expected(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_expected(v) for v in value]
    if isinstance(value, Decimal):
        return str(value)
    return value


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_the_text_reads_back_as_the_value_with_non_finite_floats_as_null(value):
    assert json.loads(dumps(value)) == _expected(value)


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_the_text_is_strict_json(value):
    json.loads(dumps(value), parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))


def test_an_integer_past_64_bits_is_written_whole():
    assert json.loads(dumps({"n": 2**70, "x": math.nan})) == {"n": 2**70, "x": None}


def test_numpy_scalars_are_numbers():
    assert json.loads(dumps({"a": np.float64(0.5), "b": np.int64(3)})) == {"a": 0.5, "b": 3}


def test_datetimes_and_dataclasses_are_their_str():
    @dataclasses.dataclass(frozen=True)
    class Point:
        x: int

    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    assert json.loads(dumps([when, Point(1)])) == [str(when), str(Point(1))]


def test_a_job_list_is_one_line_per_field():
    jobs = {"jobs": [{"job_id": "a\nb", "gpus": 1, "reason": None}], "notes": []}
    assert dumps(jobs).splitlines() == [
        "{",
        '  "jobs": [',
        "    {",
        '      "job_id": "a\\nb",',  # a newline in a value is escaped: one line per field holds
        '      "gpus": 1,',
        '      "reason": null',
        "    }",
        "  ],",
        '  "notes": []',
        "}",
    ]
