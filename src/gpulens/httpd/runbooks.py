"""`GET /runbooks/<AlertName>`: the shipped runbooks, served by the exporter and the receiver.

Every alert's `runbook_url` points here by default in the Helm chart and the kustomization (the
in-cluster service), so the links work without a wiki or a repository to host them. The runbooks
are package data of the core (`gpulens/runbooks/*.md`, a link to alerts/runbooks in the source
tree, so there is one copy). A name is letters and digits only, looked up among the files read at
start: no request path ever reaches the file system.

- `/runbooks/` (and `/runbooks`): an HTML index of every runbook;
- `/runbooks/<Name>`: the runbook as HTML (`markdown.py`: escaped, a small subset of Markdown);
- `/runbooks/<Name>.md`: its Markdown source (`text/markdown`);
- anything else under `/runbooks/`: 404 with one line.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable

from gpulens.httpd import markdown
from gpulens.httpd.server import Response, text

PREFIX = "/runbooks"
NAME = re.compile(r"[A-Za-z0-9]+")
HTML = "text/html; charset=utf-8"
MARKDOWN = "text/markdown; charset=utf-8"
MAX_RUNBOOK_BYTES = 1 << 20  # a runbook is a few KiB; a larger file is not one of ours
STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:1em auto;padding:0 1em;line-height:1.4}"
    "pre{background:#f4f4f4;padding:.5em;overflow-x:auto}code{font-size:90%}"
)


@dataclass(frozen=True)
class Runbook:
    name: str
    title: str
    source: str


def shipped() -> Traversable:
    """The runbooks installed with gpulens (the source tree's alerts/runbooks in a checkout)."""
    return resources.files("gpulens").joinpath("runbooks")


def load(directory: Traversable) -> dict[str, Runbook]:
    """name -> runbook for every `<Name>.md` in `directory` whose name is letters and digits."""
    found: dict[str, Runbook] = {}
    if not directory.is_dir():
        return found
    for entry in directory.iterdir():
        name = entry.name.removesuffix(".md")
        if not entry.name.endswith(".md") or not NAME.fullmatch(name) or not entry.is_file():
            continue
        data = entry.read_bytes()[:MAX_RUNBOOK_BYTES]
        source = data.decode("utf-8", errors="replace")
        found[name] = Runbook(name, markdown.title(source) or name, source)
    return found


def _page(title: str, body: str) -> bytes:
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body>\n"
        f'<p><a href="{PREFIX}/">All runbooks</a></p>\n{body}</body></html>\n'
    ).encode()


class Runbooks:
    """The answers under /runbooks, each built once on first request and kept."""

    def __init__(self, directory: Traversable | None = None) -> None:
        self.books = load(shipped() if directory is None else directory)
        self._answers: dict[str, Response] = {}

    def answer(self, path: str) -> Response | None:
        """The answer for `path`, or None when it is not under /runbooks (another route's)."""
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            return None
        cached = self._answers.get(path)
        if cached is not None:
            return cached
        rest = path[len(PREFIX) :].removeprefix("/")
        if not rest:
            answer = Response(200, self._index(), HTML)
        else:
            name, raw = (rest[:-3], True) if rest.endswith(".md") else (rest, False)
            book = self.books.get(name) if NAME.fullmatch(name) else None
            if book is None:
                # never cached: unknown names are unbounded, and the 404 is cheap
                return text(404, f"no runbook {rest[:100]!r}: see {PREFIX}/ for the list")
            if raw:
                answer = Response(200, book.source.encode(), MARKDOWN)
            else:
                answer = Response(200, _page(book.title, markdown.to_html(book.source)), HTML)
        self._answers[path] = answer
        return answer

    def _index(self) -> bytes:
        rows = "".join(
            f'<li><a href="{PREFIX}/{name}">{html.escape(name)}</a></li>\n' for name in sorted(self.books)
        )
        body = f"<h1>gpulens runbooks</h1>\n<p>One per alert.</p>\n<ul>\n{rows}</ul>\n"
        if not self.books:
            body = "<h1>gpulens runbooks</h1>\n<p>No runbook is installed.</p>\n"
        return _page("gpulens runbooks", body)
