"""The operations tier starts the suite's children (tests/conftest.py, ``children``) at its
first test, so that they start while the tests that need none of them run."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def children_started(children) -> None:
    """Every test here asks for the launcher: the first one starts it."""
