"""The openai SDK in WebSocket mode: a function-tool loop on one socket, sending only the
new items and the previous response's id each turn."""

import json
import os

from openai import OpenAI

client = OpenAI(
    base_url=os.environ.get("RESPONSES_WS_BASE_URL", "http://127.0.0.1:8765/v1"),
    api_key=os.environ.get("OPENAI_API_KEY", "local"),
)
tools = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]

calls = 0
with client.responses.connect() as conn:  # ws://127.0.0.1:8765/v1/responses
    new_input, previous = "Find the bug in main.py", None
    while True:
        conn.response.create(
            model="emu-fast", input=new_input, tools=tools, store=False, previous_response_id=previous
        )
        for event in conn:
            if event.type == "response.completed":
                response = event.response
                break
            if event.type in ("error", "response.failed", "response.incomplete"):
                raise SystemExit(f"{event.type}: {event}")
        previous = response.id
        pending = [item for item in response.output if item.type == "function_call"]
        if not pending:
            break
        calls += len(pending)
        new_input = [
            {"type": "function_call_output", "call_id": call.call_id, "output": "print('hello')"}
            for call in pending
        ]
print(json.dumps({"tool_calls": calls, "answer": response.output_text}))
