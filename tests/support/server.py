"""Test apps on the suite's embedded Ray (the ``ray_cluster`` fixture starts it)."""

from __future__ import annotations

from typing import Any

from serve.embedded import deploy, local_config


def start_app(name: str, **overrides: Any) -> str:
    """Deploy the app as ``name`` on a free port, with ``section.key`` overrides of the
    default config; returns its base URL.  The caller deletes it (``serve.delete(name)``),
    or the end of the test session's Ray takes it."""
    return deploy(local_config(**overrides), name=name)
