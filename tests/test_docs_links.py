"""The README and docs/ stay short and their links lead somewhere."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
README_MAX_LINES = 250


def relative_links(page: Path) -> list[str]:
    """Link targets that are not URLs; `#anchor` alone points into the page itself."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    targets = (m.group(1) for m in LINK.finditer(text))
    targets = (page.name + t if t.startswith("#") else t for t in targets)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered -1, -2, ..."""
    anchors: set[str] = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            anchor, n = slug, 0
            while anchor in anchors:
                n += 1
                anchor = f"{slug}-{n}"
            anchors.add(anchor)
    return anchors


def missing_targets(page: Path) -> list[str]:
    """Relative links whose file does not exist, or whose #anchor names no heading of a page."""
    missing = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = page.parent / path
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in heading_anchors(file)):
            missing.append(target)
    return missing


def test_the_pages_are_found():
    assert ROOT / "README.md" in PAGES and len(PAGES) > 1


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file(page):
    assert missing_targets(page) == []


def test_the_readme_has_relative_links_to_check():
    assert len(relative_links(ROOT / "README.md")) >= 5


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# Part one\n## `cgtool plan` — flags\n## Part one\n")
    page.write_text("# Top\n[ok](there.md#part-one) [ok](there.md#cgtool-plan--flags)\n"
                    "[ok](there.md#part-one-1) [gone](gone.md) [no heading](there.md#part-two)\n"
                    "[web](https://example.com) [here](#top) [not here](#bottom)\n"
                    "```\n[in a code block](not-a-link.md)\n```\n")
    assert missing_targets(page) == ["gone.md", "there.md#part-two", "page.md#bottom"]


def test_the_readme_is_at_most_250_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES


def test_ci_runs_exactly_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    last_line = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert "-m pytest" in last_line
    assert f"\n{last_line}\n" in readme
