"""What real clients put on the upgrade and around their creates (docs/protocol.md §1.2,
§2.4), against the suite's server with a raw ``websockets`` client: the subprotocol
``openai-beta.responses.v1`` is echoed when offered (and only then); Codex's
``OpenAI-Beta: responses_websockets=2026-02-06`` and ``x-codex-turn-state`` headers, its
``client_metadata`` and the ``response.processed`` it sends after each response are accepted
and change nothing."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from tests.support.wire import raw_collect

SUBPROTOCOL = "openai-beta.responses.v1"
CODEX_HEADERS = {"OpenAI-Beta": "responses_websockets=2026-02-06", "x-codex-turn-state": "ts_1"}


def create(**body) -> str:
    return json.dumps(
        {
            "type": "response.create",
            "model": "emu-fast",
            "store": False,
            "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "3"},
            **body,
        }
    )


@pytest.mark.parametrize(
    "offered, echoed",
    [([SUBPROTOCOL], SUBPROTOCOL), (["chat", SUBPROTOCOL], SUBPROTOCOL), (None, None), (["chat"], None)],
)
def test_the_responses_subprotocol_is_echoed_when_offered_and_only_then(ws_url, offered, echoed):
    async def main():
        async with websockets.connect(ws_url, subprotocols=offered) as ws:
            header = ws.response.headers.get("Sec-WebSocket-Protocol")
            await ws.send(create(input="hi"))
            return ws.subprotocol, header, await raw_collect(ws)

    subprotocol, header, events = asyncio.run(main())
    assert (subprotocol, header) == (echoed, echoed)
    assert events[-1]["type"] == "response.completed"


def test_codex_headers_client_metadata_and_response_processed_are_accepted(ws_url):
    """Codex's wire, turn after turn: its headers on the upgrade, ``stream: true`` and
    ``client_metadata`` with ``x-codex-turn-state`` on each create, ``response.processed``
    after each response — no error event, and the chain continues."""

    async def main():
        frames = []
        async with websockets.connect(ws_url, additional_headers=CODEX_HEADERS) as ws:
            previous = None
            for turn in range(3):
                await ws.send(
                    create(
                        input=f"turn {turn}",
                        stream=True,
                        previous_response_id=previous,
                        client_metadata={"x-codex-turn-state": f"ts_{turn}"},
                        prompt_cache_key="codex-session",
                    )
                )
                events = await raw_collect(ws)
                frames += events
                previous = events[-1]["response"]["id"]
                await ws.send(json.dumps({"type": "response.processed", "response_id": previous}))
            # Nothing answers a response.processed: the next frame is the next create's.
            await ws.send(create(input="last", previous_response_id=previous))
            frames += await raw_collect(ws)
        return frames

    frames = asyncio.run(main())
    assert [f["type"] for f in frames if f["type"] in ("error", "response.failed")] == []
    terminals = [f["response"] for f in frames if f["type"] == "response.completed"]
    assert len(terminals) == 4
    assert [t["previous_response_id"] for t in terminals[1:]] == [t["id"] for t in terminals[:-1]]
