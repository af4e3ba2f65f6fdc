"""The openai-agents SDK runs a tool-using agent over one WebSocket session."""

from __future__ import annotations

import asyncio

from agents import Agent, function_tool, responses_websocket_session, set_tracing_disabled

set_tracing_disabled(True)  # no trace export to the real API from tests


def test_agents_sdk_websocket_session_runs_a_function_tool_loop(server_url):
    reads: list[str] = []

    @function_tool
    def read_file(path: str, max_lines: int) -> str:
        """Read up to max_lines lines of a file."""
        reads.append(path)
        return f"# {path}\nprint('hello')\n"

    agent = Agent(name="coder", instructions="Fix the bug.", model="emu-fast", tools=[read_file])

    async def main():
        async with responses_websocket_session(api_key="sk-test", base_url=server_url + "/v1") as ws:
            first = await ws.run(agent, "Find the bug in main.py", max_turns=30)
            # A second run on the same session reuses the same socket.
            second = await ws.run(agent, "Now summarise", max_turns=30)
            return first, second

    first, second = asyncio.run(main())
    assert len(reads) == 40, "the emulated model calls the tool 20 times per run"
    assert isinstance(first.final_output, str) and first.final_output
    assert isinstance(second.final_output, str) and second.final_output
    assert first.last_response_id and first.last_response_id.startswith("resp_")
