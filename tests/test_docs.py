"""The documentation holds together: links resolve, code cites only pages that exist, the
README stays a first hour's read, and modules stay short. Pure and fast: no services.

Layer: tests. What each check guards:

- every relative link of README.md and docs/ names a file, and its ``#anchor`` a heading of it;
- every docs path (with an optional anchor) named in code, tests or any Markdown file resolves;
- nothing cites files outside the repository, issue or session numbers (:data:`BANNED`);
- README.md has at most :data:`README_MAX_LINES` lines;
- no module docstring is longer than :data:`DOCSTRING_MAX_LINES` lines, and no module is longer
  than :data:`MODULE_MAX_LINES` lines unless a line of its docstring starts with
  :data:`LONG_MODULE_MARKER` and says why;
- docs/metrics.md lists every Prometheus series exactly as ``pipeline/observe/series.py``
  defines it.

Example (GitHub's anchor of a heading):
    >>> github_slug("Kafka as a cluster"), github_slug("Redis with failover (Sentinel)")
    ('kafka-as-a-cluster', 'redis-with-failover-sentinel')
    >>> github_slug("Spark's Real-Time Mode"), github_slug("`make test`")
    ('sparks-real-time-mode', 'make-test')
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The folders whose code and text the citation and length checks cover.
CODE_FOLDERS = ("pipeline", "operators", "producers", "bench", "tests")
README_MAX_LINES = 200
DOCSTRING_MAX_LINES = 25
MODULE_MAX_LINES = 600
#: A module over MODULE_MAX_LINES lines needs a docstring line that starts with this, e.g.
#: "Long because it is one Lua script and its Python twin, which must change together."
LONG_MODULE_MARKER = "Long because"
#: What no code, test or page may cite: notes outside the repository, issue and session numbers.
#: Built from pieces so that this file does not match itself.
BANNED = re.compile(
    "|".join(
        [
            "DESIGN" + r"\.md",
            "shared" + "/",
            "notes" + "/",
            "pkg" + r"\.md",
            "issue" + " [0-9]+",
            "session" + " [0-9]+",
        ]
    )
)
SKIPPED_DIRS = {".git", ".venv", ".cache", "__pycache__", "node_modules", ".pytest_cache"}

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
MARKDOWN_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.I)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
#: A path under docs/ named in text (a page or a picture), with an optional #anchor.
DOCS_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]*[\w/](?:#[\w-]+)?")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lowercased, markup and punctuation dropped
    (letters, digits, '_', '-' and spaces stay), spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = github_slug(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def markdown_files() -> list[Path]:
    return sorted(path for path in walk(ROOT) if path.suffix == ".md")


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def walk(folder: Path) -> Iterator[Path]:
    for path in folder.iterdir():
        if path.is_dir():
            if path.name not in SKIPPED_DIRS and not path.name.endswith(".egg-info"):
                yield from walk(path)
        elif path.is_file():
            yield path


def text_files(folders: tuple[str, ...]) -> Iterator[tuple[Path, str]]:
    for name in folders:
        for path in sorted(walk(ROOT / name)):
            try:
                yield path, path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # images, pickles: no text to cite anything


def broken_target(target: str, base: Path) -> str | None:
    """Why ``target`` (``path#anchor``, relative to ``base``) does not resolve, or None."""
    path_part, _, anchor = target.partition("#")
    page = (base / path_part).resolve() if path_part else None
    if page is not None and not page.exists():
        return "no such file"
    if anchor and (page is None or page.suffix == ".md") and anchor not in anchors(page or base):
        return f"no heading #{anchor}"
    return None


def links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return MARKDOWN_LINK.findall(text) + HTML_LINK.findall(text)


def is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None


def test_every_relative_link_of_the_docs_resolves_to_a_file_and_a_heading() -> None:
    broken = []
    for page in doc_pages():
        for target in links(page):
            if is_external(target):
                continue
            base = page if target.startswith("#") else page.parent
            why = broken_target(target, base)
            if why:
                broken.append(f"{page.relative_to(ROOT)}: ({target}) {why}")
    assert not broken, "\n".join(broken)
    assert len(doc_pages()) > 10


def cited_docs_paths() -> Iterator[tuple[Path, str]]:
    sources = [path for path, _ in text_files(CODE_FOLDERS) if path.suffix == ".py"]
    for path in [*sources, *markdown_files()]:
        for cited in DOCS_PATH.findall(path.read_text(encoding="utf-8")):
            yield path, cited.rstrip(".")


def test_every_docs_path_named_in_code_tests_and_pages_resolves() -> None:
    broken = [
        f"{path.relative_to(ROOT)}: {cited} {why}"
        for path, cited in cited_docs_paths()
        if (why := broken_target(cited, ROOT))
    ]
    assert not broken, "\n".join(broken)


def test_nothing_cites_notes_outside_the_repository_or_issue_and_session_numbers() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path, text in text_files((*CODE_FOLDERS, "docs"))
        for number, line in enumerate(text.splitlines(), 1)
        if BANNED.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_readme_is_a_first_hours_read() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def test_module_docstrings_are_short_and_long_modules_say_why() -> None:
    too_long = []
    for path, text in text_files(CODE_FOLDERS):
        if path.suffix != ".py":
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        name = path.relative_to(ROOT)
        if len(docstring.splitlines()) > DOCSTRING_MAX_LINES:
            too_long.append(f"{name}: docstring of {len(docstring.splitlines())} lines")
        says_why = any(
            line.strip().startswith(LONG_MODULE_MARKER) for line in docstring.splitlines()
        )
        if len(text.splitlines()) > MODULE_MAX_LINES and not says_why:
            too_long.append(f"{name}: {len(text.splitlines())} lines, no '{LONG_MODULE_MARKER}'")
    assert not too_long, "\n".join(too_long)


def test_the_metrics_page_lists_every_series_as_it_is_defined() -> None:
    from pipeline.observe.series import SERIES

    page = (DOCS / "metrics.md").read_text()
    rows = {
        f"| `{series.name}` | {series.kind} | {', '.join(series.labels) or '-'} | "
        f"{series.stage} | {series.help} |"
        for series in SERIES
    }
    assert sorted(row for row in rows if row not in page) == []
    listed = set(re.findall(r"^\| `(skewer_\w+)` \|", page, re.M))
    assert listed == {series.name for series in SERIES}
