"""The operations tier starts the suite's children (tests/conftest.py, ``children``) at its
first test that runs without the embedded Ray, so that they start while the tests that need
none of them run."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def children_started(request) -> None:
    """Every test here that runs without the embedded Ray asks for the launcher: the first
    one starts it.  The tests on the embedded Ray need none of the children, and run in the
    embedded Ray's worker (tests/conftest.py, the xdist groups)."""
    if "ray_cluster" not in request.fixturenames:
        request.getfixturevalue("children")
