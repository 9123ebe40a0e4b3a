"""Reading exposition text back in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str | bytes, name: str) -> list[Sample]:
    if isinstance(text, bytes):
        text = text.decode()
    out: list[Sample] = []
    for family in text_string_to_metric_families(text):
        out.extend(s for s in family.samples if s.name == name)
    return out


def value(text: str | bytes, name: str, **labels: str) -> float | None:
    """The value of the one sample of `name` whose labels include `labels` (None if absent)."""
    matches = [s for s in samples(text, name) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) <= 1, matches
    return matches[0].value if matches else None


def present(text: str | bytes, name: str, **labels: str) -> float:
    """`value`, for a sample the test needs there: fails naming the sample when it is absent."""
    found = value(text, name, **labels)
    assert found is not None, f"no {name} sample with {labels}"
    return found
