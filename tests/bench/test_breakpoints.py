"""bench.breakpoints: a client's breakpoints on a turn's items, and the figures read back."""

from __future__ import annotations

import json

from actors.protocol import parse_client_event
from bench import breakpoints as bp


def test_the_first_item_and_the_last_tool_output_carry_the_marks():
    task = {"role": "user", "content": [{"type": "input_text", "text": "Fix it."}]}
    first = bp.place([task], first=True, ttl="12h")
    assert first[0]["content"][0]["prompt_cache_breakpoint"] == {"mode": "explicit", "ttl": "12h"}
    assert "prompt_cache_breakpoint" not in task["content"][0]  # the caller's items are not changed
    outputs = [{"type": "function_call_output", "call_id": f"c{i}", "output": f"out {i}"} for i in range(3)]
    later = bp.place(outputs, first=False)
    assert [
        ("prompt_cache_breakpoint" in o["output"][0]) if isinstance(o["output"], list) else False
        for o in later
    ] == [
        False,
        False,
        True,
    ]
    assert later[2]["output"] == [
        {"type": "input_text", "text": "out 2", "prompt_cache_breakpoint": {"mode": "explicit"}}
    ]
    # What the server parses strictly.
    event = {"type": "response.create", "model": "emu-cache", "input": first + later}
    parse_client_event(json.dumps(event))


def test_a_resumed_history_is_marked_at_its_end_too():
    history = [{"role": "user", "content": f"old {i}"} for i in range(3)]
    task = {"role": "user", "content": "new task"}
    out = bp.place([*history, task], first=True, ttl="30m", resumed=len(history))
    marks = [isinstance(o["content"], list) and "prompt_cache_breakpoint" in o["content"][-1] for o in out]
    assert marks == [True, False, True, False]


def test_figures_by_ttl_and_the_block_rules_writes_as_30m():
    usage = {
        "input_tokens_details": {
            "cached_tokens": 7,
            "cache_write_tokens": 5,
            "cache_write_tokens_details": {"ttl_30m_tokens": 2, "ttl_12h_tokens": 3},
        }
    }
    assert bp.figures(usage) == (7, 2, 3)
    assert bp.figures({"input_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 9}}) == (
        1024,
        9,
        0,
    )
