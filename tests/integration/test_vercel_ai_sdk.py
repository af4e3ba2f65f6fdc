"""The Vercel AI SDK (``ai`` and ``@ai-sdk/openai``, pinned in tests/clients/package.json and
installed by ``make clients``) drives the server with the scripts in tests/clients/vercel/:
``generateText`` (HTTP, JSON answers) and ``streamText`` (HTTP, SSE), each with a tool whose
``execute`` runs in the script, over several steps until the emulated model answers; and
``chat.mjs``: ``streamText`` with the tool over several steps, then a second turn of the same
chat, over the AI SDK's WebSocket transport (``@vercel/ai-sdk-openai-websocket-fetch``'s
``createWebSocketFetch()`` as the provider's ``fetch``, pinned likewise) and over HTTP.

The server's usage ledger says which transport each response came by: over the WebSocket
transport, every step's response came over the socket (no HTTP fallback).  The chat's second
turn sends the first turn's answer back as an ``item_reference`` (the AI SDK does so while
``store`` is on), which the server resolves to that message (docs/protocol.md §2.2).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.schemas import Checker
from tests.support.waiting import wait_until

CLIENTS = Path(__file__).parent.parent / "clients"
SCRIPTS = CLIENTS / "vercel"
ROUNDS = 2  # the scripts' ``emulator.tool_rounds``
API_KEY = "sk-vercel"  # the scripts' key: their stored responses are read back with it


def run_script(name: str, server_url: str, **env: str) -> dict[str, Any]:
    """Run one script against the server (``env``: more of its environment); what it
    printed (one JSON line)."""
    node = shutil.which("node")
    if node is None or not (CLIENTS / "node_modules" / "ai").is_dir():
        pytest.fail(
            "the JS clients are not installed: run `make clients` (needs node and npm)", pytrace=False
        )
    env = {**os.environ, "RESPONSES_WS_BASE_URL": server_url + "/v1", "OPENAI_API_KEY": API_KEY, **env}
    proc = subprocess.run(
        [node, str(SCRIPTS / name)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stderr}"
    assert "AI SDK Warning" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_tool_loop(report: dict[str, Any], server_url: str) -> None:
    """``ROUNDS`` steps that each end in one executed tool call, then a step that answers;
    the server stored the last response with every tool result the script sent."""
    assert report["steps"] == ["tool-calls"] * ROUNDS + ["stop"], report
    assert report["toolCalls"] == ["weather"] * ROUNDS
    assert len(report["executed"]) == ROUNDS and all(isinstance(c, str) for c in report["executed"])
    assert report["text"].strip() and report["finishReason"] == "stop"
    check = Checker()
    url = f"{server_url}/v1/responses/{report['responseId']}"
    with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as http:
        stored, listed = http.get(url), http.get(f"{url}/input_items", params={"order": "asc"})
    assert (stored.status_code, listed.status_code) == (200, 200), (stored.text, listed.text)
    last, items = check.response(stored.content), check.item_list(listed.content)["data"]
    assert last["status"] == "completed" and last["output"][0]["type"] == "message"
    outputs = [json.loads(i["output"]) for i in items if i["type"] == "function_call_output"]
    assert outputs == [{"city": city, "celsius": 18} for city in report["executed"]]


def test_generate_text_runs_a_multi_step_tool_loop_over_http(server_url):
    assert_tool_loop(run_script("generate-text.mjs", server_url), server_url)


def test_stream_text_runs_a_multi_step_tool_loop_over_sse(server_url):
    report = run_script("stream-text.mjs", server_url)
    assert report["errors"] == []
    assert report["streamed"].endswith(report["text"]) and report["text"]
    assert_tool_loop(report, server_url)


def ledger(path: Path, response_ids: list[str]) -> dict[str, str] | None:
    """The transport the server's ledger recorded for each response (``None`` until every
    one has its line)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = dict(db.execute("SELECT response_id, transport FROM usage").fetchall())
    got = {rid: rows[rid] for rid in response_ids if rid in rows}
    return got if len(got) == len(set(response_ids)) else None


@pytest.mark.parametrize("transport", ["websocket", "http"])
def test_stream_text_chat_runs_its_tool_steps_and_second_turn_over_each_transport(ledgered_server, transport):
    url, store = ledgered_server
    report = run_script("chat.mjs", url, RESPONSES_WS_TRANSPORT=transport)
    second = report["second"]
    assert report["errors"] == [] and second["errors"] == []
    assert report["steps"] == ["tool-calls"] * ROUNDS + ["stop"], report
    # The second turn's model calls the tool until its conversation holds ROUNDS + 1 results
    # (its metadata), counting those the chat history it was sent carries.
    results = sum(1 for i in report["secondInput"] if i.get("type") == "function_call_output")
    more = max(0, ROUNDS + 1 - results)
    assert second["steps"] == ["tool-calls"] * more + ["stop"], (second, results)
    assert report["toolCalls"] == ["weather"] * ROUNDS and len(report["executed"]) == ROUNDS + more
    assert report["text"] and report["streamed"].endswith(report["text"]) and second["text"]
    if transport == "websocket":
        assert report["httpCalls"] == [], "a request went over HTTP, not the socket"
    # Every step's response is in the server's ledger under the transport asked for.
    responses = report["responseIds"] + second["responseIds"]
    seen = wait_until(lambda: ledger(store, responses), timeout_s=20, what="the ledger lines of the chat")
    assert set(seen.values()) == {transport}, seen
    # The second turn sent the first turn's answer as an item_reference; the server stored the
    # message it names in its place.
    refs = [i for i in report["secondInput"] if i.get("type") == "item_reference"]
    assert refs, report["secondInput"]
    check = Checker()
    with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as http:
        listed = http.get(
            f"{url}/v1/responses/{second['responseIds'][0]}/input_items",
            params={"order": "asc", "limit": 100},
        )
    assert listed.status_code == 200, listed.text
    items = {i["id"]: i for i in check.item_list(listed.content)["data"]}
    texts = []
    for ref in refs:
        item = items[ref["id"]]
        assert item["type"] == "message" and item["role"] == "assistant", item
        texts.append("".join(p["text"] for p in item["content"]))
    assert report["text"] in texts, (texts, report["text"])
