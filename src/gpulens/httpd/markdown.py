"""The Markdown of the shipped runbooks as simple HTML: every character of the source escaped.

Runbooks use a small part of Markdown: `#` headings, paragraphs, fenced code blocks, `-` / `*` /
`1.` lists with indented continuation lines, and inline code, bold, italics and links. This covers
exactly that (anything else shows as its escaped text, never as markup), so the exporter, which
serves the runbooks too, takes no Markdown library; tests/httpd/test_markdown.py holds it to every
shipped runbook.
"""

from __future__ import annotations

import html
import re

_HEADING = re.compile(r"(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
_BULLET = re.compile(r"^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$")
# inline spans, in order of precedence: code first, so nothing inside backticks is markup
_INLINE = re.compile(
    r"(?P<code>`+)(?P<code_text>.+?)(?P=code)"
    r"|\*\*(?P<bold>[^*\s](?:.*?[^*\s])?)\*\*"
    r"|(?<![\w*])\*(?P<em>[^*\s](?:[^*]*?[^*\s])?)\*(?![\w*])"
    r"|\[(?P<link_text>[^\]]+)\]\((?P<href>[^)\s]+)\)"
)
_RUNBOOK_FILE = re.compile(r"^([A-Za-z0-9]+)\.md$")  # a link to another runbook, as on GitHub


def _href(target: str) -> str | None:
    """Where a link may point: http(s), this site (a path, a fragment) or a relative path; another
    runbook's file name becomes its page. None for anything else (javascript:, data:, //host)."""
    runbook = _RUNBOOK_FILE.match(target)
    if runbook:
        return runbook.group(1)
    if target.lower().startswith(("http://", "https://")):
        return target
    if target.startswith("//") or ":" in target.split("/", 1)[0]:
        return None
    return target


def inline(text: str) -> str:
    """One line's (or paragraph's) text with its inline spans as HTML, the rest escaped."""
    out: list[str] = []
    position = 0
    for match in _INLINE.finditer(text):
        out.append(html.escape(text[position : match.start()], quote=False))
        position = match.end()
        if match.group("code") is not None:
            out.append(f"<code>{html.escape(match.group('code_text').strip(), quote=False)}</code>")
        elif match.group("bold") is not None:
            out.append(f"<strong>{inline(match.group('bold'))}</strong>")
        elif match.group("em") is not None:
            out.append(f"<em>{inline(match.group('em'))}</em>")
        else:
            href = _href(match.group("href"))
            if href is None:  # stays text
                out.append(html.escape(match.group(0), quote=False))
            else:
                label = inline(match.group("link_text"))
                out.append(f'<a href="{html.escape(href, quote=True)}">{label}</a>')
    out.append(html.escape(text[position:], quote=False))
    return "".join(out)


def to_html(source: str) -> str:
    """The document's body as HTML (no <html> wrapper)."""
    out: list[str] = []
    paragraph: list[str] = []
    items: list[list[str]] = []  # the open list's items, each its lines
    list_tag = ""
    lines = source.splitlines()

    def flush_paragraph() -> None:
        if paragraph:
            out.append(f"<p>{inline(' '.join(part.strip() for part in paragraph))}</p>")
            paragraph.clear()

    def flush_list() -> None:
        nonlocal list_tag
        if items:
            body = "".join(f"<li>{inline(' '.join(part.strip() for part in item))}</li>" for item in items)
            out.append(f"<{list_tag}>{body}</{list_tag}>")
            items.clear()
            list_tag = ""

    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if fence:
            flush_paragraph()
            flush_list()
            marker = fence.group(1)
            code: list[str] = []
            index += 1
            while index < len(lines) and not lines[index].strip().startswith(marker):
                code.append(lines[index])
                index += 1
            language = fence.group(2)
            attribute = f' class="language-{html.escape(language, quote=True)}"' if language else ""
            out.append(f"<pre><code{attribute}>{html.escape(chr(10).join(code), quote=False)}</code></pre>")
            index += 1  # the closing fence (or the end of the document)
            continue
        index += 1
        if not line.strip():
            flush_paragraph()
            if items and index < len(lines) and lines[index].startswith((" ", "\t")):
                continue  # a blank line inside a list item
            flush_list()
            continue
        heading = _HEADING.match(line)
        if heading:
            flush_paragraph()
            flush_list()
            level = len(heading.group(1))
            out.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
            continue
        bullet = _BULLET.match(line)
        if bullet and not bullet.group(1):
            flush_paragraph()
            tag = "ol" if bullet.group(2)[0].isdigit() else "ul"
            if list_tag and tag != list_tag:
                flush_list()
            list_tag = tag
            items.append([bullet.group(3)])
            continue
        if items and line.startswith((" ", "\t")):
            items[-1].append(line)  # an item's continuation line
            continue
        flush_list()
        paragraph.append(line)
    flush_paragraph()
    flush_list()
    return "\n".join(out) + "\n"


def title(source: str) -> str:
    """The first heading's text, or "" when there is none."""
    for line in source.splitlines():
        heading = _HEADING.match(line)
        if heading:
            return heading.group(2)
    return ""
