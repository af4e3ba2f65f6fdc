"""API keys and ownership (docs/protocol.md §1.2, §6.2).

With no keys configured any bearer key (or none) is accepted; with keys configured a
missing or unknown key is refused with 401 ``invalid_api_key`` — on HTTP and on the
WebSocket upgrade alike.  ``Authorization: Bearer`` and Azure's ``api-key`` header are both
accepted.  A response belongs to the *owner* its key maps to: a fingerprint of the key, so
the key itself is never stored.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from actors.errors import InvalidAPIKey

ANONYMOUS = "anonymous"


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries (header names lower-case)."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    key = headers.get("api-key", "").strip()
    return key or None


def fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class KeyRing:
    def __init__(self, keys: tuple[str, ...]) -> None:
        self._fingerprints = frozenset(fingerprint(k) for k in keys)

    def owner(self, headers: Mapping[str, str]) -> str:
        """The owner of a request's responses; raises :class:`InvalidAPIKey` when refused."""
        key = presented_key(headers)
        if not self._fingerprints:
            return fingerprint(key) if key else ANONYMOUS
        if key is not None:
            fp = fingerprint(key)
            if any(hmac.compare_digest(fp, known) for known in self._fingerprints):
                return fp
        raise InvalidAPIKey()
