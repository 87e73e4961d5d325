"""The README and docs/ hold together: every relative link resolves, and the README stays short.

A link is ``[text](target)`` outside fenced code blocks. A relative target must name an
existing file (relative to the page that links it); a ``#anchor`` must match a heading of the
target Markdown page, slugged as GitHub does (lower case, punctuation dropped, spaces to
hyphens, ``-1``, ``-2`` for repeats). External links (``http:``, ``https:``, ``mailto:``)
are not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_WORDS = 1000

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading text: markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: keep its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    """The link targets of a page, in order."""
    found = []
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        # inline code spans hold examples, not links
        found.extend(_LINK.findall(re.sub(r"`[^`]*`", "", line)))
    return found


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file or heading does not exist."""
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            bad.append(f"{target} (no file {dest})")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    return bad


def test_pages_exist() -> None:
    assert (ROOT / "README.md").is_file()
    assert len(PAGES) > 1, "docs/*.md is missing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert links(page) or page.name != "README.md", "README.md links to nothing"
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: broken links"


def test_readme_is_short() -> None:
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words < README_MAX_WORDS, f"README.md has {words} words (limit {README_MAX_WORDS})"


def test_checker_finds_a_broken_link(tmp_path: Path) -> None:
    """The checker itself can fail: a missing file and a missing heading are reported."""
    (tmp_path / "other.md").write_text("# Real heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#real-heading) [b](missing.md) [c](other.md#nope)\n"
                    "```\n[d](in-a-fence.md)\n```\n[e](https://example.com)\n", encoding="utf-8")
    bad = broken_links(page)
    assert len(bad) == 2
    assert bad[0].startswith("missing.md") and bad[1].startswith("other.md#nope")


def test_slug_matches_github() -> None:
    assert slug("Artifacts and profile.json") == "artifacts-and-profilejson"
    assert slug("Batch-independent work `a`") == "batch-independent-work-a"
    assert slug("Compute of one micro-step (`compute.py`)") == "compute-of-one-micro-step-computepy"
