"""The Ray Serve LLM backend end to end (``kind: serve_llm``, configs/real-model-serve-llm.yaml):
SmolLM2-135M-Instruct in a ``ray.serve.llm`` deployment (vLLM's CPU build) of the same app,
called by the session hosts through its handle.  No mock of the engine: the handle's
streamed token ids decode to the streamed text and continue the conversation; greedy
output repeats; a store=false continuation over the openai SDK's WebSocket reports the
engine's cached_tokens; a client that goes away stops the engine's generation."""

from __future__ import annotations

import itertools

from tests.real_model.conftest import LLM_APP, MODEL, chained_turns, generating, ray_engine_running
from tests.real_model.test_engine import INSTRUCTIONS
from tests.support.server import on_handle_loop
from tests.support.waiting import wait_until


def test_the_model_is_a_deployment_of_the_app_listed_beside_the_emulated_ones(llm_url, llm_backend):
    from openai import OpenAI
    from ray import serve

    client = OpenAI(base_url=f"{llm_url}/v1", api_key="sk-serve-llm", max_retries=0)
    assert {m.id for m in client.models.list()} >= {MODEL, "emu-fast", "emu-gpu"}
    assert llm_backend.deployment in serve.status().applications[LLM_APP].deployments


def test_the_handles_token_ids_decode_to_the_text_and_continue_the_conversation(llm_url, llm_backend):
    """The session host's client, here in the test process: the deployment's chunks become
    the seam's events, and ``Done`` hands back the engine's own output ids, framed as the
    template closes an assistant message."""
    from actors.backend.serve_llm_client import ServeLLMInference
    from inference.chat_template import TemplateFormat
    from inference.types import Done, InferenceRequest, Prefilled, TextDelta

    fmt = TemplateFormat.load(llm_backend.tokenizer)
    prompt = fmt.render_instructions(None) + fmt.render_message("user", "Describe the sea in two sentences.")

    async def call() -> list:
        engine = ServeLLMInference(llm_backend, fmt, LLM_APP)
        assert await engine.warm() == [MODEL]
        return [
            e
            async for chunk in engine.stream(InferenceRequest("t", MODEL, prompt, max_output_tokens=40))
            for e in chunk
        ]

    events = on_handle_loop(call(), timeout_s=300)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    (prefilled,) = [e for e in events if isinstance(e, Prefilled)]
    done = events[-1]
    assert isinstance(done, Done) and done.context_token_ids is not None and len(deltas) > 1
    assert prefilled.prompt_tokens == len(prompt) + len(fmt.generation_prompt)  # the engine's count
    context = list(done.context_token_ids)
    closing = fmt.render_message("assistant", "")[len(fmt.generation_prompt) :]
    assert (
        context[: len(fmt.generation_prompt)] == fmt.generation_prompt and context[-len(closing) :] == closing
    )
    assert fmt.decode(context[len(fmt.generation_prompt) : -len(closing)]) == "".join(d.text for d in deltas)
    assert sum(d.tokens for d in deltas) == done.output_tokens > 0


def test_greedy_output_is_deterministic(llm_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{llm_url}/v1", api_key="sk-serve-llm", max_retries=0)
    runs = [
        client.responses.create(model=MODEL, input="Name three colours.", store=False, max_output_tokens=24)
        for _ in range(2)
    ]
    assert runs[0].output_text and runs[0].output_text == runs[1].output_text
    assert runs[0].usage.output_tokens == runs[1].usage.output_tokens > 0


def test_a_store_false_websocket_continuation_reports_the_engines_cached_tokens(llm_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{llm_url}/v1", api_key="sk-serve-llm-ws", max_retries=0)
    usages, texts = chained_turns(
        client, ("What is the capital of France?", "And of Germany?", "And of Italy?"), INSTRUCTIONS
    )
    assert all(texts)
    for before, after in itertools.pairwise(usages):
        assert after.input_tokens > before.input_tokens + before.output_tokens
        # Each prompt extends the one before token for token: the engine reused at least
        # that prompt's whole blocks (vLLM's CPU build: 128 tokens a block).
        assert after.input_tokens_details.cached_tokens >= before.input_tokens // 128 * 128 > 0


def test_a_client_that_goes_away_stops_the_engines_generation(llm_url):
    with generating(llm_url, "sk-serve-llm"):
        # Generating, with ~2000 tokens to go (minutes here); the engine's gauge reaches
        # Ray's metrics endpoint within its report interval.
        wait_until(lambda: ray_engine_running() >= 1, timeout_s=60, what="the engine's running request")
    # Closed: the session host cancels the handle's response, Serve cancels the call in the
    # replica, and vLLM aborts the request.
    wait_until(lambda: ray_engine_running() == 0, timeout_s=60, what="the engine to stop generating")
