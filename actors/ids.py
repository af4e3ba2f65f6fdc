"""Identifier helper: every id on the wire comes from here (``resp_``, ``msg_``, ``fc_``, ``call_``)."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """A fresh id like OpenAI's: ``<prefix>_<48 hex chars>``."""
    return f"{prefix}_{secrets.token_hex(24)}"
