"""The analyzer's JSON writer gives exactly the text of `json.dumps(obj, indent=1, default=str)`."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.analyzer.jsonout import dumps

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.decimals(allow_nan=False).map(Decimal)  # not JSON: written through default=str
)
KEYS = st.text() | st.integers() | st.floats() | st.booleans() | st.none()
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(KEYS, inner, max_size=5)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(VALUES, st.integers(0, 3))
def test_the_text_equals_the_standard_librarys(value, indent):
    assert dumps(value, indent) == json.dumps(value, indent=indent, default=str)


def test_a_job_list_is_one_line_per_field():
    jobs = {"jobs": [{"job_id": "a\nb", "gpus": 1, "reason": None}], "notes": []}
    assert dumps(jobs) == json.dumps(jobs, indent=1, default=str)
    assert dumps(jobs).count("\n") == 9  # one line per field, bracket and key
