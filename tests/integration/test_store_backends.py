"""The whole server on each store backend: cross-transport chains and durability."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from openai import OpenAI

from tests.support.server import delete_apps, start_app, start_apps, stop_app
from tests.support.wire import TOOLS, outputs_for, raw_collect

MODEL = "emu-fast"


def ws_continue(url: str, **body) -> dict:
    async def main():
        async with websockets.connect(
            url.replace("http", "ws", 1) + "/v1/responses",
            additional_headers={"Authorization": "Bearer sk-store"},
        ) as ws:
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, **body}))
            return (await raw_collect(ws))[-1]

    return asyncio.run(main())


@pytest.fixture(scope="module")
def apps(ray_cluster, redis_server, tmp_path_factory) -> Iterator[tuple[dict[str, str], Path]]:
    """The module's two apps, deployed together (``start_apps``: a deploy keeps about one
    core busy): the Redis one, and the SQLite one whose store the redeploy test reads back
    (its data directory is the second value)."""
    data = tmp_path_factory.mktemp("durable")
    urls = start_apps(
        {
            "rws-redis": {
                "store.backend": "redis",
                "store.redis_url": redis_server,
                "store.key_prefix": "it:",
            },
            "rws-durable": {"store.data_dir": str(data)},
        }
    )
    yield urls, data
    stop_app("rws-redis")


@pytest.fixture
def redis_app(apps) -> str:
    return apps[0]["rws-redis"]


def test_redis_backend_serves_an_http_ws_http_chain(redis_app, redis_server):
    client = OpenAI(base_url=redis_app + "/v1", api_key="sk-store", max_retries=0)
    first = client.responses.create(model=MODEL, input="Read the config", tools=TOOLS)
    ws = ws_continue(
        redis_app, previous_response_id=first.id, tools=TOOLS, input=outputs_for(first.model_dump())
    )
    assert ws["type"] == "response.completed"
    third = client.responses.create(
        model=MODEL, previous_response_id=ws["response"]["id"], tools=TOOLS, input=outputs_for(ws["response"])
    )
    assert third.previous_response_id == ws["response"]["id"]
    assert client.responses.retrieve(ws["response"]["id"]).id == ws["response"]["id"]

    import redis

    r = redis.Redis.from_url(redis_server)
    assert r.exists(f"it:resp:{first.id}") and r.exists(f"it:resp:{third.id}")


def test_stored_responses_survive_a_redeploy(apps):
    """Writes are queued off the critical path, and flushed before a clean shutdown."""
    urls, data = apps
    overrides = {"store.data_dir": str(data)}
    url = urls["rws-durable"]
    client = OpenAI(base_url=url + "/v1", api_key="sk-store", max_retries=0)
    http_id = client.responses.create(model=MODEL, input="over http").id
    ws_id = ws_continue(url, input="over a socket", store=True)["response"]["id"]
    delete_apps("rws-durable")  # drained: its writes are flushed
    url = start_app("rws-durable", **overrides)
    client = OpenAI(base_url=url + "/v1", api_key="sk-store", max_retries=0)
    assert client.responses.retrieve(http_id).id == http_id
    assert client.responses.retrieve(ws_id).id == ws_id
    stop_app("rws-durable")
