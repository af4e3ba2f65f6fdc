"""The openai SDK over HTTP: the same loop, each turn a stateless POST that names the stored
previous response (the server reloads and re-renders the conversation every time)."""

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
new_input, previous = "Find the bug in main.py", None
while True:
    with client.responses.stream(
        model="emu-fast", input=new_input, tools=tools, previous_response_id=previous
    ) as stream:  # SSE
        response = stream.get_final_response()
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
