"""The gateway front decides, from a peeked request head, who serves a connection."""

from __future__ import annotations

import pytest

from serve.front import is_responses_upgrade


def head(request_line: str, *headers: str) -> bytes:
    return "\r\n".join([request_line, "Host: x", *headers, "", ""]).encode()


@pytest.mark.parametrize("raw, upgrade", [
    (head("GET /v1/responses HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade"), True),
    (head("GET /v1/responses/ HTTP/1.1", "upgrade: WebSocket"), True),
    (head("GET /v1/responses?api-version=1 HTTP/1.1", "Upgrade: websocket"), True),
    (head("GET /v1/responses HTTP/1.1"), False),  # plain GET: HTTP app
    (head("POST /v1/responses HTTP/1.1", "Upgrade: websocket"), False),
    (head("GET /v1/other HTTP/1.1", "Upgrade: websocket"), False),
    (head("GET /v1/responses/resp_1 HTTP/1.1", "Upgrade: websocket"), False),
    (b"garbage", False),
])
def test_only_websocket_upgrades_of_the_responses_path_are_handed_off(raw, upgrade):
    assert is_responses_upgrade(raw) is upgrade
