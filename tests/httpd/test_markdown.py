"""The runbooks' Markdown as HTML: the subset they use becomes markup, everything else escaped text."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpulens.httpd import markdown

REPO = Path(__file__).resolve().parents[2]
ALLOWED_TAGS = {"h1", "h2", "h3", "h4", "h5", "h6", "p", "pre", "code", "ul", "ol", "li", "strong", "em", "a"}


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.hrefs: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.hrefs += [value or "" for name, value in attrs if name == "href"]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(source: str) -> Tags:
    tags = Tags()
    tags.feed(markdown.to_html(source))
    return tags


def test_headings_paragraphs_and_lists_become_their_elements() -> None:
    html = markdown.to_html(
        "# Title\n\nSome text\non two lines.\n\n## Steps\n\n- one\n  more\n- two\n\n1. first\n"
    )
    assert html == (
        "<h1>Title</h1>\n<p>Some text on two lines.</p>\n<h2>Steps</h2>\n"
        "<ul><li>one more</li><li>two</li></ul>\n<ol><li>first</li></ol>\n"
    )


def test_a_fenced_block_is_preformatted_code_kept_verbatim_and_escaped() -> None:
    html = markdown.to_html("```sh\nkubectl get nodes -l 'a=b' | grep \"<x>\" && echo **no**\n```\n")
    assert html == (
        '<pre><code class="language-sh">kubectl get nodes -l \'a=b\' | grep "&lt;x&gt;" '
        "&amp;&amp; echo **no**</code></pre>\n"
    )


def test_inline_code_bold_and_italics_are_marked_up_and_code_is_not_parsed_further() -> None:
    html = markdown.to_html("Run `a **b** <c>` then **reboot** and *wait*.")
    assert (
        html == "<p>Run <code>a **b** &lt;c&gt;</code> then <strong>reboot</strong> and <em>wait</em>.</p>\n"
    )


def test_markup_in_the_source_is_shown_as_text_never_run() -> None:
    tags = parsed('<script>alert(1)</script> <img src=x onerror="y"> & done')
    assert tags.tags == ["p"]
    assert "".join(tags.text).strip() == '<script>alert(1)</script> <img src=x onerror="y"> & done'


@pytest.mark.parametrize(
    ("target", "href"),
    [
        ("https://docs.nvidia.com/deploy/xid-errors/", "https://docs.nvidia.com/deploy/xid-errors/"),
        ("GPUXidResetRequired.md", "GPUXidResetRequired"),  # another runbook: its page here
        ("#what-to-do", "#what-to-do"),
    ],
)
def test_links_to_the_web_to_other_runbooks_and_within_the_page_are_kept(target: str, href: str) -> None:
    assert parsed(f"See [this]({target}).").hrefs == [href]


@pytest.mark.parametrize("target", ["javascript:alert(1)", "data:text/html,x", "//evil.example/x"])
def test_links_with_other_schemes_stay_text(target: str) -> None:
    tags = parsed(f"See [this]({target}).")
    assert tags.hrefs == []
    assert f"[this]({target})" in "".join(tags.text)


def test_the_title_is_the_first_heading() -> None:
    assert markdown.title("intro\n\n# GPULost\n\n## More\n") == "GPULost"
    assert markdown.title("no heading") == ""


@pytest.mark.parametrize("path", sorted((REPO / "alerts" / "runbooks").glob("*.md")), ids=lambda p: p.stem)
def test_every_shipped_runbook_renders_with_only_the_subset_s_elements_and_all_its_words(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    tags = parsed(source)
    assert set(tags.tags) <= ALLOWED_TAGS
    assert tags.tags[0] == "h1" and markdown.title(source) == path.stem
    shown = " ".join("".join(tags.text).split())
    for word in ("kubectl", "nvidia-smi", "Escalate"):
        if word in source:
            assert word in shown
