"""Client-side helpers for integration tests: strict validation of every received frame,
the events of one response up to its final event (:data:`bench.client.FINAL_EVENT_TYPES`)."""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import ResponsesServerEvent
from pydantic import TypeAdapter

from bench.client import FINAL_EVENT_TYPES

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)

# The one failure code outside the SDK's ``ResponseError`` enum, on purpose (docs/protocol.md
# §5.3): a response the store could not take *now* fails with ``store_unavailable``, which
# tells the client to send it again (the SDK builds server events unchecked, so the code
# reaches it).  Every other part of such an event is checked as the SDK types it.
OWN_FAILURE_CODES = frozenset({"store_unavailable"})


def as_the_sdk_checks_it(raw: str | bytes) -> str | bytes:
    """``raw`` (a server event or Response, JSON) with an :data:`OWN_FAILURE_CODES` code read
    as ``server_error``; unchanged otherwise."""
    if not any(
        code.encode() in (raw if isinstance(raw, bytes) else raw.encode()) for code in OWN_FAILURE_CODES
    ):
        return raw
    data = json.loads(raw)
    response = data.get("response", data) if isinstance(data, dict) else None
    error = response.get("error") if isinstance(response, dict) else None
    if isinstance(error, dict) and error.get("code") in OWN_FAILURE_CODES:
        error["code"] = "server_error"
    return json.dumps(data)


TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file from the repository",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "max_lines": {"type": "integer", "minimum": 1, "maximum": 500},
            },
            "required": ["path", "max_lines"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


def validated(raw: str | bytes) -> dict[str, Any]:
    """One server frame: must be a JSON object that validates strictly as an SDK server event."""
    assert isinstance(raw, str), "server frames must be text frames"
    data = json.loads(raw)
    SERVER_EVENT.validate_json(as_the_sdk_checks_it(raw), strict=True)
    return data


def collect(conn: Any) -> list[dict[str, Any]]:
    """Frames of one response from an openai SDK connection, up to its terminal event."""
    out = []
    while True:
        ev = validated(conn.recv_bytes().decode())
        out.append(ev)
        if ev["type"] in FINAL_EVENT_TYPES:
            return out


async def acollect(conn: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        ev = validated((await conn.recv_bytes()).decode())
        out.append(ev)
        if ev["type"] in FINAL_EVENT_TYPES:
            return out


async def raw_collect(ws: Any) -> list[dict[str, Any]]:
    """Frames of one response from a raw ``websockets`` client."""
    out = []
    while True:
        ev = validated(await ws.recv())
        out.append(ev)
        if ev["type"] in FINAL_EVENT_TYPES:
            return out


def outputs_for(response: dict[str, Any], text: str = "ok") -> list[dict[str, Any]]:
    """The client's tool results for every function call of ``response``."""
    return [
        {"type": "function_call_output", "call_id": item["call_id"], "output": text}
        for item in response["output"]
        if item["type"] == "function_call"
    ]
