"""Which web pages may use the server (``server.allowed_origins``, docs/reliability.md).

Browsers let any page open a WebSocket to ``127.0.0.1`` and send it simple POSTs, and they
say which page asks in the ``Origin`` header.  A request that carries an ``Origin`` outside
the allow-list is refused (403); one without (SDKs, CLIs, curl) is not affected.  An entry
is an origin (``https://app.example.com``, ``http://localhost:3000``), an origin with any
port (``http://localhost:*``), or ``*`` (every page).  The default allows pages served from
this machine's loopback names only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

ANY = "*"
DEFAULT_PORTS = {"http": 80, "https": 443}
LOOPBACK_ORIGINS = tuple(
    f"{scheme}://{host}:*" for scheme in ("http", "https") for host in ("localhost", "127.0.0.1", "[::1]")
)


@dataclass(frozen=True, slots=True)
class Origin:
    """``scheme://host:port``; ``port`` ``None`` in an entry: any port."""

    scheme: str
    host: str
    port: int | None


def parse_origin(text: str, *, any_port: bool = False) -> Origin:
    """An ``Origin`` header value or an allow-list entry (``any_port``: ``:*`` allowed);
    ``ValueError`` for anything that is not ``scheme://host[:port]``."""
    wildcard = any_port and text.endswith(":*")
    parts = urlsplit(text[:-2] if wildcard else text)
    if (
        parts.scheme not in DEFAULT_PORTS
        or not parts.hostname
        or parts.path
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise ValueError(f"{text!r} is not an origin (scheme://host[:port], scheme http or https)")
    port = None if wildcard else (parts.port or DEFAULT_PORTS[parts.scheme])  # .port: ValueError if bad
    return Origin(parts.scheme, parts.hostname.lower(), port)


class OriginPolicy:
    def __init__(self, allowed: Iterable[str]) -> None:
        entries = tuple(allowed)
        self._any = ANY in entries
        self._allowed = [parse_origin(e, any_port=True) for e in entries if e != ANY]

    def allows(self, origin: str | None) -> bool:
        """May a request with this ``Origin`` header (``None``: none) be served?"""
        if origin is None or self._any:
            return True
        try:
            asked = parse_origin(origin)
        except ValueError:  # "null" (a file or a sandboxed frame), or garbage
            return False
        return any(
            a.scheme == asked.scheme and a.host == asked.host and a.port in (None, asked.port)
            for a in self._allowed
        )
