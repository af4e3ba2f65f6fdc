"""Input items real clients send (Codex CLI, the openai SDK, the Agents SDK): each shape
parses, stores and reads back, and renders into the context (docs/protocol.md §2.2); only
what cannot be meaningful is a typed 400 naming the field."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from actors.core.inputs import InferenceChunk
from actors.core.render import item_text, render_item
from actors.core.session import Effects
from actors.errors import InvalidRequest
from actors.protocol import (
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallOutputItem,
    ToolItem,
    item_dict,
    parse_http_create,
    parse_items,
)
from inference import chat_format
from inference.tokenizer import decode
from inference.types import Done, FunctionCallDelta, Prefilled
from tests.actors.test_session import MODEL, TOOL, answer_call, dumped, new_session, send, terminal
from tests.support.session_driver import handled

# What Codex CLI 0.171.0 sent in one run: its goal objective, a tool output with no call_id.
GOAL = {
    "type": "function_call_output",
    "id": "fco_01a2",
    "name": "goal_objective",
    "namespace": "agent",
    "output": "tests",
}


def rendered(raw: dict) -> str:
    """The text of one item's segment (separator and header included)."""
    (item,) = parse_items([raw])
    return decode(render_item(item))


def body(header: str, text: str) -> str:
    return decode(chat_format.render_other(header, text))


def parse(raw: dict):
    return parse_http_create(json.dumps({"model": MODEL, "input": [raw]})).items[0]


# ----------------------------------------------------------------- parse and render, per shape


def test_a_tool_output_without_call_id_is_a_named_context_item():
    item = parse(GOAL)
    assert isinstance(item, FunctionCallOutputItem) and item.call_id is None
    assert rendered(GOAL) == body("tool_output", "agent.goal_objective\ntests")


def test_a_namespaced_call_and_its_output_render_the_qualified_name_and_the_output():
    call = {
        "type": "function_call",
        "call_id": "c1",
        "name": "spawn",
        "namespace": "multi_agent_v1",
        "arguments": "{}",
        "caller": {"type": "direct"},
    }
    out = {
        "type": "function_call_output",
        "call_id": "c1",
        "name": "spawn",
        "namespace": "multi_agent_v1",
        "output": [{"type": "input_text", "text": "ok"}],
        "caller": {"type": "direct"},
    }
    assert rendered(call) == decode(chat_format.render_function_call("multi_agent_v1.spawn", "{}"))
    assert rendered(out) == decode(chat_format.render_function_call_output("ok"))


def test_a_plain_call_and_output_render_exactly_as_before():
    call = {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": '{"path":"a"}'}
    out = {"type": "function_call_output", "call_id": "c1", "output": "x"}
    (c, o) = parse_items([call, out])
    assert render_item(c) == chat_format.render_function_call("read_file", '{"path":"a"}')
    assert render_item(o) == chat_format.render_function_call_output("x")


def test_a_conversation_renders_the_same_whatever_its_call_ids():
    """Call ids are random per run and per transport; rendered, they would make the same
    conversation cost different prefix-cache hits on ws and HTTP (docs/emulator.md)."""

    def conversation(call_id: str) -> list[int]:
        items = parse_items(
            [
                {"type": "message", "role": "user", "content": "fix it"},
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "read_file",
                    "arguments": '{"path":"a"}',
                },
                {"type": "function_call_output", "call_id": call_id, "output": "print(1)"},
                {"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch", "input": "x"},
                {"type": "custom_tool_call_output", "call_id": call_id, "output": "done"},
            ]
        )
        return [t for item in items for t in render_item(item)]

    assert len({tuple(conversation(f"call_{n:024x}")) for n in (1, 2**90, 7**40)}) == 1


def test_custom_tool_call_and_output_render_name_and_text_without_the_call_id():
    call = {
        "type": "custom_tool_call",
        "id": "ctc_1",
        "call_id": "call_9",
        "name": "apply_patch",
        "input": "*** Begin Patch\n*** End Patch",
        "status": "completed",
    }
    out = {
        "type": "custom_tool_call_output",
        "call_id": "call_9",
        "name": "apply_patch",
        "output": "Invalid patch",
    }
    assert isinstance(parse(call), CustomToolCallItem) and isinstance(parse(out), CustomToolCallOutputItem)
    assert rendered(call) == body("custom_tool_call", "apply_patch\n*** Begin Patch\n*** End Patch")
    assert rendered(out) == body("custom_tool_call_output", "apply_patch\nInvalid patch")
    assert "call_9" not in rendered(out)


def test_custom_tool_output_content_parts_render_as_their_text():
    out = {
        "type": "custom_tool_call_output",
        "call_id": "c",
        "output": [
            {"type": "input_text", "text": "line"},
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="},
        ],
    }
    assert rendered(out) == body("custom_tool_call_output", "\nline\n[input_image]")


def test_reasoning_renders_summary_content_and_encrypted_content():
    raw = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "plan"}],
        "content": [{"type": "reasoning_text", "text": "think"}],
        "encrypted_content": "gAAA",
    }
    assert rendered(raw) == body("reasoning", "plan thinkgAAA")
    # Without ``content`` the segment is what it always was.
    assert rendered({"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}) == body(
        "reasoning", "s"
    )


def test_a_message_with_phase_renders_as_a_message():
    raw = {
        "type": "message",
        "role": "assistant",
        "phase": "commentary",
        "content": [{"type": "output_text", "text": "working"}],
    }
    assert rendered(raw) == decode(chat_format.render_message("assistant", "working"))


def test_an_item_reference_may_omit_its_type():
    (ref,) = parse_items([{"id": "msg_1"}])
    assert ref.type == "item_reference" and item_dict(ref, "x") == {"type": "item_reference", "id": "msg_1"}
    with pytest.raises(InvalidRequest) as err:  # with neither type nor id it is still a message
        parse({"content": "hi"})
    assert err.value.param == "input[0].role"


def test_input_audio_is_a_placeholder_part():
    raw = {
        "role": "user",
        "content": [{"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}],
    }
    assert rendered(raw) == decode(chat_format.render_message("user", "[input_audio]"))


TOOL_ITEMS = [
    {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "call_l",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls", "-la"], "env": {}, "timeout_ms": 1000},
    },
    {"type": "local_shell_call_output", "id": "call_l", "output": "README.md"},
    {"type": "tool_search_call", "call_id": "call_t", "execution": "client", "arguments": {"query": "git"}},
    {
        "type": "tool_search_output",
        "call_id": "call_t",
        "execution": "client",
        "tools": [{"type": "function", "name": "git_log", "parameters": {}}],
    },
    {
        "type": "additional_tools",
        "role": "developer",
        "tools": [{"type": "function", "name": "late", "parameters": {}}],
    },
    {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "q"},
    },
    {"type": "shell_call", "call_id": "call_s", "action": {"commands": ["pwd"]}, "status": "completed"},
    {
        "type": "shell_call_output",
        "call_id": "call_s",
        "output": [{"stdout": "/w", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
    },
    {
        "type": "apply_patch_call",
        "call_id": "call_p",
        "status": "completed",
        "operation": {"type": "delete_file", "path": "x"},
    },
    {"type": "apply_patch_call_output", "call_id": "call_p", "status": "failed", "output": "no such file"},
    {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "call_c",
        "status": "completed",
        "action": {"type": "click", "x": 1, "y": 2, "button": "left"},
        "pending_safety_checks": [],
    },
    {
        "type": "computer_call_output",
        "call_id": "call_c",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="},
    },
    {"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["q"]},
    {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": "AA=="},
    {
        "type": "code_interpreter_call",
        "id": "ci_1",
        "status": "completed",
        "code": "1+1",
        "container_id": "cntr",
        "outputs": [],
    },
    {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "s", "tools": []},
    {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "s", "name": "t", "arguments": "{}"},
    {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True},
    {"type": "mcp_call", "id": "mcp_1", "server_label": "s", "name": "t", "arguments": "{}", "output": "r"},
    {"type": "configuration_update", "reasoning": {"effort": "low"}},
    {"type": "compaction_trigger"},
    {"type": "program", "call_id": "call_g", "code": "print(1)"},
    {"type": "program_output", "call_id": "call_g", "status": "completed", "output": "1"},
]


@pytest.mark.parametrize("raw", TOOL_ITEMS, ids=[i["type"] for i in TOOL_ITEMS])
def test_tool_items_are_kept_as_sent_and_render_their_fields_as_canonical_json(raw):
    item = parse(raw)
    assert isinstance(item, ToolItem)
    fields = {k: v for k, v in raw.items() if k not in ("type", "id", "status", "call_id")}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert rendered(raw) == body(raw["type"], text) and item_text(item) == text
    stored = item_dict(item, "item_1")
    assert stored == {"id": "item_1", "status": "completed", **raw}
    assert item_dict(parse_items([stored])[0], "other") == stored  # the store reads it back strictly


def test_every_new_shape_stores_and_reads_back():
    raws = [
        GOAL,
        {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "p"},
        {"type": "custom_tool_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "t"}]},
    ]
    stored = [item_dict(i, f"x{n}") for n, i in enumerate(parse_items(raws))]
    assert stored[0] == {**GOAL, "status": "completed"}
    assert stored[2]["output"] == [{"type": "input_text", "text": "t"}]
    assert [item_dict(i, "y") for i in parse_items(stored)] == stored


# ----------------------------------------------------------------- what is still refused


@pytest.mark.parametrize(
    "raw, param, code",
    [
        (
            {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"},
            "input[0].input",
            "missing_required_parameter",
        ),
        (
            {"type": "custom_tool_call_output", "output": "x"},
            "input[0].call_id",
            "missing_required_parameter",
        ),
        ({"type": "function_call_output", "call_id": "c"}, "input[0].output", "missing_required_parameter"),
        ({"type": "function_call_output", "output": "x", "name": 7}, "input[0].name", "invalid_type"),
        ({"type": "local_shell_call", "call_id": 5, "action": {}}, "input[0].call_id", "invalid_type"),
        ({"type": "function_call_output", "output": "x", "bogus": 1}, "input[0].bogus", "unknown_parameter"),
        ({"type": "teleport_call", "call_id": "c"}, "input[0]", "invalid_value"),
    ],
)
def test_what_cannot_be_meaningful_is_a_typed_400_naming_the_field(raw, param, code):
    with pytest.raises(InvalidRequest) as err:
        parse(raw)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


# ----------------------------------------------------------------- through the session


def test_codex_goal_objective_beside_the_call_output_is_accepted_and_not_a_result():
    s = new_session()
    r1 = terminal(answer_call(s, send(s, input="go", tools=[TOOL], store=False)))
    call_id = r1["output"][0]["call_id"]
    fx = send(
        s,
        previous_response_id=r1["id"],
        store=False,
        tools=[TOOL],
        input=[{"type": "function_call_output", "call_id": call_id, "output": "{}"}, GOAL],
    )
    (turn,) = fx.start
    assert turn.request.tool_results_in_context == 1
    assert "agent.goal_objective\ntests" in decode(turn.request.prompt_token_ids)


def test_a_full_codex_history_with_custom_and_local_shell_calls_is_one_conversation():
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "error: bad patch"},
        {
            "type": "local_shell_call",
            "call_id": "call_l",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls"]},
        },
        {"type": "function_call_output", "call_id": "call_l", "output": "README.md"},  # Codex answers so
        GOAL,
    ]
    s = new_session()
    (turn,) = send(s, input=history, tools=[TOOL]).start
    assert turn.request.tool_results_in_context == 2


def test_a_custom_tool_output_for_a_call_never_issued_is_refused_naming_its_call_id():
    s = new_session()
    (err,) = dumped(send(s, input=[{"type": "custom_tool_call_output", "call_id": "call_x", "output": "o"}]))
    assert err["status"] == 400 and err["error"]["param"] == "input[0].call_id"
    assert err["error"]["message"] == "No tool call found for custom tool call output with call_id call_x."


# ----------------------------------------------------------------- the model calling a custom tool

PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}


def answer_custom(s, fx, text="*** Begin Patch\n*** End Patch"):
    (turn,) = fx.start
    out = Effects(events=list(fx.events))
    out += handled(
        s,
        InferenceChunk(
            turn.turn_id,
            [
                Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1),
                FunctionCallDelta(0, "apply_patch", text[:9], 3, custom=True),
            ],
        ),
    )
    out += handled(
        s,
        InferenceChunk(
            turn.turn_id,
            [FunctionCallDelta(0, "apply_patch", text[9:], 5, custom=True), Done("tool_calls", 8, 8.0)],
        ),
    )
    return out


def test_a_custom_tool_is_offered_to_the_model_as_a_custom_spec():
    s = new_session()
    (turn,) = send(s, input="fix", tools=[TOOL, PATCH_TOOL, {"type": "web_search"}]).start
    assert [(t.name, t.custom) for t in turn.request.tools] == [("read_file", False), ("apply_patch", True)]


def test_a_custom_tool_call_streams_its_input_and_the_sdk_reads_every_event():
    s = new_session()
    events = dumped(answer_custom(s, send(s, input="fix", tools=[PATCH_TOOL])))
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[-2]["item"]
    assert (
        item["type"] == "custom_tool_call"
        and item["id"].startswith("ctc_")
        and item["call_id"].startswith("call_")
    )
    assert (
        "".join(e["delta"] for e in events if e["type"].endswith("input.delta"))
        == item["input"]
        == events[5]["input"]
        == "*** Begin Patch\n*** End Patch"
    )
    for event in events:
        TypeAdapter(ResponseStreamEvent).validate_python(event)
    assert events[-1]["response"]["output"] == [item]


def test_a_custom_call_is_answered_by_its_output_and_the_context_extends():
    s = new_session()
    r1 = terminal(answer_custom(s, send(s, input="fix", tools=[PATCH_TOOL], store=False)))
    call = r1["output"][0]
    fx = send(
        s,
        previous_response_id=r1["id"],
        store=False,
        tools=[PATCH_TOOL],
        input=[{"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done!"}],
    )
    (turn,) = fx.start
    assert turn.request.tool_results_in_context == 1
    prompt = decode(turn.request.prompt_token_ids)
    assert prompt.endswith(
        decode(chat_format.render_custom_tool_call("apply_patch", call["input"]))
        + body("custom_tool_call_output", "\nDone!")
    )
    (output,) = parse_items([call])  # sent back as input, it renders as the model's own call did
    assert render_item(output) == chat_format.render_custom_tool_call("apply_patch", call["input"])
