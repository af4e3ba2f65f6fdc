"""A real model behind the sessions, end to end: SmolLM2-135M-Instruct on vLLM's CPU build,
no mock of the engine.  Greedy output repeats; the engine's streamed token ids decode to the
streamed text; a store=false continuation over a socket hits the engine's prefix cache
(usage reports the engine's cached_tokens); a client that goes away stops the generation;
the openai SDK runs an agent loop over HTTP and over a WebSocket."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.real_model.conftest import MODEL, chained_turns, engine_running, generating
from tests.support.waiting import wait_until

# Long enough instructions that the prompt spans full KV blocks (vLLM's CPU build caches
# and reports whole 128-token blocks).
INSTRUCTIONS = "You are a concise assistant. " + " ".join(
    f"Rule {i}: answer briefly and factually." for i in range(40)
)


@pytest.fixture(scope="module")
def client(real_url):
    from openai import OpenAI

    return OpenAI(base_url=f"{real_url}/v1", api_key="sk-real-model", max_retries=0)


def test_the_model_is_listed_beside_the_emulated_ones(client):
    assert {m.id for m in client.models.list()} >= {MODEL, "emu-fast", "emu-gpu"}


def test_greedy_output_is_deterministic(client):
    runs = [
        client.responses.create(model=MODEL, input="Name three colours.", store=False, max_output_tokens=24)
        for _ in range(2)
    ]
    assert runs[0].output_text and runs[0].output_text == runs[1].output_text
    assert runs[0].usage.output_tokens == runs[1].usage.output_tokens > 0


def test_streamed_token_ids_decode_to_the_streamed_text(backend):
    from actors.backend.openai_upstream import UpstreamInference
    from actors.config import ModelBackend
    from inference.chat_template import TemplateFormat
    from inference.types import Done, InferenceRequest, TextDelta

    config = ModelBackend(**backend)
    fmt = TemplateFormat.load(config.tokenizer)
    engine = UpstreamInference(config, fmt)
    prompt = fmt.render_instructions(None) + fmt.render_message("user", "Describe the sea in two sentences.")

    async def call() -> list:
        try:
            return [
                e
                async for chunk in engine.stream(InferenceRequest("t", MODEL, prompt, max_output_tokens=40))
                for e in chunk
            ]
        finally:
            await engine.close()

    events = asyncio.run(call())
    deltas = [e for e in events if isinstance(e, TextDelta)]
    done = events[-1]
    assert isinstance(done, Done) and done.context_token_ids is not None and len(deltas) > 1
    context = list(done.context_token_ids)
    closing = fmt.render_message("assistant", "")[len(fmt.generation_prompt) :]  # <|im_end|> "\n"
    assert (
        context[: len(fmt.generation_prompt)] == fmt.generation_prompt and context[-len(closing) :] == closing
    )
    output_ids = context[len(fmt.generation_prompt) : -len(closing)]  # the engine's ids (less its end token)
    assert fmt.decode(output_ids) == "".join(d.text for d in deltas)
    assert sum(d.tokens for d in deltas) == done.output_tokens


def test_a_store_false_websocket_continuation_hits_the_engines_prefix_cache(client):
    usages, texts = chained_turns(client, ("What is the capital of France?", "And of Germany?"), INSTRUCTIONS)
    assert all(texts)
    assert usages[1].input_tokens > usages[0].input_tokens + usages[0].output_tokens
    # The second prompt extends the first token for token: the engine reused at least the
    # first prompt's whole blocks.
    assert usages[1].input_tokens_details.cached_tokens >= usages[0].input_tokens // 128 * 128 > 0


def test_a_client_that_goes_away_stops_the_generation(real_url, engine_url):
    with generating(real_url, "sk-real-model"):
        assert engine_running(engine_url) >= 1  # generating, with ~2000 tokens to go
    # Closed: the session host cancels the call, the HTTP stream to the engine closes, and
    # vLLM aborts the request (2000 tokens would take minutes here).
    wait_until(lambda: engine_running(engine_url) == 0, timeout_s=30, what="the engine to stop generating")


def test_the_openai_sdk_runs_an_agent_loop_with_stored_history(client):
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    response = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=tools, max_output_tokens=48
    )
    for _ in range(3):  # the loop: answer each call, continue from the stored response
        calls = [o for o in response.output if o.type == "function_call"]
        assert response.status in ("completed", "incomplete")
        if not calls:
            break
        response = client.responses.create(
            model=MODEL,
            previous_response_id=response.id,
            tools=tools,
            max_output_tokens=48,
            input=[
                {"type": "function_call_output", "call_id": c.call_id, "output": '{"sky": "clear", "c": 21}'}
                for c in calls
            ],
        )
    follow_up = client.responses.create(
        model=MODEL, previous_response_id=response.id, max_output_tokens=24, input="Thanks. Say goodbye."
    )
    assert follow_up.status in ("completed", "incomplete") and follow_up.output_text
    assert client.responses.retrieve(follow_up.id).previous_response_id == response.id


def test_a_foreign_web_page_cannot_use_the_model(real_url):
    """The default allow-list (loopback pages only, serve/origins.py): a page elsewhere that
    opens a socket or POSTs to the server is refused before anything reaches the model."""
    import urllib.error
    import urllib.request

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    from bench.client import ws_url

    foreign = {"Origin": "https://attacker.example"}
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(real_url), additional_headers=foreign)
    assert refused.value.response.status_code == 403
    body = json.dumps({"model": MODEL, "input": "hi", "max_output_tokens": 4}).encode()
    post = urllib.request.Request(
        f"{real_url}/v1/responses",
        data=body,
        method="POST",
        headers={**foreign, "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as http_refused:
        urllib.request.urlopen(post, timeout=30)
    assert http_refused.value.code == 403
