"""Read-your-writes: a ``store:true`` response is readable everywhere the moment the client
is told it completed — its record is written before the terminal event goes out
(docs/http-and-store.md).  Each scenario runs 40 times back to back: a write that landed
behind the response showed up as a 404 in 22-45 of 100 GETs, so 40 turns all pass by
chance with odds of at most 0.78**40, under 1 in 20 000 (100 turns added only time)."""

from __future__ import annotations

import asyncio
import json

import httpx
import websockets

from bench.client import FINAL_EVENT_TYPES

MODEL = "emu-fast"
N = 40  # see the module docstring
KEY = {"Authorization": "Bearer sk-read-your-writes"}
SHORT = {"emulator.text_tokens": "3"}  # short answers: the scenario is the store, not the model


async def raw_collect(ws: websockets.ClientConnection) -> list[dict]:
    """The frames of one response, up to its terminal event (or an error)."""
    events = [json.loads(await ws.recv())]
    while events[-1]["type"] not in FINAL_EVENT_TYPES:
        events.append(json.loads(await ws.recv()))
    return events


def create(**body) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "store": True, "metadata": SHORT, **body})


async def completed(ws: websockets.ClientConnection, **body) -> dict:
    await ws.send(create(**body))
    events = await raw_collect(ws)
    assert events[-1]["type"] == "response.completed", events[-1]
    return events[-1]["response"]


def test_40_stored_responses_over_a_websocket_are_each_found_by_a_get_right_after_completed(
    server_url, ws_url
):
    async def main() -> list[int]:
        statuses = []
        async with (
            httpx.AsyncClient(base_url=server_url, headers=KEY, timeout=30) as http,
            websockets.connect(ws_url, additional_headers=KEY) as ws,
        ):
            for i in range(N):
                response = await completed(ws, input=f"turn {i}")
                got = await http.get(f"/v1/responses/{response['id']}")
                statuses.append(got.status_code)
                if got.status_code == 200:
                    assert got.json() == response
        return statuses

    assert asyncio.run(main()) == [200] * N


def test_40_stored_responses_are_each_continued_on_another_socket_right_after_completed(ws_url):
    """Two sockets (two session actors) take turns continuing one conversation: every turn
    loads its parent, written by the other socket a moment before, from the store."""

    async def main() -> list[str]:
        outcomes = []
        async with (
            websockets.connect(ws_url, additional_headers=KEY) as one,
            websockets.connect(ws_url, additional_headers=KEY) as other,
        ):
            previous = None
            for i in range(N):
                ws = (one, other)[i % 2]
                await ws.send(create(input=f"turn {i}", previous_response_id=previous))
                last = (await raw_collect(ws))[-1]
                outcomes.append(last["type"] if last["type"] != "error" else last["error"]["code"])
                previous = last["response"]["id"] if last["type"] == "response.completed" else previous
        return outcomes

    assert asyncio.run(main()) == ["response.completed"] * N


def test_40_stored_http_responses_are_each_continued_over_a_websocket_right_after_they_return(
    server_url, ws_url
):
    async def main() -> list[str]:
        outcomes = []
        async with (
            httpx.AsyncClient(base_url=server_url, headers=KEY, timeout=30) as http,
            websockets.connect(ws_url, additional_headers=KEY) as ws,
        ):
            for i in range(N):
                posted = await http.post(
                    "/v1/responses",
                    json={"model": MODEL, "input": f"turn {i}", "store": True, "metadata": SHORT},
                )
                assert posted.status_code == 200, posted.text
                await ws.send(
                    create(input="and then?", previous_response_id=posted.json()["id"], store=False)
                )
                last = (await raw_collect(ws))[-1]
                outcomes.append(last["type"] if last["type"] != "error" else last["error"]["code"])
        return outcomes

    assert asyncio.run(main()) == ["response.completed"] * N
