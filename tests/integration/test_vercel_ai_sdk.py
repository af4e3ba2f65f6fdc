"""The Vercel AI SDK (``ai`` and ``@ai-sdk/openai``, pinned in tests/clients/package.json and
installed by ``make clients``) drives the server with the scripts in tests/clients/vercel/:
``generateText`` (HTTP, JSON answers) and ``streamText`` (HTTP, SSE), each with a tool whose
``execute`` runs in the script, over several steps until the emulated model answers.

The AI SDK's OpenAI provider has no WebSocket transport of its own for the Responses API
(its ``webSocket`` option serves the realtime and transcription models only); the separate
package its docs name for that is not on the npm registry, so both scripts speak HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.schemas import Checker

CLIENTS = Path(__file__).parent.parent / "clients"
SCRIPTS = CLIENTS / "vercel"
ROUNDS = 2  # the scripts' ``emulator.tool_rounds``
API_KEY = "sk-vercel"  # the scripts' key: their stored responses are read back with it


def run_script(name: str, server_url: str) -> dict[str, Any]:
    """Run one script against the server; what it printed (one JSON line)."""
    node = shutil.which("node")
    if node is None or not (CLIENTS / "node_modules" / "ai").is_dir():
        pytest.fail(
            "the JS clients are not installed: run `make clients` (needs node and npm)", pytrace=False
        )
    env = {**os.environ, "RESPONSES_WS_BASE_URL": server_url + "/v1", "OPENAI_API_KEY": API_KEY}
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
