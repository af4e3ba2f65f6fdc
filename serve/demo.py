"""``responses-ws demo``: an agent loop over one WebSocket against an embedded server.

Starts Ray and the app in-process, runs a Codex-like tool loop with the official openai SDK
(``client.responses.connect()``, ``store=False``, only new items plus
``previous_response_id`` each turn), prints per-turn timings and cached tokens, and shuts
everything down.
"""

from __future__ import annotations

import json
import time

from .builder import start, stop
from .cli import free_port
from .config import load_app_config

TOOLS = [{
    "type": "function", "name": "read_file", "description": "Read a file from the repository",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"], "additionalProperties": False},
}]
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
FILE_CONTENTS = "def add(a, b):\n    return a - b  # bug\n" * 30


def run_demo(turns: int = 8, model: str = "emu-fast") -> int:
    from openai import OpenAI

    config = load_app_config(None, **{"server.port": free_port(),
                                      "inference.policy": {"tool_rounds": max(turns - 1, 0)}})
    print("starting an embedded Ray and the responses-ws app …", flush=True)
    url = start(config)
    print(f"serving on {url}; WebSocket {url.replace('http', 'ws', 1)}/v1/responses\n")
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="sk-demo")
        print(f"{'turn':>4}  {'output':<28} {'ttft ms':>8} {'total ms':>9} {'input':>6} {'cached':>6} {'out':>4}")
        with client.responses.connect() as conn:
            prev, new_input = None, "The tests fail. Find and fix the bug."
            for turn in range(1, turns + 1):
                t0 = time.perf_counter()
                conn.response.create(model=model, input=new_input, tools=TOOLS, store=False,
                                     previous_response_id=prev,
                                     instructions="You are a careful coding agent.")
                ttft = None
                for event in conn:
                    if ttft is None and event.type.endswith(".delta"):
                        ttft = time.perf_counter() - t0
                    if event.type in TERMINAL:
                        break
                total = time.perf_counter() - t0
                if event.type != "response.completed":
                    print(f"turn {turn} ended with {event.type}: {event}")
                    return 1
                resp = event.response
                calls = [o for o in resp.output if o.type == "function_call"]
                what = (f"{calls[0].name}({json.loads(calls[0].arguments).get('path', '')})"
                        if calls else "text: " + resp.output_text[:20])
                u = resp.usage
                print(f"{turn:>4}  {what[:28]:<28} {1000 * (ttft or total):>8.1f} {1000 * total:>9.1f} "
                      f"{u.input_tokens:>6} {u.input_tokens_details.cached_tokens:>6} {u.output_tokens:>4}")
                if not calls:
                    break
                prev = resp.id
                new_input = [{"type": "function_call_output", "call_id": c.call_id, "output": FILE_CONTENTS}
                             for c in calls]
        print("\neach turn sent only its new items; the connection's actor kept the rest, so the"
              "\nprompt's cached share grows turn over turn.")
        return 0
    finally:
        stop()
