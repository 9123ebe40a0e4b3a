"""Reading exposition text back: a fast line scan for polling, the real parser for strictness."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _unescape(raw: str) -> str:
    return raw.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def series(body: bytes | str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample line of `name` (text format 0.0.4)."""
    text = body.decode() if isinstance(body, bytes) else body
    out: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            labels_part, _, number = rest[1:].rpartition("} ")
            labels = {k: _unescape(v) for k, v in _LABEL.findall(labels_part)}
        elif rest.startswith(" "):
            labels, number = {}, rest[1:]
        else:
            continue  # another family sharing the prefix
        out.append((labels, float(number.split()[0])))
    return out


def value(body: bytes | str, name: str, **labels: str) -> float | None:
    """The value of the one sample of `name` whose labels include `labels` (None if absent)."""
    matches = [v for got, v in series(body, name) if all(got.get(k) == w for k, w in labels.items())]
    assert len(matches) <= 1, f"{name}{labels}: {len(matches)} samples"
    return matches[0] if matches else None


def parsed_samples(body: bytes | str) -> list[Sample]:
    """Every sample, through prometheus_client's parser (raises on malformed exposition)."""
    text = body.decode() if isinstance(body, bytes) else body
    return [s for family in text_string_to_metric_families(text) for s in family.samples]
