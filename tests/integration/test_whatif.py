"""The opt-in what-if services on a real Serve app: a WebSocket turn charges the classifier
the new tokens plus the carried window, an HTTP request (chained or resent whole) the whole
history; the calls are timed phases of API work.  (Off by default, nothing is bound:
tests/serve/test_config.py; no call is charged: tests/actors/test_whatif.py.)"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
import websockets
from ray import serve

from tests.support.server import start_app, stop_app
from tests.support.wire import raw_collect

APP = "rws-whatif"
MODEL = "emu-fast"
WINDOW = 8
TIMINGS = {"responses_ws.timings": "1"}
LONG = "a first message long enough to be more than the classifier's carried window of tokens"


@pytest.fixture(scope="module")
def whatif_url(ray_cluster):
    url = start_app(
        APP,
        **{
            "session.whatif": {
                "safety_model": {"enabled": True, "window_tokens": WINDOW},
                "hop": {"enabled": True},
            }
        },
    )
    yield url
    stop_app(APP)  # nothing after this module needs it gone: no wait for its replicas' ends


class Charges:
    """The token counts each service was called with since the last look."""

    def __init__(self) -> None:
        self.seen = {name: len(self._recent(name)) for name in ("WhatIfSafetyModel", "WhatIfHop")}

    @staticmethod
    def _recent(name: str) -> list[int]:
        return serve.get_deployment_handle(name, app_name=APP).stats.remote().result()["recent"]

    def new(self) -> tuple[list[int], list[int]]:
        out = []
        for name in ("WhatIfSafetyModel", "WhatIfHop"):
            recent = self._recent(name)
            out.append(recent[self.seen[name] :])
            self.seen[name] = len(recent)
        return out[0], out[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url + "/v1/responses",
        json.dumps({"model": MODEL, **body}).encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer sk-test"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_a_websocket_turn_charges_the_new_tokens_plus_the_window(whatif_url):
    charges = Charges()

    async def two_turns():
        async with websockets.connect(whatif_url.replace("http://", "ws://") + "/v1/responses") as ws:
            await ws.send(
                json.dumps({"type": "response.create", "model": MODEL, "store": False, "input": LONG})
            )
            r1 = (await raw_collect(ws))[-1]["response"]
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "store": False,
                        "input": "next",
                        "previous_response_id": r1["id"],
                        "metadata": TIMINGS,
                    }
                )
            )
            return r1, (await raw_collect(ws))[-1]["response"]

    r1, r2 = asyncio.run(two_turns())
    in1, in2 = r1["usage"]["input_tokens"], r2["usage"]["input_tokens"]
    assert in1 > WINDOW
    safety, hop = charges.new()
    assert safety == [in1, in2 - in1 + WINDOW]  # the parent's output and the new input, plus the window
    assert hop == [in1, in2 - in1]
    timings = json.loads(r2["metadata"]["responses_ws.timings"])
    assert timings["safety_model"] >= 3.0 and timings["hop"] >= 0.5  # at least the modelled costs
    assert timings["api_overhead"] >= timings["safety_model"] + timings["hop"]


def test_an_http_request_charges_the_whole_history_chained_or_resent(whatif_url):
    charges = Charges()
    first = post(whatif_url, {"input": LONG})
    chained = post(whatif_url, {"input": "next", "previous_response_id": first["id"]})
    history = [{"role": "user", "content": LONG}, *first["output"], {"role": "user", "content": "next"}]
    resent = post(whatif_url, {"input": history, "store": False, "metadata": TIMINGS})
    in1, in2, in3 = (r["usage"]["input_tokens"] for r in (first, chained, resent))
    assert in2 == in3 > in1
    safety, hop = charges.new()
    assert safety == hop == [in1, in2, in3]
    timings = json.loads(resent["metadata"]["responses_ws.timings"])
    assert timings["safety_model"] >= 3.0 and timings["hop"] >= 0.5
