"""Every page of docs/ stays readable in one sitting: none passes 30 KB.  A page that grows past
it is split by reader and topic (docs/README.md lists the pages), not trimmed of facts."""

from __future__ import annotations

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
LIMIT_BYTES = 30 * 1024
PAGES = sorted(DOCS.glob("*.md"))


def test_docs_has_pages():
    assert len(PAGES) > 10, PAGES


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_page_passes_30_kb(page: Path):
    size = len(page.read_bytes())
    assert size <= LIMIT_BYTES, f"docs/{page.name} is {size} bytes, over {LIMIT_BYTES}: split it"
