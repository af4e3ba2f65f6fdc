"""WebSocket mode with a raw ``websockets`` client: bad input, limits, disconnects.

Test names carry the docs/protocol.md §7 check numbers they cover.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets
from ray import serve
from websockets.exceptions import ConnectionClosed

from tests.support.server import start_app, stop_app
from tests.support.waiting import wait_until
from tests.support.wire import raw_collect, validated

MODEL = "emu-fast"
LIMITS_APP = "rws-limits"


def run(coro):
    return asyncio.run(coro)


def create(**body) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "store": False, **body})


@pytest.fixture(scope="module")
def limits_url(ray_cluster):
    """A second app with a 2 s connection lifetime, a 64 KiB frame cap, and deflate
    accepted from loopback peers too."""
    url = start_app(
        LIMITS_APP,
        **{
            "session.connection_lifetime_s": 2.0,
            "session.max_frame_bytes": 64 * 1024,
            "session.deflate": "always",
        },
    )
    yield url.replace("http://", "ws://") + "/v1/responses"
    stop_app(LIMITS_APP)


@pytest.mark.parametrize(
    "frame, code, param",
    [
        ("{oops", "invalid_json", None),
        (json.dumps({"type": "response.cancel"}), "unknown_event_type", "type"),
        (create(input="x", background=True), "invalid_value", "background"),
        (create(input="x", stream_id=""), "invalid_stream_id", "stream_id"),
        (create(input="x", stream_id="x" * 257), "invalid_stream_id", "stream_id"),
        (create(input="x", stream_id="a b"), "invalid_stream_id", "stream_id"),
        (create(input="x", stream_id=7), "invalid_stream_id", "stream_id"),
        (
            create(input=[{"type": "message", "role": "user", "content": 5}]),
            "invalid_type",
            "input[0].content",
        ),
    ],
)
def test_check_10_11_12_43_bad_frames_get_400_and_the_socket_stays_usable(ws_url, frame, code, param):
    async def main():
        async with websockets.connect(ws_url) as ws:
            await ws.send(frame)
            (err,) = await raw_collect(ws)
            await ws.send(create(input="still here"))
            return err, await raw_collect(ws)

    err, after = run(main())
    assert err["type"] == "error" and err["status"] == 400
    assert err["error"]["code"] == code and err["error"]["param"] == param
    assert err["error"]["type"] == "invalid_request_error" and "stream_id" not in err
    assert after[0]["type"] == "response.created" and after[-1]["type"] == "response.completed"


def test_response_processed_is_ignored(ws_url):
    async def main():
        async with websockets.connect(ws_url) as ws:
            await ws.send(json.dumps({"type": "response.processed", "response_id": "resp_x"}))
            await ws.send(create(input="hi"))
            return await raw_collect(ws)

    assert run(main())[0]["type"] == "response.created"


def test_check_05_upgrade_with_or_without_permessage_deflate(ws_url, limits_url):
    """An offer of permessage-deflate is accepted (``session.deflate: always``, the limits
    app) or, by default, declined from a loopback peer; either way the upgrade succeeds."""

    async def main(url, compression):
        async with websockets.connect(url, compression=compression) as ws:
            await ws.send(create(input="hi", max_output_tokens=400))
            return [e.name for e in ws.protocol.extensions], await raw_collect(ws)

    for url, offered, negotiated in (
        (ws_url, "deflate", []),
        (ws_url, None, []),
        (limits_url, "deflate", ["permessage-deflate"]),
        (limits_url, None, []),
    ):
        extensions, events = run(main(url, offered))
        assert extensions == negotiated, (url, offered)
        assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]


def test_check_04_api_key_header_is_accepted(ws_url):
    async def main():
        async with websockets.connect(ws_url, additional_headers={"api-key": "azure-style"}) as ws:
            await ws.send(create(input="hi"))
            return await raw_collect(ws)

    assert run(main())[-1]["type"] == "response.completed"


def test_other_paths_are_not_upgraded(server_url):
    async def main():
        url = server_url.replace("http://", "ws://") + "/v1/other"
        async with websockets.connect(url):
            pass

    with pytest.raises(websockets.exceptions.InvalidStatus) as exc:
        run(main())
    assert exc.value.response.status_code >= 400  # refused: no socket opens


def stats_after_cancel(handle, before: dict) -> dict:
    """The replica's stats once a generation was cancelled and its slot freed."""

    def freed() -> dict | None:
        after = handle.stats.remote().result()
        return after if after["cancelled"] > before["cancelled"] and after["active"] == 0 else None

    return wait_until(freed, 10, "a generation cancelled and its slot freed")


def test_check_50_client_disconnect_mid_response_cancels_generation(ws_url):
    handle = serve.get_deployment_handle("InferenceDeployment", app_name="responses-ws")
    before = handle.stats.remote().result()

    async def main():
        async with websockets.connect(ws_url) as ws:
            # emu-gpu at ~65 tok/s: a long answer is still streaming when we leave.
            await ws.send(create(model="emu-gpu", input="write an essay", max_output_tokens=4000))
            while validated(await ws.recv())["type"] != "response.output_text.delta":
                pass
        # the socket is closed here, mid-response

    run(main())
    after = stats_after_cancel(handle, before)
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["active"] == 0, "the batch slot was freed"


def test_later_turns_go_over_the_direct_channel_and_a_disconnect_still_cancels_them(ws_url):
    """A connection's first call goes through Serve while its host holds no channel to the
    replica picked for it; its next ones stream over the host's direct channel to the pinned
    replica (inference.channel), and leaving mid-response still stops the generation and
    frees its batch slot."""
    handle = serve.get_deployment_handle("InferenceDeployment", app_name="responses-ws")
    before = handle.stats.remote().result()

    def replica_stats() -> dict:
        return handle.stats.remote().result()

    async def main():
        async with websockets.connect(ws_url) as ws:
            previous = None
            for turn in range(20):  # until a turn has gone direct: the channel opens after turn 1
                await ws.send(
                    create(
                        model="emu-fast",
                        input="hi",
                        max_output_tokens=8,
                        store=False,
                        **({"previous_response_id": previous} if previous else {}),
                    )
                )
                while (event := validated(await ws.recv()))["type"] != "response.incomplete":
                    pass  # 8 tokens: the answer stops at max_output_tokens
                previous = event["response"]["id"]
                if (
                    turn > 0
                    and (await asyncio.to_thread(replica_stats))["channel_calls"] > before["channel_calls"]
                ):
                    break
            else:
                raise AssertionError("no turn went over the direct channel")
            await ws.send(
                create(
                    model="emu-gpu",
                    input="write an essay",
                    max_output_tokens=4000,
                    store=False,
                    previous_response_id=previous,
                )
            )
            while validated(await ws.recv())["type"] != "response.output_text.delta":
                pass

    run(main())
    after = stats_after_cancel(handle, before)
    assert after["channel_calls"] >= before["channel_calls"] + 2, "the last two turns at least went direct"
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["active"] == 0, "the batch slot was freed"


def test_a_new_connections_first_turn_goes_over_a_channel_its_host_holds(ws_url):
    """Once a session host holds a channel to the replica the deployment's router would pick
    for a new connection (an earlier connection's turn opened it), that connection's first
    turn streams over it too (``inference.routing.Routes.first_call``, published by the
    router of the host's handle): fresh one-turn connections, until one's turn is counted on
    the channel."""
    handle = serve.get_deployment_handle("InferenceDeployment", app_name="responses-ws")

    def channel_calls() -> int:
        return handle.stats.remote().result()["channel_calls"]

    async def one_turn() -> str:
        async with websockets.connect(ws_url) as ws:
            await ws.send(create(input="hi", max_output_tokens=4))
            while (event := validated(await ws.recv()))["type"] not in (
                "response.completed",
                "response.incomplete",
            ):
                pass
            return event["type"]

    for _ in range(20):  # the gateway may hand a connection to another host, with no channel yet
        before = channel_calls()
        assert run(one_turn()) == "response.incomplete"
        if channel_calls() > before:
            return
    raise AssertionError("no connection's first turn went over a direct channel")


def test_check_07_47_48_idle_connection_lives_until_the_lifetime_then_gets_the_limit_error(limits_url):
    async def main():
        async with websockets.connect(limits_url) as ws:
            t0 = time.monotonic()
            raw = await ws.recv()  # nothing is sent until the lifetime passes
            waited = time.monotonic() - t0
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            return waited, validated(raw), closed.value

    waited, err, closed = run(main())
    assert 1.5 < waited < 5
    assert err == {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "websocket_connection_limit_reached",
            "message": f"Responses websocket connection limit reached ({2 / 60:g} minutes). "
            "Create a new websocket connection to continue.",
            "param": None,
        },
    }
    assert closed.rcvd.code == 1000


def test_frame_over_the_cap_closes_with_1009(limits_url):
    async def main():
        async with websockets.connect(limits_url, max_size=None) as ws:
            await ws.send(create(input="x" * (65 * 1024)))
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            return closed.value

    assert run(main()).rcvd.code == 1009


def test_new_connection_after_a_close_works_immediately(ws_url):
    async def main():
        for _ in range(3):
            async with websockets.connect(ws_url) as ws:
                await ws.send(create(input="hi"))
                assert (await raw_collect(ws))[-1]["type"] == "response.completed"

    run(main())
