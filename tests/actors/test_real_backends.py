"""The pure parts of the real-model backends (docs/backends.md): a real engine's streamed
completion chunks become the seam's events (tool calls parsed, usage taken from the engine),
and a session renders each model in its own chat format and continues a conversation with
the engine's own output ids.  The chat format here is a toy behind the typed seam
(inference.formats.ChatFormat); the real template is tested against the real model in
tests/real_model/."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

import pytest

from actors.backend.canned import CannedClient
from actors.backend.completions import CompletionStream, EngineError, completion_body, sse_batch, sse_data
from actors.backend.model_router import ModelRouter, model_entries
from actors.config import ModelBackend, SessionConfig
from actors.core.inputs import ClientFrame, InferenceChunk, Written
from actors.core.render import render_items
from actors.core.session import Session
from actors.protocol import parse_items
from inference.chat_template import InvalidToolCall, call_text, parse_calls
from inference.types import (
    Done,
    FunctionCallDelta,
    InferenceEvent,
    InferenceRequest,
    Prefilled,
    TextDelta,
    ToolSpec,
)
from tests.support.session_driver import handled

REAL = "real-model"
TOOLS = (ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),)


class ToyFormat:
    """A chat format whose tokens are code points, a role's segment framed by 1 … 2."""

    name = "toy"
    generation_prompt = [1, ord("A")]

    def _seg(self, role: str, text: str) -> list[int]:
        return [1, ord(role[0].upper()), *map(ord, text), 2]

    def render_tools(self, tools: Sequence[ToolSpec]) -> list[int]:
        return self._seg("tools", ",".join(t.name for t in tools)) if tools else []

    def render_instructions(self, text: str | None) -> list[int]:
        return self._seg("system", text) if text else []

    def render_message(self, role: str, text: str) -> list[int]:
        return self._seg(role, text)

    def render_function_call(self, name: str, arguments: str) -> list[int]:
        return self._seg("assistant", call_text(name, arguments))

    def render_function_call_output(self, output: str) -> list[int]:
        return self._seg("tool", output)

    def render_custom_tool_call(self, name: str, tool_input: str) -> list[int]:
        return self._seg("assistant", tool_input)

    def render_other(self, kind: str, text: str) -> list[int]:
        return self._seg("user", text)

    def continuation(self, output_ids: Sequence[int]) -> list[int]:
        return [*self.generation_prompt, *output_ids] + ([] if output_ids[-1:] == [2] else [2])


def chunk(
    text: str = "", ids: Sequence[int] = (), finish: str | None = None, usage: dict | None = None
) -> dict:
    return {
        "choices": [{"index": 0, "text": text, "token_ids": list(ids), "finish_reason": finish}],
        **({"usage": usage} if usage else {}),
    }


def request(**kw) -> InferenceRequest:
    return InferenceRequest(request_id="r", model=REAL, prompt_token_ids=[5, 6, 7], **kw)


def run(stream: CompletionStream, chunks: list[dict]) -> list[InferenceEvent]:
    events: list[InferenceEvent] = []
    for c in chunks:
        events += stream.feed(c)
    return events + stream.finish()


USAGE = {"prompt_tokens": 300, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 256}}


def test_text_streams_as_it_comes_and_usage_is_the_engines():
    events = run(
        CompletionStream(request(), ToyFormat()),
        [chunk("Hel", [10]), chunk("lo", [11]), chunk("", [2], "stop"), {"choices": [], "usage": USAGE}],
    )
    assert events[:2] == [TextDelta("Hel", 1), TextDelta("lo", 1)]
    prefilled, done = events[-2:]
    assert isinstance(prefilled, Prefilled) and (prefilled.prompt_tokens, prefilled.cached_tokens) == (
        300,
        256,
    )
    assert isinstance(done, Done) and (done.finish_reason, done.output_tokens) == ("stop", 3)
    assert done.context_token_ids == (1, ord("A"), 10, 11, 2)  # the engine's ids, closed once


def test_a_cut_output_is_closed_by_the_template_and_reported_as_max_output_tokens():
    done = run(CompletionStream(request(), ToyFormat()), [chunk("Hi", [10], "length")])[-1]
    assert isinstance(done, Done) and done.finish_reason == "max_output_tokens"
    assert done.context_token_ids == (1, ord("A"), 10, 2)


def test_a_tool_call_is_held_and_parsed_into_function_call_deltas():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    pieces = [text[:4], text[4:30], text[30:]]
    stream = CompletionStream(request(tools=TOOLS), ToyFormat())
    events = [e for i, p in enumerate(pieces) for e in stream.feed(chunk(p, [20 + i]))]
    assert events == []  # nothing streams while the output may be a call
    out = stream.finish()
    assert out[0] == FunctionCallDelta(0, "get_weather", '{"city": "Paris"}', 3)
    assert isinstance(out[-1], Done) and out[-1].finish_reason == "tool_calls"


def test_text_that_only_starts_like_a_call_is_released_as_text():
    stream = CompletionStream(request(tools=TOOLS), ToyFormat())
    assert stream.feed(chunk(" <to", [1])) == []
    assert stream.feed(chunk("day", [2])) == [TextDelta(" <today", 2)]
    assert stream.feed(chunk(" sun", [3])) == [TextDelta(" sun", 1)]


@pytest.mark.parametrize(
    "text, detail",
    [
        ("<tool_call>{not json}</tool_call>", "is not JSON"),
        ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "no tool is named 'rm_rf'"),
        ('<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>', "not a JSON object"),
        ('<tool_call>{"name": "get_weather"', "is not closed"),
    ],
)
def test_an_invalid_call_is_a_typed_error_with_a_public_message(text, detail):
    with pytest.raises(InvalidToolCall) as err:
        parse_calls(text, TOOLS)
    assert detail in err.value.public_message and err.value.code == "server_error"


def test_calls_parse_with_arguments_as_an_object_or_a_json_string():
    text = (
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    )
    assert [c.arguments for c in parse_calls(text, TOOLS)] == ['{"city": "Oslo"}', '{"city": "Rome"}']
    assert parse_calls("no call here", TOOLS) == []


def test_the_request_carries_token_ids_the_generation_prompt_and_the_key_scope():
    backend = ModelBackend(id=REAL, tokenizer="/m", url="http://127.0.0.1:1/v1", engine_model="engine-name")
    body = completion_body(request(cache_scope="key:abc", max_output_tokens=9), backend, ToyFormat())
    assert body["prompt"] == [5, 6, 7, 1, ord("A")] and body["model"] == "engine-name"
    assert body["max_tokens"] == 9 and body["return_token_ids"] and body["cache_salt"] == "key:abc"
    assert completion_body(request(generate=False), backend, ToyFormat())["max_tokens"] == 1
    assert (
        sse_data(b'data: {"a": 1}\n') == {"a": 1}
        and sse_data("data: [DONE]") is None
        and sse_data(": ping") is None
    )


def test_a_backend_needs_its_engines_url_and_a_known_kind():
    with pytest.raises(ValueError, match="url"):
        ModelBackend(id=REAL, tokenizer="/m")
    with pytest.raises(ValueError, match="kind"):
        ModelBackend(id=REAL, tokenizer="/m", url="http://x/v1", kind="ray_serve_llm")


def test_a_serve_llm_backend_is_a_deployment_of_the_app_with_the_engines_prefix_cache_on():
    backend = ModelBackend(id=REAL, tokenizer="/m", kind="serve_llm")
    assert backend.deployment == f"LLMServer:{REAL}" and backend.served_name == REAL
    assert (
        backend.engine_kwargs["enable_prefix_caching"]
        and backend.engine_kwargs["enable_prompt_tokens_details"]
    )
    with pytest.raises(ValueError, match="no url"):
        ModelBackend(id=REAL, tokenizer="/m", kind="serve_llm", url="http://x/v1")


def test_an_emulated_model_in_a_real_models_format_is_the_emulators():
    """``kind: emulator``: rendered with its tokenizer, served by the emulator's profile of
    its id (listed by the emulator, not twice)."""
    from serve.config import AppConfig

    emulated = ModelBackend(id="emu-fast", tokenizer="/m", kind="emulator")
    config = SessionConfig(backends=(emulated,))
    emulator = answering("emu-fast")
    assert ModelRouter.of(emulator, config) is emulator and model_entries(config) == []
    assert AppConfig(session=config).session.backends == (emulated,)
    with pytest.raises(ValueError, match="needs an inference profile"):
        AppConfig(session=SessionConfig(backends=(emulated.model_copy(update={"id": "no-such-profile"}),)))


def test_a_serve_llm_stream_item_is_a_list_of_sse_strings_or_an_error():
    chunk = {"choices": [{"text": "Hi", "token_ids": [5]}]}
    batch = [f"data: {json.dumps(chunk)}\n\n", "data: [DONE]\n\n"]
    assert sse_batch(batch) == [chunk] and sse_batch(batch[0]) == [chunk]

    class ErrorResponse:  # ray.serve.llm's, as the deployment yields it in the list
        error = "model not found"

    with pytest.raises(EngineError, match="model not found"):
        sse_batch([batch[0], ErrorResponse()])


def test_an_error_chunk_mid_stream_fails_the_call():
    stream = CompletionStream(request(), ToyFormat())
    assert stream.feed({"choices": [{"text": "a", "token_ids": [97]}]})
    with pytest.raises(EngineError, match="out of memory") as err:
        stream.feed({"error": {"message": "out of memory", "type": "InternalServerError"}})
    assert err.value.code == "server_error"


# ------------------------------------------------------------------ the session side


def session() -> Session:
    return Session(
        SessionConfig(), ["emu-fast", REAL], session_key="c", clock=lambda: 1.0, formats={REAL: ToyFormat()}
    )


def turn(s: Session, output_ids: list[int] | None, **body):
    fx = handled(
        s, ClientFrame(json.dumps({"type": "response.create", "model": REAL, "store": False, **body}))
    )
    (t,) = fx.start
    done = Done(
        "stop",
        1,
        1.0,
        context_token_ids=None if output_ids is None else tuple(ToyFormat().continuation(output_ids)),
    )
    fx = handled(
        s,
        InferenceChunk(
            t.turn_id, [TextDelta("Hi", 1), Prefilled(len(t.request.prompt_token_ids), 0, 0, 0), done]
        ),
    )
    for line in fx.usage:  # the driver wrote the ledger line
        handled(s, Written(line.response_id, True))
    return t


def test_a_real_model_renders_in_its_own_format_and_continues_with_the_engines_ids():
    s = session()
    first = turn(s, [70, 71, 2], input="hello", instructions="be brief")
    assert list(first.request.prompt_token_ids) == ToyFormat().render_instructions(
        "be brief"
    ) + ToyFormat().render_message("user", "hello")
    second = turn(
        s, [72, 2], input="again", instructions="be brief", previous_response_id=first.builder.response.id
    )
    expected = [
        *first.request.prompt_token_ids,
        1,
        ord("A"),
        70,
        71,
        2,
        *ToyFormat().render_message("user", "again"),
    ]
    assert (
        list(second.request.prompt_token_ids) == expected
    )  # an exact extension: the engine's ids as they are


def test_a_conversation_continued_by_a_model_of_another_format_is_re_rendered():
    s = session()
    first = turn(s, [70, 2], input="hello")
    fx = handled(
        s,
        ClientFrame(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "emu-fast",
                    "store": False,
                    "input": "more",
                    "previous_response_id": first.builder.response.id,
                }
            )
        ),
    )
    (t,) = fx.start
    cl100k = render_items(
        parse_items(
            [
                {"type": "message", "role": "user", "content": "hello"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
                {"type": "message", "role": "user", "content": "more"},
            ]
        )
    )
    assert list(t.request.prompt_token_ids) == cl100k


def answering(name: str) -> CannedClient:
    """A backend serving ``name`` that answers every call with ``Done`` at once."""

    async def done(request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        yield [Done("stop", 0, 0.0)]

    return CannedClient([name], done)


def test_the_router_sends_each_model_to_its_backend_and_lists_them_all():
    emulator, real = answering("emu-fast"), answering(REAL)
    router = ModelRouter(emulator, {REAL: real})

    async def main() -> list[str]:
        for model in ("emu-fast", REAL, "emu-gpu"):
            async for _ in router.stream(InferenceRequest("r", model, [])):
                pass
        return await router.warm()

    assert asyncio.run(main()) == ["emu-fast", REAL]
    assert ([r.model for r in emulator.requests], [r.model for r in real.requests]) == (
        ["emu-fast", "emu-gpu"],
        [REAL],
    )
    config = SessionConfig(
        backends=(ModelBackend(id=REAL, tokenizer="/m", url="http://x/v1", owned_by="me"),)
    )
    assert model_entries(config, created=5) == [
        {"id": REAL, "object": "model", "created": 5, "owned_by": "me"}
    ]
    assert ModelRouter.of(emulator, SessionConfig()) is emulator
