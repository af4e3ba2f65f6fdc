"""Resumable connections (opt-in, docs/reliability.md): a dropped socket's state comes back
on a new socket that presents the resume token, within the grace window, with the same key."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets
from ray import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.server import start_app, stop_app
from tests.support.waiting import wait_until
from tests.support.wire import raw_collect, validated

APP = "rws-resume"
GRACE_S = 4.0
HEADER = "x-responses-ws-resume-token"
KEY_A, KEY_B = "key-resume-a", "key-resume-b"
SHORT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "3"}


def run(coro):
    return asyncio.run(coro)


def create(**body) -> str:
    return json.dumps(
        {"type": "response.create", "model": "emu-fast", "store": False, "metadata": SHORT, **body}
    )


@pytest.fixture(scope="module")
def resume_url(ray_cluster):
    url = start_app(APP, **{"session.resume_grace_s": GRACE_S, "server.api_keys": [KEY_A, KEY_B]})
    yield url.replace("http", "ws", 1) + "/v1/responses"
    stop_app(APP)


def connect(url: str, key: str = KEY_A, token: str | None = None):
    headers = {"Authorization": f"Bearer {key}"}
    if token is not None:
        headers[HEADER] = token
    return websockets.connect(url, additional_headers=headers)


async def turn(ws, **body) -> dict:
    await ws.send(create(**body))
    events = await raw_collect(ws)
    return events[-1]


def refusal(exc: InvalidStatus) -> tuple[int, dict]:
    return exc.response.status_code, json.loads(bytes(exc.response.body))


def test_the_token_brings_back_a_dropped_connections_store_false_chain(resume_url):
    async def main():
        ws = await connect(resume_url)
        token = ws.response.headers[HEADER]
        first = await turn(ws, input="remember this " * 700)  # > 1024 tokens: cacheable (OpenAI rule)
        assert first["type"] == "response.completed"
        ws.transport.abort()  # the network drops: no close frame
        async with connect(resume_url, token=token) as again:
            assert again.response.headers[HEADER] == token  # the same token resumes again later
            second = await turn(again, input="and now?", previous_response_id=first["response"]["id"])
            assert second["type"] == "response.completed", second
            # The context came from the connection's memory: only the new input was rendered,
            # and the session's prefix cache (same session) still holds the earlier prompt.
            assert second["response"]["usage"]["input_tokens_details"]["cached_tokens"] > 0
            again.transport.abort()
        async with connect(resume_url, token=token) as third:  # resumable again
            assert (await turn(third, input="x", previous_response_id=second["response"]["id"]))[
                "type"
            ] == "response.completed"

    run(main())


def test_without_the_token_a_reconnected_socket_starts_empty(resume_url):
    async def main():
        async with connect(resume_url) as ws:
            first = await turn(ws, input="hi")
        async with connect(resume_url) as fresh:
            err = await turn(fresh, input="x", previous_response_id=first["response"]["id"])
            assert err["type"] == "error" and err["error"]["code"] == "previous_response_not_found"

    run(main())


def test_a_token_does_not_work_for_another_key_after_the_grace_window_or_when_forged(resume_url):
    async def main():
        ws = await connect(resume_url)
        token = ws.response.headers[HEADER]
        first = await turn(ws, input="secret")
        ws.transport.abort()
        forged = token.rsplit(".", 1)[0] + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
        answers = []
        for key, presented in (
            (KEY_B, token),
            (KEY_A, forged),
            (KEY_A, "garbage"),
            (KEY_A, "rws1.no-such-actor.c.s"),
        ):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(resume_url, key=key, token=presented):
                    pass
            answers.append(refusal(refused.value))
        for status, body in answers:
            assert status == 400 and body["error"]["code"] == "invalid_resume_token"
            assert body["error"]["type"] == "invalid_request_error"
        assert len({json.dumps(b) for _, b in answers}) == 1, "one answer for every reason: nothing leaks"
        # The owner can still resume (the failed attempts changed nothing) ...
        async with connect(resume_url, token=token) as ws2:
            assert (await turn(ws2, input="x", previous_response_id=first["response"]["id"]))[
                "type"
            ] == "response.completed"
        return token

    token = run(main())
    # ... until the grace window has passed since the socket ended: the expired state frees
    # its host slot (no connection holds one any more) ...
    gateway = serve.get_deployment_handle("Gateway", app_name=APP)
    wait_until(
        lambda: (
            (stats := gateway.stats.remote().result())["open_connections"] == 0
            and stats["connections"] == 0
            and stats["starting"] == 0
        ),
        GRACE_S + 15,
        "the parked state to expire and free its host slot",
        every_s=0.2,
    )

    async def late() -> None:  # ... and its token is refused
        with pytest.raises(InvalidStatus) as refused:
            async with connect(resume_url, token=token):
                pass
        assert refusal(refused.value)[1]["error"]["code"] == "invalid_resume_token"

    run(late())


def test_a_resume_takes_over_a_socket_the_server_still_thinks_is_alive(resume_url):
    async def main():
        old = await connect(resume_url)
        token = old.response.headers[HEADER]
        first = await turn(old, input="hi")
        async with connect(resume_url, token=token) as new:
            with pytest.raises(ConnectionClosed) as closed:
                await old.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
            assert (await turn(new, input="x", previous_response_id=first["response"]["id"]))[
                "type"
            ] == "response.completed"

    run(main())


def test_a_response_in_flight_when_the_socket_drops_is_cancelled_and_the_chain_resumes_before_it(resume_url):
    async def main():
        ws = await connect(resume_url)
        token = ws.response.headers[HEADER]
        first = await turn(ws, input="hi")
        await ws.send(
            create(
                model="emu-gpu",
                input="long",
                previous_response_id=first["response"]["id"],
                metadata={"emulator.tool_rounds": "0", "emulator.text_tokens": "2000"},
            )
        )
        while (created := validated(await ws.recv()))["type"] != "response.created":
            pass
        ws.transport.abort()
        t0 = time.monotonic()
        async with connect(resume_url, token=token) as again:
            lost = await turn(again, input="x", previous_response_id=created["response"]["id"])
            assert lost["type"] == "error" and lost["error"]["code"] == "previous_response_not_found"
            retry = await turn(again, input="x", previous_response_id=first["response"]["id"])
            assert retry["type"] == "response.completed"
        assert time.monotonic() - t0 < 20, "the cancelled 2000-token answer did not hold the lane"

    run(main())


def test_when_resume_is_off_no_token_is_given(ws_url):
    async def main():
        async with websockets.connect(ws_url) as ws:
            assert HEADER not in ws.response.headers

    run(main())


def test_the_openai_sdk_reconnects_with_the_token_from_on_reconnecting(resume_url):
    """The SDK reconnects by itself on an abnormal close; its ``on_reconnecting`` hook sends
    the token, so a ``store:false`` chain survives the drop."""
    import socket
    import threading

    from openai import OpenAI

    client = OpenAI(
        base_url=resume_url.replace("ws", "http", 1).removesuffix("/responses"), api_key=KEY_A, max_retries=0
    )
    token: dict[str, str] = {}
    reconnects = []
    first_id: list[str] = []

    def on_reconnecting(event):
        reconnects.append(event.close_code)
        # The agent loop's next turn, sent while (or right after) the SDK reconnects:
        # queued sends are flushed on the new socket.
        threading.Timer(
            0.3,
            lambda: conn.response.create(
                model="emu-fast", input="again", store=False, metadata=SHORT, previous_response_id=first_id[0]
            ),
        ).start()
        return {"extra_headers": token}

    with client.responses.connect(on_reconnecting=on_reconnecting) as conn:
        token[HEADER] = conn._connection.response.headers[HEADER]  # the upgrade's response
        conn.response.create(model="emu-fast", input="hi", store=False, metadata=SHORT)
        first_id.append(next(ev for ev in conn if ev.type == "response.completed").response.id)
        conn._connection.socket.shutdown(socket.SHUT_RDWR)  # the network drops
        last = next(ev for ev in conn if ev.type in ("response.completed", "error"))
    assert reconnects, "the SDK reconnected"
    assert last.type == "response.completed", last
