"""The openai-agents SDK: an agent with a function tool, run twice on one WebSocket session."""

import asyncio
import json
import os

from agents import Agent, function_tool, responses_websocket_session, set_tracing_disabled

set_tracing_disabled(True)  # no trace export to the hosted API
calls = 0


@function_tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    global calls
    calls += 1
    return "print('hello')"


agent = Agent(name="coder", instructions="Fix the bug.", model="emu-fast", tools=[read_file])


async def main() -> None:
    async with responses_websocket_session(
        api_key=os.environ.get("OPENAI_API_KEY", "local"),
        base_url=os.environ.get("RESPONSES_WS_BASE_URL", "http://127.0.0.1:8765/v1"),
    ) as ws:
        first = await ws.run(agent, "Find the bug in main.py", max_turns=30)
        second = await ws.run(agent, "Now summarise the fix", max_turns=30)  # the same socket
    print(json.dumps({"tool_calls": calls, "answer": first.final_output, "second": second.final_output}))


asyncio.run(main())
