"""API keys, ownership isolation, and junk request bodies (docs/protocol.md §1.2, checks 3–4)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import OpenAI

from tests.support.server import ALICE, BOB, start_app, stop_app
from tests.support.wire import raw_collect

MODEL = "emu-fast"


def sdk(url: str, key: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_check_03_wrong_or_missing_key_is_refused_on_http_and_on_the_upgrade(keyed_url):
    with pytest.raises(openai.AuthenticationError) as err:
        sdk(keyed_url, "key-mallory").responses.create(model=MODEL, input="x")
    assert err.value.code == "invalid_api_key"
    assert httpx.post(keyed_url + "/v1/responses", json={"model": MODEL, "input": "x"}).status_code == 401

    async def upgrade(headers):
        async with websockets.connect(
            keyed_url.replace("http", "ws", 1) + "/v1/responses", additional_headers=headers
        ):
            pass

    for headers in ({}, {"Authorization": "Bearer key-mallory"}):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            asyncio.run(upgrade(headers))
        assert refused.value.response.status_code == 401
        body = json.loads(bytes(refused.value.response.body))
        assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"


def test_check_04_configured_key_works_as_bearer_and_as_api_key_header(keyed_url):
    assert sdk(keyed_url, ALICE).responses.create(model=MODEL, input="x").status == "completed"

    async def main():
        async with websockets.connect(
            keyed_url.replace("http", "ws", 1) + "/v1/responses", additional_headers={"api-key": BOB}
        ) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
            return (await raw_collect(ws))[-1]

    assert asyncio.run(main())["type"] == "response.completed"


def test_a_stored_response_is_invisible_to_other_keys(keyed_url):
    alice, bob = sdk(keyed_url, ALICE), sdk(keyed_url, BOB)
    resp = alice.responses.create(model=MODEL, input="alice's secret")
    for call in (
        lambda: bob.responses.retrieve(resp.id),
        lambda: bob.responses.delete(resp.id),
        lambda: bob.responses.input_items.list(resp.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as err:
        bob.responses.create(model=MODEL, input="x", previous_response_id=resp.id)
    assert err.value.code == "previous_response_not_found"
    assert alice.responses.retrieve(resp.id).id == resp.id, "bob's attempts changed nothing"


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    [
        "model",
        "input",
        "tools",
        "previous_response_id",
        "store",
        "stream",
        "max_output_tokens",
        "instructions",
        "tool_choice",
        "metadata",
        "text",
    ]
)
BODIES = st.one_of(
    st.binary(max_size=64),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(FIELDS, JSONISH, max_size=5).map(lambda d: json.dumps({"model": MODEL, **d}).encode()),
)


@pytest.fixture(scope="module")
def junk_client(server_url):
    """One client for every example: ``httpx.post`` builds a client (and its TLS context)
    and a connection per call, which was most of the test's time."""
    with httpx.Client(
        base_url=server_url,
        timeout=30,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-fuzz"},
    ) as client:
        yield client


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES, path=st.sampled_from(["/v1/responses", "/v1/responses/compact"]))
def test_junk_bodies_get_4xx_never_5xx(junk_client, body, path):
    r = junk_client.post(path, content=body)
    if r.status_code == 200:
        return  # a body that happens to be a valid request
    assert 400 <= r.status_code < 500, (r.status_code, body, r.text)
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}


def test_connections_past_the_per_key_limit_are_refused_with_429(ray_cluster):
    url = (
        start_app("rws-limited", **{"server.max_connections_per_key": 1}).replace("http", "ws", 1)
        + "/v1/responses"
    )

    async def main():
        async with websockets.connect(url, additional_headers={"Authorization": "Bearer k1"}) as first:
            with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
                async with websockets.connect(url, additional_headers={"Authorization": "Bearer k1"}):
                    pass
            async with websockets.connect(url, additional_headers={"Authorization": "Bearer k2"}) as other:
                await other.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
                other_done = (await raw_collect(other))[-1]
            await first.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
            return refused.value.response, other_done, (await raw_collect(first))[-1]

    try:
        response, other_done, first_done = asyncio.run(main())
    finally:
        stop_app("rws-limited")
    assert response.status_code == 429
    assert json.loads(bytes(response.body))["error"]["code"] == "rate_limit_exceeded"
    assert other_done["type"] == first_done["type"] == "response.completed"
