"""Isolation between connections and API keys, and errors that leak nothing (issue 8).

docs/protocol.md §4.3, §4.8–4.9 (what a connection and a key can see), §5 (typed errors), checks 31–33.
Every "not found" a stranger gets must be the one an unknown id gets: same status, same body
apart from the id, so existence is never revealed.  Real server, raw WebSocket clients (to
choose the API key per socket) and HTTP.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import websockets
from openai import OpenAI

from serve.auth import fingerprint
from serve.embedded import free_port
from tests.support.server import ALICE, BOB, busy_profiles, running_apps
from tests.support.waiting import until, wait_until
from tests.support.wire import raw_collect, validated

MODEL = "emu-fast"
TEXT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "8"}  # a short text answer
GENERIC_500 = "The server had an error while processing your request."

SEEN_IDS: set[str] = set()  # every response id this module saw, for the metric-label check
MARKERS: set[str] = set()  # user text sent by this module, likewise


# ----------------------------------------------------------------------------- helpers


def marker(label: str) -> str:
    """A piece of user text that must never show up outside its owner's responses."""
    text = f"{label}-{secrets.token_hex(6)}"
    MARKERS.add(text)
    return text


def unknown_id() -> str:
    """A response id of the real shape (``resp_`` + 48 hex digits) that was never issued."""
    return "resp_" + secrets.token_hex(24)


def masked(body: Any, response_id: str) -> str:
    """``body`` as JSON with ``response_id`` replaced, to compare it with an unknown id's."""
    return json.dumps(body, sort_keys=True).replace(response_id, "<id>")


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://", 1) + "/v1/responses"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@asynccontextmanager
async def connect(url: str, key: str) -> AsyncIterator[Any]:
    async with websockets.connect(
        ws_url(url), additional_headers=auth(key), max_size=None, open_timeout=120
    ) as ws:  # may start a session actor
        yield ws


async def turn(ws: Any, **body: Any) -> list[dict[str, Any]]:
    """One ``response.create`` and its frames up to the terminal event (or ``error``)."""
    await ws.send(json.dumps({"type": "response.create", "model": MODEL, **body}))
    events = await raw_collect(ws)
    for ev in events:
        if "response" in ev:
            SEEN_IDS.add(ev["response"]["id"])
    return events


def only_error(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(events) == 1 and events[0]["type"] == "error", [e["type"] for e in events]
    return events[0]


async def next_of(ws: Any, prefix: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The next frame whose type starts with ``prefix`` (frames before it are skipped)."""

    async def read() -> dict[str, Any]:
        while True:
            ev = validated(await ws.recv())
            if ev["type"].startswith(prefix):
                return ev

    return await asyncio.wait_for(read(), timeout_s)


async def wait_stored(http: httpx.AsyncClient, response_id: str, key: str, timeout_s: float = 15.0) -> dict:
    """The owner's GET of a response a session actor stored (its writes are write-behind)."""

    async def stored() -> httpx.Response | None:
        r = await http.get(f"/v1/responses/{response_id}", headers=auth(key))
        return r if r.status_code == 200 else None

    return (await until(stored, timeout_s, f"the owner's GET of {response_id}", every_s=0.1)).json()


# --------------------------------------------------- store:false ids stay on their socket


def test_a_store_false_id_is_unknown_to_every_other_connection_and_to_http(keyed_url):
    async def main():
        async with (
            connect(keyed_url, ALICE) as a,
            connect(keyed_url, ALICE) as a2,
            connect(keyed_url, BOB) as b,
            httpx.AsyncClient(base_url=keyed_url, timeout=60) as http,
        ):
            done = (await turn(a, input=marker("alice-private"), store=False, metadata=TEXT))[-1]
            rid, other = done["response"]["id"], unknown_id()
            out: dict[str, Any] = {}
            for name, ws in (("same key", a2), ("other key", b)):
                out[name] = [
                    only_error(
                        await turn(ws, input="x", store=False, previous_response_id=pid, metadata=TEXT)
                    )
                    for pid in (rid, other)
                ]
                out[name + ", stored continuation"] = [
                    only_error(await turn(ws, input="x", store=True, previous_response_id=pid, metadata=TEXT))
                    for pid in (rid, other)
                ]
            for key in (ALICE, BOB):
                out[f"http get {key}"] = [
                    await http.get(f"/v1/responses/{pid}", headers=auth(key)) for pid in (rid, other)
                ]
                out[f"http continue {key}"] = [
                    await http.post(
                        "/v1/responses",
                        headers=auth(key),
                        json={"model": MODEL, "input": "x", "previous_response_id": pid, "metadata": TEXT},
                    )
                    for pid in (rid, other)
                ]
            # The socket that made it still continues from it: nothing above disturbed its cache.
            again = await turn(a, input="go on", store=False, previous_response_id=rid, metadata=TEXT)
            return rid, other, out, again

    rid, other, out, again = asyncio.run(main())
    for name, (theirs, unknown) in out.items():
        if isinstance(theirs, httpx.Response):
            assert theirs.status_code == unknown.status_code, name
            theirs, unknown = theirs.json(), unknown.json()
            assert ("get" in name) == (theirs["error"]["code"] is None), (name, theirs)
            if "continue" in name:
                assert theirs["error"]["code"] == "previous_response_not_found"
        else:
            assert theirs["status"] == 400 and theirs["error"]["code"] == "previous_response_not_found", name
            assert theirs["error"]["param"] == "previous_response_id"
        assert masked(theirs, rid) == masked(unknown, other), name
    assert out["http get " + ALICE][0].status_code == 404
    assert again[-1]["type"] == "response.completed"
    assert again[-1]["response"]["previous_response_id"] == rid


# ------------------------------------------------- store:true responses belong to their key


@pytest.fixture(params=["keys configured", "any key accepted"])
def app_url(request, server_url):
    """Ownership holds with configured keys and, per presented key, without any."""
    return request.getfixturevalue("keyed_url") if request.param == "keys configured" else server_url


def test_a_stored_response_is_invisible_to_another_key_and_survives_its_attempts(app_url):
    async def main():
        async with connect(app_url, ALICE) as a, httpx.AsyncClient(base_url=app_url, timeout=60) as http:
            done = (await turn(a, input=marker("alice-stored"), store=True, metadata=TEXT))[-1]
            rid, other = done["response"]["id"], unknown_id()
            before = await wait_stored(http, rid, ALICE)
            items_before = (await http.get(f"/v1/responses/{rid}/input_items", headers=auth(ALICE))).json()

            def bob_http(pid: str) -> list:
                return [
                    http.get(f"/v1/responses/{pid}", headers=auth(BOB)),
                    http.get(f"/v1/responses/{pid}/input_items", headers=auth(BOB)),
                    http.get(f"/v1/responses/{pid}/input_items?order=asc&limit=1", headers=auth(BOB)),
                    http.post(
                        "/v1/responses",
                        headers=auth(BOB),
                        json={"model": MODEL, "input": "x", "previous_response_id": pid, "metadata": TEXT},
                    ),
                    http.post(
                        "/v1/responses/compact",
                        headers=auth(BOB),
                        json={"model": MODEL, "previous_response_id": pid},
                    ),
                    http.delete(f"/v1/responses/{pid}", headers=auth(BOB)),
                ]

            theirs = [await call for call in bob_http(rid)]
            unknown = [await call for call in bob_http(other)]
            async with connect(app_url, BOB) as b:
                ws_theirs = only_error(await turn(b, input="x", previous_response_id=rid, metadata=TEXT))
                ws_unknown = only_error(await turn(b, input="x", previous_response_id=other, metadata=TEXT))
            after = (await http.get(f"/v1/responses/{rid}", headers=auth(ALICE))).json()
            items_after = (await http.get(f"/v1/responses/{rid}/input_items", headers=auth(ALICE))).json()
            http_next = await http.post(
                "/v1/responses",
                headers=auth(ALICE),
                json={"model": MODEL, "input": "and then?", "previous_response_id": rid, "metadata": TEXT},
            )
            async with connect(app_url, ALICE) as a2:  # a new socket: loaded from the store
                ws_next = await turn(a2, input="and then?", previous_response_id=rid, metadata=TEXT)
            return (
                rid,
                other,
                theirs,
                unknown,
                (ws_theirs, ws_unknown),
                (before, after, items_before, items_after),
                http_next,
                ws_next,
            )

    rid, other, theirs, unknown, ws_pair, kept, http_next, ws_next = asyncio.run(main())
    assert [r.status_code for r in theirs] == [404, 404, 404, 400, 400, 404]
    for mine, ref in zip(theirs, unknown):
        assert mine.status_code == ref.status_code, mine.request.url
        assert masked(mine.json(), rid) == masked(ref.json(), other), mine.request.url
        assert rid not in mine.text.replace(f"'{rid}'", ""), "only the id the caller sent is echoed"
    assert {r.json()["error"]["code"] for r in theirs[3:5]} == {"previous_response_not_found"}
    ws_theirs, ws_unknown = ws_pair
    assert ws_theirs["error"]["code"] == "previous_response_not_found"
    assert masked(ws_theirs, rid) == masked(ws_unknown, other)
    before, after, items_before, items_after = kept
    assert after == before and items_after == items_before and items_before["data"], "bob changed nothing"
    assert http_next.status_code == 200 and http_next.json()["previous_response_id"] == rid
    assert ws_next[-1]["type"] == "response.completed"


# ------------------------------------------- steering or cancelling someone else's response


def test_steer_or_cancel_of_another_connections_response_is_refused_and_changes_nothing(keyed_url):
    long_text = {"emulator.tool_rounds": "0", "emulator.text_tokens": "4000"}  # ~4 s on emu-fast

    async def main():
        async with (
            connect(keyed_url, ALICE) as a,
            connect(keyed_url, ALICE) as a2,
            connect(keyed_url, BOB) as b,
            httpx.AsyncClient(base_url=keyed_url, timeout=60) as http,
        ):
            await a.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "store": True,
                        "input": marker("long-answer"),
                        "metadata": long_text,
                    }
                )
            )
            created = await next_of(a, "response.created")
            rid, other = created["response"]["id"], unknown_id()
            SEEN_IDS.add(rid)
            a_events = asyncio.create_task(raw_collect(a))
            refusals: dict[str, list[Any]] = {}
            for name, ws in (("same key", a2), ("other key", b)):
                pair = []
                for pid in (rid, other):
                    await ws.send(
                        json.dumps(
                            {
                                "type": "response.steer",
                                "previous_response_id": pid,
                                "input": "stop and say something else",
                            }
                        )
                    )
                    pair.append(await next_of(ws, "response.steer"))
                refusals["steer, " + name] = pair
                pair = []
                for pid in (rid, other):  # the protocol has no cancel event: a typed 400 either way
                    await ws.send(json.dumps({"type": "response.cancel", "response_id": pid}))
                    pair.append(await next_of(ws, "error"))
                refusals["cancel event, " + name] = pair
            for key in (ALICE, BOB):
                refusals["http cancel, " + key] = [
                    await http.post(f"/v1/responses/{pid}/cancel", headers=auth(key)) for pid in (rid, other)
                ]
            in_flight = not a_events.done()
            a_done = await a_events
            # Completed now: another socket still cannot tell it exists, its own socket can.
            await b.send(json.dumps({"type": "response.steer", "previous_response_id": rid, "input": "x"}))
            late_other = await next_of(b, "response.steer")
            await a.send(json.dumps({"type": "response.steer", "previous_response_id": rid, "input": "x"}))
            late_own = await next_of(a, "response.steer")
            return rid, other, refusals, a_done, in_flight, late_other, late_own

    rid, other, refusals, a_done, in_flight, late_other, late_own = asyncio.run(main())
    assert in_flight, "the refusals must have happened while the response was streaming"
    for name, (theirs, unknown) in refusals.items():
        if isinstance(theirs, httpx.Response):
            assert theirs.status_code == unknown.status_code == 404, name
            theirs, unknown = theirs.json(), unknown.json()
        elif name.startswith("steer"):
            assert theirs["type"] == "response.steer.failed", (name, theirs)
            assert theirs["error"]["code"] == "response_not_found", name
        else:
            assert theirs["status"] == 400 and theirs["error"]["type"] == "invalid_request_error", name
        assert masked(theirs, rid) == masked(unknown, other), name
    assert not any(ev["type"].startswith("response.steer") for ev in a_done)
    final = a_done[-1]
    assert final["type"] == "response.completed" and final["response"]["usage"]["output_tokens"] == 4000
    assert late_other["type"] == late_own["type"] == "response.steer.failed"
    assert late_other["error"]["code"] == "response_not_found"
    assert late_own["error"]["code"] == "response_already_completed"


def test_unserved_routes_answer_with_a_typed_error_body(keyed_url):
    """No cancel route exists (docs/protocol.md §6.7 makes it optional): a typed 404, whoever asks."""
    rid = unknown_id()
    for method, path in (
        ("POST", f"/v1/responses/{rid}/cancel"),
        ("GET", "/v1/nothing-here"),
        ("PUT", f"/v1/responses/{rid}"),
    ):
        r = httpx.request(method, keyed_url + path, headers=auth(ALICE))
        assert r.status_code in (404, 405), (method, path, r.status_code)
        assert set(r.json().get("error", {})) == {"message", "type", "param", "code"}, (method, path, r.text)


# ------------------------------------------------------------------- the prefix (KV) cache


def long_prompt(tag: str) -> str:
    """~3000 tokens of plain text (the emulator reports cached tokens from 1024 on)."""
    lines = [
        f"Record {i} of batch {tag}: the parcel in bay {i * 7 % 13} weighs {i % 11} kilos."
        for i in range(160)
    ]
    return "\n".join(lines)


def cached(events: list[dict[str, Any]]) -> int:
    done = events[-1]
    assert done["type"] == "response.completed", done
    return done["response"]["usage"]["input_tokens_details"]["cached_tokens"]


def test_the_prefix_cache_is_private_to_an_api_key(keyed_url):
    prompt = long_prompt(marker("kv"))

    async def main():
        async with connect(keyed_url, ALICE) as a:
            first = await turn(a, input=prompt, store=False, metadata=TEXT)
            own_resend = await turn(a, input=prompt, store=False, metadata=TEXT)
        async with connect(keyed_url, BOB) as b:
            other_key = await turn(b, input=prompt, store=False, metadata=TEXT)
        async with connect(keyed_url, ALICE) as a2:
            same_key = await turn(a2, input=prompt, store=False, metadata=TEXT)
        return first, own_resend, other_key, same_key

    first, own_resend, other_key, same_key = asyncio.run(main())
    assert first[-1]["response"]["usage"]["input_tokens"] > 2048
    assert cached(first) == 0
    assert cached(own_resend) >= 1024, "the connection reuses its own KV (the control)"
    assert cached(other_key) == 0, "another key's fresh connection reuses nothing"
    assert cached(same_key) >= 1024, "the same key's new connection may reuse it (check 27)"


def test_the_prefix_cache_is_not_shared_between_keys_over_http(keyed_url):
    prompt = long_prompt(marker("kv-http"))
    body = {"model": MODEL, "input": prompt, "store": False, "metadata": TEXT}
    alice = OpenAI(base_url=keyed_url + "/v1", api_key=ALICE, max_retries=0)
    bob = OpenAI(base_url=keyed_url + "/v1", api_key=BOB, max_retries=0)
    first = alice.responses.create(**body)
    second = alice.responses.create(**body)
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert second.usage.input_tokens_details.cached_tokens >= 1024, "shared within a key (the control)"
    assert bob.responses.create(**body).usage.input_tokens_details.cached_tokens == 0


# ---------------------------------------------------------------------- internal faults


DEAD_STORE_APP, BUSY_APP = "rws-iso-deadstore", "rws-iso-busy"


@pytest.fixture(scope="module")
def fault_apps(ray_cluster) -> Iterator[dict[str, str]]:
    """The module's two apps of internal faults, deployed at once (``running_apps``): an app
    whose Redis store is unreachable (nothing listens on the port), its ``store:false``
    lines journaled (``store.ledger: journal``; with ``commit``, Redis's default, such a
    response fails unbilled: tests/actors/host/test_connection.py); and an app whose
    inference replica runs one sequence and queues none (overload is reachable)."""
    with running_apps(
        {
            DEAD_STORE_APP: {
                "store.backend": "redis",
                "store.redis_url": f"redis://127.0.0.1:{free_port()}/0",
                "store.ledger": "journal",
                "store.write_retry_s": 0,  # one retry at once: the store does not come back here
            },
            BUSY_APP: {"inference.profiles": busy_profiles()},
        }
    ) as urls:
        yield urls


@pytest.fixture(scope="module")
def dead_store_url(fault_apps) -> str:
    return fault_apps[DEAD_STORE_APP]


LEAK_HINTS = re.compile(
    r"redis|error \d|errno|refused|traceback|exception|127\.0\.0\.1|\.py|/|<|>|\\n", re.IGNORECASE
)


def assert_clean(message: str) -> None:
    assert not LEAK_HINTS.search(message), message


def test_an_unreachable_store_gives_typed_errors_without_internals(dead_store_url):
    async def main():
        async with (
            connect(dead_store_url, "sk-iso") as ws,
            httpx.AsyncClient(base_url=dead_store_url, headers=auth("sk-iso"), timeout=60) as http,
        ):  # one keep-alive connection
            stored = await turn(ws, input=marker("store-down"), store=True, metadata=TEXT)
            rid = stored[-1]["response"]["id"]
            from_other_socket = []
            async with connect(dead_store_url, "sk-iso") as ws2:
                from_other_socket = await turn(ws2, input="x", previous_response_id=rid, metadata=TEXT)
            calls = {
                "get": await http.get(f"/v1/responses/{rid}"),
                "input_items": await http.get(f"/v1/responses/{rid}/input_items"),
                "delete": await http.delete(f"/v1/responses/{rid}"),
                "compact": await http.post(
                    "/v1/responses/compact", json={"model": MODEL, "previous_response_id": rid}
                ),
                "continue": await http.post(
                    "/v1/responses",
                    json={"model": MODEL, "input": "x", "previous_response_id": rid, "metadata": TEXT},
                ),
            }
            usable = (
                (await http.get("/v1/models")).status_code,
                (
                    await http.post(
                        "/v1/responses",
                        json={"model": MODEL, "input": "hi", "store": False, "metadata": TEXT},
                    )
                ).status_code,
            )
            still_streaming = await turn(ws, input="are you there?", store=False, metadata=TEXT)
            return rid, stored, from_other_socket, calls, usable, still_streaming

    rid, stored, from_other_socket, calls, usable, still_streaming = asyncio.run(main())
    # The record is written before the terminal event (read-your-writes): a store that cannot
    # take it fails that response with the typed, retryable store_unavailable, never a silent loss.
    assert stored[-1]["type"] == "response.failed", (
        "a stored response the store could not take is not completed"
    )
    assert stored[-1]["response"]["error"]["code"] == "store_unavailable"
    assert_clean(stored[-1]["response"]["error"]["message"])
    err = only_error(from_other_socket)
    assert err["error"]["code"] == "previous_response_not_found", "an unreachable store reads as not found"
    assert_clean(err["error"]["message"].replace(f"'{rid}'", ""))
    # A read or delete the store cannot serve now is the retryable 503, not "not found" (the
    # record is not lost) and not a 500.
    for name in ("get", "input_items", "delete", "compact"):
        r = calls[name]
        assert (r.status_code, r.headers.get("retry-after")) == (503, "1"), (name, r.status_code, r.text)
        assert r.json()["error"]["code"] == "store_unavailable", (name, r.text)
        assert r.json()["error"]["type"] == "server_error", (name, r.text)
        assert_clean(r.json()["error"]["message"])
    cont = calls["continue"]
    assert cont.status_code == 400 and cont.json()["error"]["code"] == "previous_response_not_found"
    assert_clean(cont.json()["error"]["message"].replace(f"'{rid}'", ""))
    assert usable == (200, 200), "the gateway keeps serving"
    # A store:false response's ledger line waits in the host's journal for the store to
    # come back (store.ledger: journal; docs/reliability.md, usage is billed exactly once):
    # it completes.
    assert still_streaming[-1]["type"] == "response.completed", "the socket stays usable"


def test_a_5xx_keeps_the_http_connection_open(dead_store_url):
    """The store cannot serve a DELETE: the 503 answered keeps the keep-alive connection open
    (the 500 of an unexpected exception: tests/serve/test_server_errors.py)."""
    host, port = dead_store_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"DELETE /v1/responses/{unknown_id()} HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer sk-iso\r\n\r\n".encode()
        )
        head, body = read_http_response(sock)
        assert head.startswith(b"HTTP/1.1 503") and json.loads(body)["error"]["code"] == "store_unavailable"
        assert b"connection: close" not in head.lower(), "a keep-alive response"
        sock.settimeout(2.0)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
    assert not closed, "the server closed a keep-alive connection right after answering 503"


def read_http_response(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: *(\d+)", head, re.IGNORECASE).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


@pytest.fixture(scope="module")
def busy_url(fault_apps) -> str:
    return fault_apps[BUSY_APP]


def test_an_overloaded_backend_fails_the_response_without_internals(busy_url):
    # ~2 s on emu-fast: it holds the only batch slot while the next request (sent at its
    # first delta) is refused; the test waits for it to finish, twice (WebSocket, then HTTP).
    long_text = {"emulator.tool_rounds": "0", "emulator.text_tokens": "2000"}

    async def main():
        async with connect(busy_url, "sk-iso") as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "store": False,
                        "stream_id": "long",
                        "input": "x",
                        "metadata": long_text,
                    }
                )
            )
            await next_of(ws, "response.output_text.delta")  # it holds the only batch slot now
            refused = await turn(ws, input="y", store=False, stream_id="other", metadata=TEXT)
            long_done = await raw_collect(ws)
            after = await turn(ws, input="z", store=False, stream_id="other", metadata=TEXT)
        slow_body = {"model": MODEL, "input": "x", "store": False, "stream": True, "metadata": long_text}
        async with (
            httpx.AsyncClient(base_url=busy_url, headers=auth("sk-iso"), timeout=60) as http,
            http.stream("POST", "/v1/responses", json=slow_body) as slow,
        ):
            lines = slow.aiter_lines()
            async for line in lines:
                if line == "event: response.output_text.delta":
                    break
            http_refused = await http.post(
                "/v1/responses",
                json={"model": MODEL, "input": "y", "store": False, "metadata": TEXT, "stream": True},
            )
            async for _ in lines:
                pass
        return refused, long_done, after, http_refused

    refused, long_done, after, http_refused = asyncio.run(main())
    failed = refused[-1]
    assert failed["type"] == "response.failed", [e["type"] for e in refused]
    assert failed["response"]["error"] == {"code": "server_error", "message": GENERIC_500}
    assert long_done[-1]["type"] == "response.completed", "the other lane is unaffected"
    assert after[-1]["type"] == "response.completed", "the socket stays usable"
    assert http_refused.status_code == 200
    sse_failed = [
        json.loads(line[6:]) for line in http_refused.text.splitlines() if line.startswith("data: {")
    ][-1]
    assert sse_failed["type"] == "response.failed"
    assert sse_failed["response"]["error"] == {"code": "server_error", "message": GENERIC_500}


# ------------------------------------------------------------------------- metric labels


def scrape(ray: Any) -> str:
    node = next(n for n in ray.nodes() if n["Alive"])
    return httpx.get(
        f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics", timeout=10
    ).text


def phase_count(text: str) -> float:
    """Responses recorded by the phase histogram (one observation per phase per response)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "ray_responses_ws_phase_seconds_count"
    )


def test_metric_labels_carry_no_ids_keys_or_user_text(ray_cluster, keyed_url):
    from prometheus_client.parser import text_string_to_metric_families

    before = phase_count(scrape(ray_cluster))
    alice = OpenAI(base_url=keyed_url + "/v1", api_key=ALICE, max_retries=0)
    SEEN_IDS.add(alice.responses.create(model=MODEL, input=marker("metrics-http"), metadata=TEXT).id)

    async def ws_traffic():
        async with connect(keyed_url, BOB) as b:
            for lane in ("lane-" + marker("lane"), None):
                await turn(
                    b,
                    input=marker("metrics-ws"),
                    store=False,
                    metadata=TEXT,
                    **({"stream_id": lane} if lane else {}),
                )

    asyncio.run(ws_traffic())

    def exported() -> str | None:
        text = scrape(ray_cluster)
        return text if phase_count(text) > before else None

    # Ray reports metrics every ~10 s.
    text = wait_until(exported, 60, "the traffic above to reach the exported metrics", every_s=1)

    secrets_ = {ALICE, BOB, fingerprint(ALICE), fingerprint(BOB), *SEEN_IDS, *MARKERS}
    assert len(SEEN_IDS) > 3 and len(MARKERS) > 3
    leaked = sorted(s for s in secrets_ if s in text)
    assert not leaked, leaked
    ids = re.compile(
        r"\b(resp|msg|fc|fco|call|steer)_[0-9a-f]{8,}|^[0-9a-f]{12}-\d+$"
    )  # conn ids: <12 hex>-<n>
    values = {
        v for fam in text_string_to_metric_families(text) for s in fam.samples for v in s.labels.values()
    }
    assert "websocket" in values and "http" in values, "the phase histogram's labels are there"
    assert not sorted(v for v in values if ids.search(v)), "ids in metric labels"
