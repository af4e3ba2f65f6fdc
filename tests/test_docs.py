"""The docs quote what the tests run: every ``<!-- snippet: PATH -->`` in docs/ is followed by
a fenced block equal to that file, and every client example is quoted somewhere.  And the
pages point at what is there: every file of docs/measurements and docs/img is cited by a
page, every cited file, relative link and project path exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNIPPET = re.compile(r"<!-- snippet: (\S+) -->\n```[a-z]*\n(.*?)\n```", re.S)
EXAMPLES = ["tests/clients/python/*.py", "tests/clients/vercel/*.mjs", "tests/clients/codex/*"]


def snippets() -> dict[str, str]:
    out = {}
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for path, body in SNIPPET.findall(doc.read_text()):
            out[path] = body
    return out


def test_every_snippet_is_the_file_it_names():
    found = snippets()
    assert found, "no snippets in docs/"
    for path, body in found.items():
        assert (ROOT / path).is_file(), f"snippet of a missing file {path}"
        assert body == (ROOT / path).read_text().rstrip(), f"docs quote {path} differently from the file"


def test_every_client_example_is_quoted_in_the_docs():
    quoted = set(snippets())
    examples = {str(p.relative_to(ROOT)) for pattern in EXAMPLES for p in ROOT.glob(pattern)}
    assert examples and examples <= quoted, sorted(examples - quoted)


# docs/measurements holds the data behind the pages' figures and docs/img their plots: a file
# no page cites is not kept, and a page cites no file that is not there.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DATA_DIRS = ("measurements", "img")
CITED = re.compile(r"(?<![\w/.-])(?:docs/)?(measurements|img)/([\w.-]+\.[a-z]+)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def cited() -> dict[str, set[str]]:
    """``docs/measurements/X`` or ``docs/img/X`` → the pages that cite it."""
    out: dict[str, set[str]] = {}
    for page in PAGES:
        for folder, name in CITED.findall(page.read_text()):
            out.setdefault(f"docs/{folder}/{name}", set()).add(page.name)
    return out


def test_every_measurement_and_image_is_cited_by_a_page():
    kept = {str(p.relative_to(ROOT)) for d in DATA_DIRS for p in (ROOT / "docs" / d).iterdir()}
    assert kept, "docs/measurements and docs/img are empty"
    assert sorted(kept - set(cited())) == []


def test_every_cited_measurement_and_image_exists():
    missing = {path: pages for path, pages in cited().items() if not (ROOT / path).is_file()}
    assert missing == {}


def test_every_relative_link_in_the_pages_exists():
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in PAGES
        for target in LINK.findall(page.read_text())
        if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()
    ]
    assert broken == []


# A link's #fragment into a page of the docs names one of its headings, as GitHub makes
# anchors of them: lower case, punctuation dropped, spaces as hyphens, repeats numbered.
FRAGMENT_LINK = re.compile(r"\]\(([^)\s#]*\.md|)#([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def test_anchors_follow_githubs_rule():
    page = ROOT / "docs" / "protocol-transport.md"
    assert {"1-transport", "11-endpoint-and-upgrade", "6-http-mode"} <= anchors(page)


def test_every_link_to_a_section_names_a_heading_of_its_page():
    broken = []
    for page in PAGES:
        for target, fragment in FRAGMENT_LINK.findall(FENCE.sub("", page.read_text())):
            linked = (page.parent / target) if target else page
            if linked.is_file() and fragment not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}#{fragment}")
    assert broken == []


# A path of the project named in `code` in a page: it exists (a module moved or renamed is
# renamed in the docs too).  Examples of a client's files are not the project's.
PROJECT_PATH = re.compile(
    r"`((?:actors|serve|inference|store|bench|investigations|tests|configs|docs)/[\w/.-]*\w)"
)
NOT_PROJECT_PATHS = {
    "tests/test_parser.py"
}  # docs/emulator.md: paths the scripted model reads in a client's checkout


def test_every_project_path_named_in_the_pages_exists():
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in PAGES
        for path in PROJECT_PATH.findall(page.read_text())
        if path not in NOT_PROJECT_PATHS and "KIND" not in path and not (ROOT / path).exists()
    ]
    assert missing == []


def test_the_map_lists_every_bench_kind():
    """docs/README.md's row for the benchmarks names every kind ``responses-ws bench`` runs."""
    from bench import ALIASES, KINDS

    row = next(
        line
        for line in (ROOT / "docs" / "README.md").read_text().splitlines()
        if "responses-ws bench <kind>" in line
    )
    assert [k for k in KINDS if not re.search(rf"\b{k}\b", row)] == []
    variants = [f"`{v.name}`" for kind in KINDS.values() for v in kind.variants]
    assert [v for v in variants if v not in row] == []
    assert [a for a in ALIASES if f"`{a}`" not in row] == []


def test_the_protocol_reference_stays_in_pages_a_reader_can_search():
    """docs/protocol.md is the index; each page of the reference stays under ~30 KB."""
    pages = sorted((ROOT / "docs").glob("protocol*.md"))
    assert len(pages) > 1
    assert {p.name: p.stat().st_size for p in pages if p.stat().st_size > 30_000} == {}
    index = (ROOT / "docs" / "protocol.md").read_text()
    assert [p.name for p in pages if p.name != "protocol.md" and f"]({p.name})" not in index] == []
