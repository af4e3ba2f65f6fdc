"""The upgrade's subprotocol negotiation (docs/protocol.md §1.2): ``openai-beta.responses.v1``
is echoed when offered, and only then; other offers are accepted without a subprotocol."""

from __future__ import annotations

import pytest
from websockets.datastructures import Headers
from websockets.http11 import Request
from websockets.server import ServerProtocol

from actors.host.subprotocols import RESPONSES_SUBPROTOCOL, select_subprotocol


def upgrade(offer: str | None) -> Request:
    headers = Headers(
        {
            "Host": "127.0.0.1",
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        }
    )
    if offer is not None:
        headers["Sec-WebSocket-Protocol"] = offer
    return Request("/v1/responses", headers)


@pytest.mark.parametrize(
    "offer, echoed",
    [
        ("openai-beta.responses.v1", "openai-beta.responses.v1"),
        ("chat, openai-beta.responses.v1", "openai-beta.responses.v1"),
        (None, None),
        ("chat", None),
    ],
)
def test_the_responses_subprotocol_is_echoed_only_when_offered(offer, echoed):
    protocol = ServerProtocol(select_subprotocol=select_subprotocol)
    response = protocol.accept(upgrade(offer))
    assert response.status_code == 101  # an offer without ours is not refused
    assert response.headers.get("Sec-WebSocket-Protocol") == echoed
    assert RESPONSES_SUBPROTOCOL == "openai-beta.responses.v1"
