"""Proactive negotiation per RFC 9110 §12.5: `Accept` and `Accept-Encoding` with q-values.

Names and parameter names are case-insensitive, `q=0` means "not acceptable", an element whose
q-value is not a valid qvalue is ignored (as if absent), and when several ranges match a type the
most specific one decides its q-value (§12.5.1: `*/*;q=1, application/openmetrics-text;q=0` means
"anything but OpenMetrics"). Among offers with equal q-values the earlier offer wins, except that an
offer named explicitly beats one that only a wildcard matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")


@dataclass(frozen=True)
class MediaRange:
    type: str
    subtype: str
    params: tuple[tuple[str, str], ...]  # other than q, names lower-case
    q: float


@dataclass(frozen=True)
class Offer:
    """A representation the server can send: `type/subtype` and the parameters that identify it."""

    type: str
    subtype: str
    params: tuple[tuple[str, str], ...] = ()


def _split_params(part: str) -> tuple[str, list[tuple[str, str]]] | None:
    head, *rest = part.split(";")
    params: list[tuple[str, str]] = []
    for item in rest:
        name, eq, value = item.strip().partition("=")
        if not eq or not name.strip():
            return None
        params.append((name.strip().lower(), value.strip().strip('"')))
    return head.strip(), params


def _q(params: list[tuple[str, str]]) -> tuple[float | None, list[tuple[str, str]]]:
    """The element's q-value (None when invalid) and its other parameters."""
    q = 1.0
    others: list[tuple[str, str]] = []
    for name, value in params:
        if name == "q":
            if not _QVALUE.fullmatch(value):
                return None, others
            q = float(value)
        else:
            others.append((name, value))
    return q, others


def parse_accept(header: str | None) -> list[MediaRange]:
    ranges = []
    for part in (header or "").split(","):
        split = _split_params(part)
        if split is None or "/" not in split[0]:
            continue
        media, params = split
        main, _, sub = media.lower().partition("/")
        q, others = _q(params)
        if q is None or not main or not sub or (main == "*" and sub != "*"):
            continue
        ranges.append(MediaRange(main, sub, tuple(others), q))
    return ranges


def _quality(offer: Offer, ranges: list[MediaRange]) -> tuple[float, int]:
    """(q, specificity) of the most specific range that matches `offer`; q 0 when none does."""
    best: tuple[int, float] = (-1, 0.0)
    offered = dict(offer.params)
    for r in ranges:
        if r.type == "*":
            specificity = 0
        elif r.type != offer.type:
            continue
        elif r.subtype == "*":
            specificity = 1
        elif r.subtype != offer.subtype:
            continue
        elif r.params:
            # only parameters the offer defines (version) decide; others (charset, Prometheus'
            # escaping=...) do not change which representation is meant
            if any(k in offered and offered[k] != v.lower() for k, v in r.params):
                continue
            specificity = 3
        else:
            specificity = 2
        if specificity > best[0]:
            best = (specificity, r.q)
    return best[1], best[0]


def choose_media(header: str | None, offers: list[Offer]) -> Offer | None:
    """The acceptable offer with the highest q (ties: explicit before wildcard, then order).

    None when the header rules every offer out; a missing or empty header accepts the first offer.
    """
    ranges = parse_accept(header)
    if not ranges:
        return offers[0] if offers else None
    scored = [(_quality(o, ranges), -i, o) for i, o in enumerate(offers)]
    scored = [s for s in scored if s[0][0] > 0]
    if not scored:
        return None
    (_, _), _, offer = max(scored, key=lambda s: (s[0][0], s[0][1] >= 2, s[1]))
    return offer


def coding_qualities(header: str | None) -> dict[str, float]:
    """`Accept-Encoding` as {coding: q}; invalid elements are ignored, names lower-case."""
    qualities: dict[str, float] = {}
    for part in (header or "").split(","):
        split = _split_params(part)
        if split is None or not split[0]:
            continue
        coding, params = split
        q, _ = _q(params)
        if q is None:
            continue
        qualities[coding.lower()] = q
    return qualities


def accepts_coding(header: str | None, coding: str) -> bool:
    """True when `coding` has q > 0 and is not explicitly less preferred than `identity`."""
    qualities = coding_qualities(header)
    wildcard = qualities.get("*")
    q = qualities.get(coding, wildcard if wildcard is not None else 0.0)
    identity = qualities.get("identity")  # only an explicit preference for no coding outranks it
    return q > 0 and (identity is None or q >= identity)
