"""Apply the mixin's selector and cluster label to a PromQL expression, keeping its layout.

The rules are written once without a scrape-job selector; every deployment picks its own
(`job=~".*gpulens.*"` by default, kube-prometheus-style `job="gpulens-exporter"`, ...). A small
lexer finds each vector selector (a metric name that is not a function, keyword or label in a
grouping list) and adds the selector's matchers to it, and it adds the cluster label to every
`by (...)` and `on (...)` list, so aggregations and joins never merge two clusters' series when a
global view (Thanos, Mimir) holds several. Only text is inserted: line breaks, indentation and
comments stay as they were, so the generated rule files read like the sources.

Expressions are bounded (a rule file's expression) and the lexer is a single pass; malformed input
(an unclosed string, brace or bracket) raises PromQLError naming what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# words that are operators or modifiers, never metric names (PromQL is case-insensitive here)
KEYWORDS = frozenset(
    {
        "and", "or", "unless", "atan2", "bool", "offset", "by", "without", "on", "ignoring",
        "group_left", "group_right", "inf", "nan", "start", "end",
        # aggregation operators: `sum by (x) (...)` puts the grouping before the parenthesis
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)  # fmt: skip
# grouping lists that take the cluster label: aggregation `by` and vector-matching `on`
CLUSTER_LISTS = frozenset({"by", "on"})
AGGREGATORS = frozenset(
    {
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)  # fmt: skip
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"[0-9.][0-9A-Za-z_.+-]*")  # numbers, hex, durations (5m, 1h30m), 1e-12
_SPACE = re.compile(r"\s+")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# one matcher: name op "string" (double, single or back quotes)
_MATCHER = re.compile(
    r"""\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*"""
)


class PromQLError(ValueError):
    """An expression the rewriter cannot read; the message says what and where."""


@dataclass(frozen=True)
class Scope:
    """What to add: matchers for every scraped series and a label for every grouping.

    `selector` goes on every series read straight from a scrape (a name without a colon);
    recorded series (`level:metric:operations`) were scoped by the rules that wrote them and keep
    their own labels (a `model:` series has no `job`). `overrides` gives series of other
    components their own selector by name prefix (the remediation receiver is its own job).
    """

    selector: str  # e.g. 'job=~".*gpulens.*"'; "" adds none
    cluster_label: str  # e.g. "cluster"; "" adds none
    overrides: tuple[tuple[str, str], ...] = ()  # (metric name prefix, selector)

    def selector_for(self, metric: str) -> str:
        if ":" in metric:
            return ""
        for prefix, selector in self.overrides:
            if metric.startswith(prefix):
                return selector
        return self.selector


def check_selector(selector: str) -> str:
    """`selector` as given if it is a comma-separated list of PromQL label matchers, else an error."""
    if not selector.strip():
        return ""
    rest = selector
    while True:
        match = _MATCHER.match(rest)
        if match is None:
            raise PromQLError(
                f'selector {selector!r}: expected label matchers like job=~".*gpulens.*", cluster="a"'
            )
        rest = rest[match.end() :]
        if not rest:
            return selector.strip()
        if not rest.startswith(","):
            raise PromQLError(f"selector {selector!r}: matchers must be separated by commas")
        rest = rest[1:]


def check_label(name: str) -> str:
    if name and (not _LABEL_NAME.fullmatch(name) or name.startswith("__")):
        raise PromQLError(f"label name {name!r}: expected [A-Za-z_][A-Za-z0-9_]* not starting with __")
    return name


def _skip_string(text: str, i: int) -> int:
    """Index after the string literal starting at text[i]."""
    quote = text[i]
    j = i + 1
    while j < len(text):
        if text[j] == "\\" and quote != "`":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    raise PromQLError(f"unterminated string starting at offset {i}")


def _close(text: str, i: int, opening: str, closing: str) -> int:
    """Index of the `closing` bracket matching text[i] == opening (strings skipped)."""
    depth = 0
    j = i
    while j < len(text):
        ch = text[j]
        if ch in "\"'`":
            j = _skip_string(text, j)
            continue
        if ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise PromQLError(f"unclosed {opening!r} at offset {i}")


def _next_significant(text: str, i: int) -> int:
    """Index of the next non-space character at or after i (comments skipped)."""
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
        else:
            return i
    return i


def _label_list(text: str, start: int, end: int) -> list[str]:
    inner = text[start + 1 : end]
    names = [part.strip() for part in inner.split(",") if part.strip()]
    for name in names:
        if not _LABEL_NAME.fullmatch(name):
            raise PromQLError(f"unexpected {name!r} in a label list at offset {start}")
    return names


def apply(expr: str, scope: Scope) -> str:
    """`expr` with the scope's matchers in every scraped series' selector and its cluster label in
    every `by` / `on` list (where not already there); an aggregation without a grouping becomes
    `by (cluster)`, so a fleet-wide figure is one per cluster (the same single series on a
    Prometheus without that label)."""
    check_selector(scope.selector)
    for _prefix, extra in scope.overrides:
        check_selector(extra)
    cluster = check_label(scope.cluster_label)
    out: list[str] = []
    i = 0
    n = len(expr)
    while i < n:
        ch = expr[i]
        if ch in "\"'`":
            j = _skip_string(expr, i)
            out.append(expr[i:j])
            i = j
        elif ch == "#":
            j = expr.find("\n", i)
            j = n if j < 0 else j
            out.append(expr[i:j])
            i = j
        elif ch == "[":  # range or subquery: durations, steps, never selectors
            j = _close(expr, i, "[", "]") + 1
            out.append(expr[i:j])
            i = j
        elif ch == "{":  # a selector without a metric name: {__name__=~"..."}
            j = _close(expr, i, "{", "}")
            out.append(_merge(expr[i : j + 1], scope.selector))
            i = j + 1
        elif ch.isdigit() or (ch == "." and i + 1 < n and expr[i + 1].isdigit()):
            match = _NUMBER.match(expr, i)
            assert match is not None
            out.append(match.group())
            i = match.end()
        elif _IDENT.match(expr, i):
            match = _IDENT.match(expr, i)
            assert match is not None
            word = match.group()
            i = match.end()
            out.append(word)
            following = _next_significant(expr, i)
            lowered = word.lower()
            if lowered in LABEL_LISTS and following < n and expr[following] == "(":
                end = _close(expr, following, "(", ")")
                names = _label_list(expr, following, end)
                out.append(expr[i:following])
                if lowered in CLUSTER_LISTS and cluster and cluster not in names:
                    inner = expr[following + 1 : end]
                    out.append(f"({cluster}, {inner.lstrip()})" if names else f"({cluster})")
                else:
                    out.append(expr[following : end + 1])
                i = end + 1
            elif lowered in AGGREGATORS and cluster and following < n and expr[following] == "(":
                end = _close(expr, following, "(", ")")
                after = _next_significant(expr, end + 1)
                trailing = _IDENT.match(expr, after)
                if trailing is None or trailing.group().lower() not in ("by", "without"):
                    out.append(f" by ({cluster}) ")
                    i = following
            elif lowered in KEYWORDS or (following < n and expr[following] == "("):
                pass  # operator, modifier or function name
            elif following < n and expr[following] == "{":
                end = _close(expr, following, "{", "}")
                out.append(expr[i:following])
                out.append(_merge(expr[following : end + 1], scope.selector_for(word)))
                i = end + 1
            elif scope.selector_for(word):
                out.append("{" + scope.selector_for(word) + "}")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _merge(braces: str, selector: str) -> str:
    """`{a="b"}` -> `{<selector>, a="b"}` (an empty `{}` becomes `{<selector>}`)."""
    if not selector:
        return braces
    inner = braces[1:-1]
    return "{" + selector + (", " + inner if inner.strip() else "") + "}"
