"""The prefix cache is scoped per API key across transports, routing keeps a key's prefix on
one replica, and a rollout's model output does not depend on the transport.

docs/protocol.md check 27: a full resend on a new socket under *another* API key reports 0
cached tokens, the same key's new socket (or HTTP request) may hit.  With two inference
replicas a hit also needs the routing: HTTP requests follow their prefix route and a new
socket is pinned where its first request's route goes (docs/emulator.md, "Routing").
The scripted policy is seeded from the conversation without its random call ids, so rollout
``r`` gives the same output items on ``ws``, ``http-chained`` and ``http-full``.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import httpx

from bench import workload as wl
from bench.client import connect
from bench.transports import TRANSPORTS

TEXT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "8"}  # a short text answer


def long_prompt() -> str:
    """~3000 tokens, unique to the call (the emulator reports cached tokens from 1024 on)."""
    tag = secrets.token_hex(6)
    return "\n".join(
        f"Record {i} of batch {tag}: the parcel in bay {i * 7 % 13} weighs {i % 11} kilos."
        for i in range(160)
    )


def cached(response: dict[str, Any]) -> int:
    assert response["status"] == "completed", response
    return response["usage"]["input_tokens_details"]["cached_tokens"]


async def over_socket(url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    socket = await connect(url, api_key=key)
    try:
        answer = await socket.create(**body)
    finally:
        await socket.close()
    assert answer.response is not None, answer.last
    return answer.response


async def over_http(url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=url, timeout=60, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        r = await http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_one_cache_scope_per_api_key_across_transports_and_replicas(two_replicas_url):
    alice, bob = f"sk-scope-alice-{secrets.token_hex(4)}", f"sk-scope-bob-{secrets.token_hex(4)}"
    url = two_replicas_url

    async def main() -> dict[str, int]:
        out = {}
        first = {"model": "emu-fast", "input": long_prompt(), "store": False, "metadata": TEXT}
        out["alice http first"] = cached(await over_http(url, alice, first))
        out["alice socket, same prompt"] = cached(await over_socket(url, alice, first))
        out["alice http again"] = cached(await over_http(url, alice, first))
        out["bob socket, same prompt"] = cached(await over_socket(url, bob, first))
        second = {**first, "input": long_prompt()}  # a socket first, then HTTP
        out["alice socket first"] = cached(await over_socket(url, alice, second))
        out["alice http after her socket"] = cached(await over_http(url, alice, second))
        out["alice new socket after it"] = cached(await over_socket(url, alice, second))
        out["bob http, same prompt"] = cached(await over_http(url, bob, second))
        return out

    got = asyncio.run(main())
    assert got["alice http first"] == 0 and got["alice socket first"] == 0
    for same_key in (
        "alice socket, same prompt",
        "alice http again",
        "alice http after her socket",
        "alice new socket after it",
    ):
        assert got[same_key] >= 1024, (same_key, got)  # shared by the key's transports, on one replica
    assert got["bob socket, same prompt"] == 0 and got["bob http, same prompt"] == 0, got  # never across keys


def test_a_rollout_gives_the_same_output_on_every_transport(server_url):
    """The same 6-turn tool loop (5 tool rounds, then text) over a WebSocket, chained HTTP
    and HTTP with the whole history resent, each in its own cache scope (API key): identical
    output items, prompt sizes and prefix-cache hits, turn by turn — the same model time."""
    w = wl.Workload(
        tool_rounds=5,
        system_tokens=1500,
        tool_def_tokens=400,
        tool_output_tokens=120,
        text_tokens=24,
        tool_time_ms=0,
    )
    rollout = 3

    async def drive(transport: str) -> list[list[tuple[str, ...]]]:
        t = TRANSPORTS[transport](server_url, f"sk-rollout-{transport}")
        base = {
            "model": w.model,
            "instructions": wl.instructions(w.system_tokens, w.seed),
            "tools": wl.tools(w),
            "metadata": wl.metadata(w, rollout),
        }
        new_items: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "input_text", "text": wl.task(w, rollout)}]}
        ]
        turns = []
        await t.open()
        try:
            for turn in range(1, w.tool_rounds + 2):
                out = await t.turn(base, new_items)
                assert out.error is None and out.response is not None, (transport, turn, out.error)
                output, usage = out.response["output"], out.response["usage"]
                turns.append(
                    [(usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"])]
                    + [
                        ("function_call", o["name"], o["arguments"])
                        if o["type"] == "function_call"
                        else (o["type"], "".join(c.get("text", "") for c in o.get("content", [])))
                        for o in output
                    ]
                )
                calls = [o for o in output if o["type"] == "function_call"]
                if not calls:
                    break
                new_items = [
                    {
                        "type": "function_call_output",
                        "call_id": c["call_id"],
                        "output": wl.tool_output(w, rollout, turn, i, c["name"]),
                    }
                    for i, c in enumerate(calls)
                ]
        finally:
            await t.close()
        return turns

    async def main():
        return {name: await drive(name) for name in ("ws", "http-chained", "http-full")}

    runs = asyncio.run(main())
    ws = runs["ws"]
    assert len(ws) == 6 and all(turn[1][0] == "function_call" for turn in ws[:5])
    assert ws[5][1][0] == "message" and ws[5][1][1]
    assert len({args for turn in ws[:5] for _, _, args in turn[1:]}) > 1  # the loop is not trivially constant
    assert [turn[0][1] for turn in ws][1:] == sorted(turn[0][1] for turn in ws[1:]) and ws[-1][0][1] >= 1024
    for name in ("http-chained", "http-full"):
        for i, (a, b) in enumerate(zip(ws, runs[name], strict=True)):
            assert a == b, (name, f"turn {i + 1}", a, b)
