"""The pages speak to users: every relative link in README.md, REPRODUCTION.md and docs/*.md reaches a file of the
repository (and, with a #fragment into a Markdown page, one of its headings), and no page, comment, test or job
narrates how the project was built (numbered sessions or issues)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "REPRODUCTION.md", *(ROOT / "docs").glob("*.md")])
SCANNED = ["README.md", "REPRODUCTION.md", "docs", "ldpfed", "jobs", "tests", "examples"]
TEXT_SUFFIXES = {".md", ".py", ".toml", ".txt", ".yaml", ".yml", ".sh", ".cfg", ".ini", ".json", ".html"}
SKIPPED_PARTS = {"__pycache__", ".pytest_cache", "build", "dist"}

# Built from pieces, so this file does not match its own pattern.
_NUMBER = "[0-9]"
NARRATION = re.compile("|".join([f"sess{'ion'} {_NUMBER}", f"sess{'ions'} {_NUMBER}", f"this sess{'ion'}",
                                 f"iss{'ue'} {_NUMBER}+"]), re.IGNORECASE)

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The page without its code: fenced blocks and inline code spans (kept as blank lines, so line numbers hold)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub("", text)


def _anchors(page: Path) -> set:
    """The fragments GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens, a repeated
    slug numbered -1, -2, ..."""
    seen, anchors = {}, set()
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text(encoding="utf-8"))
    for line in text.replace("`", "").splitlines():      # a heading's code spans keep their text in its anchor
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path):
    for number, line in enumerate(_prose(page.read_text(encoding="utf-8")).splitlines(), start=1):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):     # http:, https:, mailto:, ...
                continue
            yield number, target


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_reach_files_and_headings(page):
    broken = []
    for number, target in _links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment.lower() not in _anchors(linked):
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def _areas():
    """What the narration check scans, one test case each: every page of the documentation on its own (so a failure
    names the page), then the code folders."""
    pages = [path for path in PAGES]
    others = [ROOT / name for name in SCANNED if (ROOT / name).is_dir() and name != "docs"]
    others.extend(file for file in sorted((ROOT / "docs").rglob("*")) if file.is_file() and file not in pages
                  and file.suffix in TEXT_SUFFIXES)
    return pages + others


def _files(area: Path):
    if area.is_file():
        yield area
        return
    for file in sorted(area.rglob("*")):
        if (file.is_file() and file.suffix in TEXT_SUFFIXES
                and not SKIPPED_PARTS & set(file.relative_to(ROOT).parts)
                and not any(part.endswith(".egg-info") for part in file.parts)):
            yield file


@pytest.mark.parametrize("area", _areas(), ids=lambda area: str(area.relative_to(ROOT)))
def test_nothing_narrates_how_the_project_was_built(area):
    found = []
    for file in _files(area):
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if NARRATION.search(line):
                found.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, f"{len(found)} lines narrate how the project was built:\n" + "\n".join(found)
