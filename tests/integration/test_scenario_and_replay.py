"""Scripted scenarios on a real server over WebSocket, chained HTTP and full-resend HTTP,
and ``responses-ws replay`` of the synthetic Codex and Claude Code logs on every transport."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.transports import TRANSPORTS
from serve.cli import main as cli

DATA = Path(__file__).parents[1] / "bench" / "data" / "replay"
EXAMPLE = Path(__file__).parents[2] / "configs" / "scenario.example.yaml"
TRANSPORT_NAMES = ["ws", "http-chained", "http-full"]
EXEC = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
SCENARIO = {
    "turns": [
        {
            "reasoning_tokens": 16,
            "text": "Listing the files.",
            "calls": [{"name": "exec_command", "arguments": {"cmd": "ls"}}],
        },
        {"text": "done"},
    ]
}
USER = [{"role": "user", "content": [{"type": "input_text", "text": "What is in this folder?"}]}]


def _calls(response):
    return [(o["name"], o["arguments"]) for o in response["output"] if o["type"] == "function_call"]


def _text(response):
    return "".join(c["text"] for o in response["output"] if o["type"] == "message" for c in o["content"])


async def _two_turns(url: str, transport: str, metadata: dict[str, str] | None):
    t = TRANSPORTS[transport](url, "sk-scenario")
    await t.open()
    try:
        base = {"model": "emu-fast", "tools": [EXEC], **({"metadata": metadata} if metadata else {})}
        first = await t.turn(base, USER)
        assert first.error is None, first.error
        call_id = next(o["call_id"] for o in first.response["output"] if o["type"] == "function_call")
        second = await t.turn(
            base, [{"type": "function_call_output", "call_id": call_id, "output": "README.md"}]
        )
        assert second.error is None, second.error
        return first.response, second.response
    finally:
        await t.close()


@pytest.mark.parametrize("transport", TRANSPORT_NAMES)
def test_a_scenario_in_metadata_is_followed_on_every_transport(server_url, transport):
    first, second = asyncio.run(
        _two_turns(server_url, transport, {"emulator.scenario": json.dumps(SCENARIO)})
    )
    assert _text(first) == "Listing the files."
    assert _calls(first) == [("exec_command", '{"cmd": "ls"}')]
    assert first["usage"]["output_tokens_details"]["reasoning_tokens"] == 16
    assert _text(second) == "done" and not _calls(second)


@pytest.fixture(scope="module")
def scenario_url(ray_cluster):
    """A server started as ``responses-ws serve --scenario configs/scenario.example.yaml``
    would be: the example scripts every conversation (inference.policy.scenario)."""
    from serve.cli import scenario_file
    from tests.support.server import start_app, stop_app

    url = start_app("rws-scenario", **{"inference.policy.scenario": scenario_file(EXAMPLE)})
    yield url
    stop_app("rws-scenario")


@pytest.mark.parametrize("transport", TRANSPORT_NAMES)
def test_the_example_scenario_configured_scripts_every_conversation(scenario_url, transport):
    async def go():
        t = TRANSPORTS[transport](scenario_url, "sk-scenario")
        await t.open()
        try:
            responses, items = [], USER
            for _ in range(3):
                out = await t.turn({"model": "emu-fast", "tools": [EXEC]}, items)
                assert out.error is None, out.error
                responses.append(out.response)
                items = [
                    {"type": "function_call_output", "call_id": o["call_id"], "output": "ok"}
                    for o in out.response["output"]
                    if o["type"] == "function_call"
                ]
            return responses
        finally:
            await t.close()

    first, second, third = asyncio.run(go())
    assert _text(first) == "Let me look at the files." and _calls(first) == [
        ("exec_command", '{"cmd": "ls"}')
    ]
    assert first["usage"]["output_tokens_details"]["reasoning_tokens"] == 30
    assert [name for name, _ in _calls(second)] == ["exec_command", "apply_patch"]
    assert _calls(second)[0][1] == '{"cmd": "cat README.md"}'
    assert not _calls(third) and third["usage"]["output_tokens"] == 25


@pytest.mark.parametrize("transport", TRANSPORT_NAMES)
def test_an_injected_error_fails_the_response_and_the_transport_stays_usable(server_url, transport):
    failing = json.dumps({"error": {"code": "rate_limit_exceeded", "message": "Scripted: slow down."}})
    answer = json.dumps({"text": "recovered"})

    async def go():
        t = TRANSPORTS[transport](server_url, "sk-scenario")
        await t.open()
        try:
            failed = await t.turn({"model": "emu-fast", "metadata": {"emulator.turn": failing}}, USER)
            t.new_chain()
            after = await t.turn({"model": "emu-fast", "metadata": {"emulator.turn": answer}}, USER)
            return failed, after
        finally:
            await t.close()

    failed, after = asyncio.run(go())
    assert failed.error == "response.failed"
    assert failed.response["error"] == {"code": "rate_limit_exceeded", "message": "Scripted: slow down."}
    assert after.error is None and _text(after.response) == "recovered"


@pytest.mark.parametrize("transport", ["ws", "http-full"])
def test_a_malformed_scenario_is_a_400_naming_the_key(server_url, transport):
    async def go():
        t = TRANSPORTS[transport](server_url, "sk-scenario")
        await t.open()
        try:
            return await t.turn(
                {"model": "emu-fast", "metadata": {"emulator.turn": '{"calls": [{"name": "f"}]}'}}, USER
            )
        finally:
            await t.close()

    out = asyncio.run(go())
    assert (
        out.response is None and "metadata.emulator.turn" in out.error and "a scenario as JSON" in out.error
    )


def test_replay_reproduces_every_recorded_step_on_every_transport(server_url, tmp_path, capsys):
    out, shape = tmp_path / "replay.json", tmp_path / "shape.json"
    rc = cli(
        [
            "replay",
            str(DATA),
            "--url",
            server_url,
            "--tool-time",
            "x0.05",
            "--no-warmup",
            "--quiet",
            "--json",
            str(out),
            "--export-shape",
            str(shape),
        ]
    )
    assert rc == 0
    assert "notes.jsonl:1: not a Codex rollout nor a Claude Code log" in capsys.readouterr().err
    payload = json.loads(out.read_text())
    shapes = {s["label"]: s for s in json.loads(shape.read_text())["sessions"]}
    assert sorted(s["format"] for s in payload["sessions"]) == ["claude", "codex"]
    for s in payload["sessions"]:
        steps = shapes[s["label"]]["steps"]
        for name in TRANSPORT_NAMES:
            t = s["transports"][name]
            assert t["error"] is None and t["steps"] == len(steps) == s["recorded_steps"]
            assert set(t) >= {"tool_s", "output_tokens", "e2e_s", "api_overhead_s", "bytes_sent"}
            assert t["tool_s"] >= 0.05 * sum(st["tool_s"] for st in steps)
            assert t["e2e_s"] >= t["tool_s"] + t["model_s"]
        for row in s["fidelity"]:  # each step's output shape, exactly as planned, on every transport
            for name in TRANSPORT_NAMES:
                replayed = row["replayed"][name]
                assert replayed["output_tokens"] == row["planned"]["total"], (s["label"], row)
                assert replayed["reasoning_tokens"] == row["planned"]["reasoning"]
                assert replayed["calls"] == row["planned"]["calls"]
        full, ws = s["transports"]["http-full"], s["transports"]["ws"]
        assert full["bytes_sent"] > ws["bytes_sent"] and s["websocket_saves"]["http-full"]["bytes_sent"] > 0
        # a compaction starts a new chain: the full resend shrinks back to the summary
        chain = next(i for i, st in enumerate(steps) if st["new_chain"])
        sent = full["bytes_per_step"]
        assert sent[chain] < sent[chain - 1]


def test_an_injected_error_in_a_plain_json_response(server_url):
    """The curl example of docs/replay.md: no stream, the failed Response as the body."""
    import httpx

    turn = json.dumps({"error": {"code": "rate_limit_exceeded", "message": "Scripted."}})
    r = httpx.post(
        f"{server_url}/v1/responses",
        timeout=60,
        json={"model": "emu-fast", "input": "hi", "metadata": {"emulator.turn": turn}},
    )
    body = r.json()
    assert body["status"] == "failed", (r.status_code, body)
    assert body["error"] == {"code": "rate_limit_exceeded", "message": "Scripted."}
