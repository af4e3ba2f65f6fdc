"""The docs quote what the tests run: every ``<!-- snippet: PATH -->`` in docs/ is followed by
a fenced block equal to that file, and every client example is quoted somewhere."""

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
