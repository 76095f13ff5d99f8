"""The README stays a front door (issue 35: under 10,000 characters, results live in docs/) and
every relative link in the README and docs/ leads to a file that exists, and every `#anchor` to
one of its headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_reads_in_five_minutes() -> None:
    size = len((REPO / "README.md").read_text(encoding="utf-8"))
    assert size < 10_000, f"README.md has {size} characters; results and details go to docs/"


def test_the_readme_links_every_docs_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = {m.split("#")[0] for m in LINK.findall(readme)}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    # pages reached from another docs page, not from the README
    reached_elsewhere = {"docs/criu_probe.md"}
    assert pages - reached_elsewhere <= linked, sorted(pages - reached_elsewhere - linked)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_lead_somewhere(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in LINK.findall(text)]
    local = [t for t in targets if t and not re.match(r"^[a-z]+:", t)]
    broken = [t for t in local if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(REPO)} links to missing files: {broken}"


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped (word
    characters, spaces and hyphens kept), spaces as hyphens; a repeated one gets -1, -2, ..."""
    anchors: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m is None:
            continue
        base = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        anchor, n = base, 0
        while anchor in anchors:
            n += 1
            anchor = f"{base}-{n}"
        anchors.add(anchor)
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_anchors_name_a_heading(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        path, _, anchor = target.partition("#")
        if not anchor or re.match(r"^[a-z]+:", path) or not (path == "" or path.endswith(".md")):
            continue
        linked = page if path == "" else (page.parent / path)
        if linked.exists() and anchor not in heading_anchors(linked):
            missing.append(target)
    assert not missing, f"{page.relative_to(REPO)} links to headings that do not exist: {missing}"
