"""Every relative link in ``docs/`` and ``README.md`` resolves, anchors included, and every ``docs/<page>.md`` path
that the code, tests, scripts and examples name exists: a moved or renamed page fails here, not for a reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([*(REPO / "docs").rglob("*.md"), REPO / "README.md", *(REPO / "benchmarks" / "results").glob("*.md")])
# where a plain-text pointer to a page may sit (comments, docstrings, YAML comments, launcher headers)
POINTER_ROOTS = ("verl_omni", "tests", "scripts", "examples", "benchmarks")
POINTER_SUFFIXES = {".py", ".yaml", ".sh", ".md", ".toml", ".txt"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"\bdocs/[\w./-]*\.md\b")
FENCE = re.compile(r"^\s*```")
INLINE_CODE = re.compile(r"`[^`]*`")


def _prose_lines(text: str):
    """The page's lines outside fenced code blocks, inline code removed (a link there is an example, not a link)."""
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield INLINE_CODE.sub("", line)


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as ``-``, ``-N`` on
    repeats."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_fence or match is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(page: Path) -> list[str]:
    broken = []
    for line in _prose_lines(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            if not resolved.exists():
                broken.append(f"{target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
                broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_every_docs_path_named_in_the_repository_exists():
    missing = []
    for path in _pointer_files():
        for name in set(DOC_PATH.findall(path.read_text(errors="ignore"))):
            if not (REPO / name).is_file():
                missing.append(f"{path.relative_to(REPO)}: {name}")
    assert missing == []


def test_the_anchor_rule_follows_github(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n## `algorithm` with `algorithm=flow_grpo`\n\n## Keys\n\n```\n# not a heading\n```\n## Keys\n"
    )
    assert heading_anchors(page) == {"top", "algorithm-with-algorithmflow_grpo", "keys", "keys-1"}
    page.write_text("[a](#keys) [b](#nope) [c](missing.md) [d](https://example.com) `[e](missing.md)`\n## Keys\n")
    assert broken_links(page) == ["#nope: no heading with that anchor", "missing.md: no such file"]


# a pointer that names a section: ``docs/guide/rewards.md, "Devices"`` (with or without backticks and comma)
SECTION_POINTER = re.compile(r"(docs/[\w/-]+\.md)`{0,2},? \"([^\"]+)\"")


def heading_titles(page: Path) -> list[str]:
    """The page's heading texts, lower case, without backticks."""
    return [
        re.sub(r"^#+\s+", "", line).replace("`", "").strip().lower()
        for line in page.read_text().splitlines()
        if re.match(r"^#{1,6}\s", line)
    ]


def _pointer_files():
    """Every file that may name a page in plain text: the code's comments and docstrings, and the pages."""
    for root in POINTER_ROOTS:
        for path in (REPO / root).rglob("*"):
            if path.suffix in POINTER_SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                yield path
    yield from PAGES


def test_every_section_named_beside_a_docs_path_exists():
    missing = []
    for path in _pointer_files():
        for name, section in SECTION_POINTER.findall(path.read_text(errors="ignore")):
            page = REPO / name
            # a section name wrapped over comment or docstring lines reads as one line
            wanted = re.sub(r"\s*\n\s*#?\s*", " ", section).replace("`", "").lower()
            if page.is_file() and not any(title.startswith(wanted) for title in heading_titles(page)):
                missing.append(f"{path.relative_to(REPO)}: {name}, {section!r}")
    assert missing == []
