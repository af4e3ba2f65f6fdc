"""The emulator hands the session its output as token ids (``Done.context_token_ids``), and
the session continues the conversation with them instead of tokenising the output again:
they must be exactly what the session would render from the output items it built — for
text, function calls, custom tool calls, hidden reasoning and a cut answer."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.config import SessionConfig
from actors.core.inputs import ClientFrame, InferenceChunk
from actors.core.render import render_items
from actors.core.session import Session
from inference.emulator.engine import Engine
from inference.emulator.profiles import load_inference_config
from inference.types import Done
from tests.support.session_driver import handled

MODEL = "emu-fast"
READ = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch"}


class Instant:
    """Clock and sleeper: time jumps to whatever is awaited."""

    t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float, precise: bool = False) -> None:
        self.t = max(self.t, t)


@pytest.mark.parametrize(
    "body",
    [
        {"metadata": {"emulator.text_tokens": "300"}},
        {"tools": [READ], "metadata": {"emulator.tool_rounds": "1"}},
        {"tools": [PATCH], "tool_choice": {"type": "custom", "name": "apply_patch"}},
        {"metadata": {"emulator.text_tokens": "120", "emulator.reasoning_tokens": "40"}},
        {"metadata": {"emulator.text_tokens": "300"}, "max_output_tokens": 77},
    ],
    ids=["text", "function-call", "custom-call", "reasoning", "cut"],
)
def test_the_engines_output_ids_are_what_the_session_would_render(body):
    clock = Instant()
    engine = Engine(load_inference_config(), clock, clock)
    session = Session(SessionConfig(), [MODEL], session_key="c", clock=lambda: 1.0)
    fx = handled(
        session,
        ClientFrame(
            json.dumps(
                {"type": "response.create", "model": MODEL, "input": "Fix the bug.", "store": False, **body}
            )
        ),
    )
    (turn,) = fx.start

    async def drive() -> Done:
        done = None
        async for chunk in engine.generate(turn.request):
            handled(session, InferenceChunk(turn.turn_id, chunk))
            done = next((e for e in chunk if isinstance(e, Done)), done)
        return done

    done = asyncio.run(drive())
    output = turn.builder.response.output
    assert output and done.context_token_ids is not None
    assert list(done.context_token_ids) == render_items(output)
