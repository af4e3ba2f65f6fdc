"""Prompt caching by breakpoints through the real server and the openai SDK (model
``emu-cache``, docs/emulator.md "Prompt caching"): each rule's usage figures against a value
computed by hand from the chat format's segment lengths, the three transports reporting the
same figures for one rollout, and ``response.compaction.compacting`` as the SDK types it.

Every test uses API keys of its own, so no other test's entries are in its cache scope.
"""

from __future__ import annotations

import json
import secrets
from contextlib import ExitStack
from typing import Any

import pytest
from openai import BadRequestError, OpenAI
from openai.types.responses import Response

from inference import chat_format as cf
from inference.types import ToolSpec
from tests.support.wire import TOOLS, collect

MODEL = "emu-cache"
TEXT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "8"}


def sdk(server_url: str) -> OpenAI:
    key = f"sk-cache-{secrets.token_hex(6)}"  # a cache scope of its own
    return OpenAI(base_url=server_url + "/v1", api_key=key, max_retries=0, timeout=60)


def msg(role: str, text: str, ttl: str | None = None, bp: bool = True) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "input_text", "text": text}
    if bp:
        part["prompt_cache_breakpoint"] = {"mode": "explicit", **({"ttl": ttl} if ttl else {})}
    return {"role": role, "content": [part]}


def seg(role: str, text: str) -> int:
    """Tokens of one message's segment (inference.chat_format): where a breakpoint on its
    only part ends, counted from the message's start."""
    return len(cf.render_message(role, text))


def create(client: OpenAI, input: list[dict], **options: Any) -> dict[str, Any]:
    """One JSON create; the body validates strictly as the SDK's Response."""
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=input, store=False, metadata=TEXT, **options
    )
    text = raw.http_response.text
    Response.model_validate_json(text, strict=True)
    body = json.loads(text)
    assert body["status"] == "completed", body
    return body


def figures(response: dict[str, Any]) -> tuple[int, int, int, int]:
    """(input, cached, written 30m, written 12h); written adds up to cache_write_tokens."""
    usage = response["usage"]
    details = usage["input_tokens_details"]
    ttl = details["cache_write_tokens_details"]
    assert details["cache_write_tokens"] == ttl["ttl_30m_tokens"] + ttl["ttl_12h_tokens"]
    return usage["input_tokens"], details["cached_tokens"], ttl["ttl_30m_tokens"], ttl["ttl_12h_tokens"]


def test_both_modes_and_both_ttls(server_url):
    client, tag = sdk(server_url), secrets.token_hex(4)
    system = f"[{tag}] You are a careful coding agent. " * 20
    d = seg("developer", system)
    implicit_30m = {"prompt_cache_options": {"mode": "implicit", "ttl": "30m"}}
    first = create(client, [msg("developer", system, "12h"), msg("user", "one", bp=False)], **implicit_30m)
    n1 = first["usage"]["input_tokens"]
    # Written: the system message to its breakpoint (12h), the rest to the prompt's end (30m).
    assert figures(first) == (n1, 0, n1 - d, d)
    assert first["prompt_cache_options"] == {"mode": "implicit", "ttl": "30m", "comparison_response_id": None}
    second = create(client, [msg("developer", system, "12h"), msg("user", "two", bp=False)], **implicit_30m)
    n2 = second["usage"]["input_tokens"]
    assert figures(second) == (n2, d, n2 - d, 0)  # read to the exact breakpoint: no block rounding
    # The request's ttl for a breakpoint without one, and for the implicit one.
    third = create(
        client,
        [msg("developer", system), msg("user", "three", bp=False)],
        prompt_cache_options={"ttl": "12h"},
    )
    n3 = third["usage"]["input_tokens"]
    assert figures(third) == (n3, d, 0, n3 - d)
    # Explicit: only the explicit breakpoints; the held one is read and refreshed, nothing added.
    explicit = {"prompt_cache_options": {"mode": "explicit"}}
    fourth = create(client, [msg("developer", system), msg("user", "four", bp=False)], **explicit)
    assert figures(fourth) == (fourth["usage"]["input_tokens"], d, 0, 0)
    # Explicit without breakpoints: no caching, though the same prompt was written before.
    again = [msg("developer", system, bp=False), msg("user", "one", bp=False)]
    assert figures(create(client, again, **explicit)) == (n1, 0, 0, 0)
    assert figures(create(client, again))[1] == n1  # implicit: its end (the first request's) is read


def test_prewarm_fills_the_cache_without_output(server_url):
    client = sdk(server_url)
    body = [msg("user", f"{secrets.token_hex(4)} Summarise the design. " * 30, bp=False)]
    warm = create(client, body, prompt_cache_options={"prewarm": True})
    n = warm["usage"]["input_tokens"]
    assert warm["output"] == [] and warm["usage"]["output_tokens"] == 0
    assert figures(warm) == (n, 0, n, 0)
    real = create(client, body)
    assert real["output"] and figures(real) == (n, n, 0, 0)


def test_a_request_writes_at_most_four_breakpoints(server_url):
    client, tag = sdk(server_url), secrets.token_hex(4)
    parts = [f"[{tag}] section {i}: " + "the parcel weighs two kilos. " * 8 for i in range(5)]
    ends = [sum(seg("user", p) for p in parts[: i + 1]) for i in range(5)]
    explicit = {"prompt_cache_options": {"mode": "explicit"}}
    first = create(client, [msg("user", p) for p in parts], **explicit)
    assert figures(first) == (ends[4], 0, ends[4], 0)  # the latest four, up to the last one
    tail = msg("user", "and then?", bp=False)
    # The first breakpoint was one too many: not written, so not read.
    assert figures(create(client, [msg("user", parts[0]), tail], **explicit))[1] == 0
    assert (
        figures(create(client, [msg("user", parts[0]), msg("user", parts[1]), tail], **explicit))[1]
        == ends[1]
    )


def test_matching_considers_the_latest_80_breakpoints(server_url):
    client, tag = sdk(server_url), secrets.token_hex(4)
    anchor = msg("developer", f"[{tag}] The repository layout. " * 20)
    a = seg("developer", anchor["content"][0]["text"])
    explicit = {"prompt_cache_options": {"mode": "explicit"}}
    assert figures(create(client, [anchor, msg("user", "go", bp=False)], **explicit))[1:] == (0, a, 0)

    def later(n: int, word: str) -> list[dict]:
        return [msg("user", f"{word} {i}") for i in range(n)]

    # 80 later breakpoints push the anchor out of the window; with 79 it is still matched.
    assert figures(create(client, [anchor, *later(80, "note")], **explicit))[1] == 0
    assert figures(create(client, [anchor, *later(79, "memo")], **explicit))[1] == a


def rollout_inputs(tag: str) -> tuple[dict, list[str]]:
    """A client's breakpoints: after the instructions and tools (on the system message), and
    at the last tool output of each turn."""
    system = msg("developer", f"[{tag}] You are a coding agent. Read before you edit. " * 15, "12h")
    return system, ["Fix the failing test.", "tool output one " * 40, "tool output two " * 40]


def tool_output(call_id: str, text: str) -> dict[str, Any]:
    part = {"type": "input_text", "text": text, "prompt_cache_breakpoint": {"mode": "explicit"}}
    return {"type": "function_call_output", "call_id": call_id, "output": [part]}


def run_rollout(client: OpenAI, transport: str, tag: str) -> list[tuple[int, int, int, int]]:
    system, texts = rollout_inputs(tag)
    meta = {"emulator.tool_rounds": "2", "emulator.text_tokens": "8"}
    common = {"model": MODEL, "tools": TOOLS, "metadata": meta}
    out, previous, history, new = [], None, [], [system, msg("user", texts[0], bp=False)]
    with ExitStack() as stack:
        conn = stack.enter_context(client.responses.connect()) if transport == "ws" else None
        for turn in range(3):
            if transport == "ws":
                assert conn is not None
                conn.response.create(**common, input=new, store=False, previous_response_id=previous)
                response = collect(conn)[-1]["response"]
            elif transport == "http-chained":
                raw = client.responses.with_raw_response.create(
                    **common, input=new, store=True, previous_response_id=previous
                )
                response = json.loads(raw.http_response.text)
            else:
                history += new
                with client.responses.create(**common, input=history, store=False, stream=True) as stream:
                    response = next(e for e in stream if e.type == "response.completed").response.model_dump()
            Response.model_validate_json(json.dumps(response), strict=True)
            out.append(figures(response))
            previous = response["id"]
            calls = [o for o in response["output"] if o["type"] == "function_call"]
            if transport == "http-full":
                history += [
                    {k: o[k] for k in ("type", "id", "call_id", "name", "arguments", "status")} for o in calls
                ]
            if turn < 2:
                assert calls, response["output"]
                new = [tool_output(calls[-1]["call_id"], texts[turn + 1])]
    return out


def test_the_three_transports_report_the_same_cache_figures(server_url):
    tag = secrets.token_hex(4)
    got = {t: run_rollout(sdk(server_url), t, tag) for t in ("ws", "http-chained", "http-full")}
    assert got["ws"] == got["http-chained"] == got["http-full"], got
    # By hand: turn 1 writes the system message for 12h and the rest for 30m; each later turn
    # reads the previous prompt (its implicit breakpoint) and writes its new tokens for 30m.
    system, _ = rollout_inputs(tag)
    tools = len(cf.render_tools([ToolSpec(t["name"], t["parameters"]) for t in TOOLS]))
    d = tools + seg("developer", system["content"][0]["text"])
    (n1, *first), (n2, *second), (n3, *third) = got["ws"]
    assert first == [0, n1 - d, d]
    assert second == [n1, n2 - n1, 0] and third == [n2, n3 - n2, 0]


def test_compaction_sends_compacting_between_the_items_added_and_done(server_url):
    client = sdk(server_url)
    long = "The service log says the cache warmed. " * 200  # over the threshold below
    with client.responses.connect() as conn:
        conn.response.create(model="emu-fast", input=long, store=False, metadata=TEXT)
        first = collect(conn)[-1]["response"]
        conn.response.create(
            model="emu-fast",
            input="Go on.",
            store=False,
            previous_response_id=first["id"],
            metadata=TEXT,
            context_management=[{"type": "compaction", "compact_threshold": 1000}],
        )
        events = collect(conn)  # each validated strictly as the SDK's ResponsesServerEvent
    kinds = [e["type"] for e in events]
    at = kinds.index("response.compaction.compacting")
    assert kinds[at - 1 : at + 2] == [
        "response.output_item.added",
        "response.compaction.compacting",
        "response.output_item.done",
    ]
    item = events[at - 1]["item"]
    assert item["type"] == "compaction"
    assert (
        events[at]["item_id"] == item["id"] and events[at]["output_index"] == events[at - 1]["output_index"]
    )
    seqs = [e["sequence_number"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"mode": "always"}, "prompt_cache_options.mode"),
        ({"ttl": "24h"}, "prompt_cache_options.ttl"),
        ({"prewarm": "yes"}, "prompt_cache_options.prewarm"),
    ],
)
def test_bad_cache_options_are_400s_naming_the_param(server_url, options, param):
    with pytest.raises(BadRequestError) as err:
        sdk(server_url).responses.create(model=MODEL, input="hi", prompt_cache_options=options)
    assert err.value.status_code == 400 and err.value.param == param
    assert err.value.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("breakpoint", "param"),
    [
        ({"mode": "implicit"}, "input[0].content[0].prompt_cache_breakpoint.mode"),
        ({"mode": "explicit", "ttl": "1h"}, "input[0].content[0].prompt_cache_breakpoint.ttl"),
        ({"mode": "explicit", "scope": "x"}, "input[0].content[0].prompt_cache_breakpoint.scope"),
    ],
)
def test_bad_breakpoints_are_400s_naming_the_param(server_url, breakpoint, param):
    part = {"type": "input_text", "text": "hi", "prompt_cache_breakpoint": breakpoint}
    with pytest.raises(BadRequestError) as err:
        sdk(server_url).responses.create(model=MODEL, input=[{"role": "user", "content": [part]}])
    assert err.value.param == param and err.value.type == "invalid_request_error"
