"""What a session core keeps between a coding agent's turns (docs/performance.md, "What a
session host's heap holds"): the tool definitions' content as a string, not the parsed
definitions of the last create; a response that stopped on function calls as its sequence
number, not its builder — so neither is walked by every garbage collection until the
client's next create, and what one turn made goes with it."""

from __future__ import annotations

import gc
import itertools
import json
import types
from collections import Counter
from typing import Any

import pytest

from actors.config import SessionConfig
from actors.core.inputs import ClientFrame, InferenceChunk, Rendered, Written
from actors.core.render import render_marked
from actors.core.session import Session
from actors.protocol.events import EventEncoder
from inference.types import Done, FunctionCallDelta, Prefilled
from tests.support.session_driver import handled

pytestmark = pytest.mark.unit

MODEL = "emu-fast"
ENCODE = EventEncoder()
TOOLS = [
    {
        "type": "function",
        "name": f"tool_{i}",
        "description": "Runs a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
    for i in range(3)
]


def turn(session: Session, previous: tuple[str, str] | None, output: str) -> tuple[str, str]:
    """One create continuing ``previous`` (a response's id and its call's) with the call's
    output, answered by one function call; the response's id and its call's."""
    body: dict[str, Any] = {"type": "response.create", "model": MODEL, "store": False, "tools": TOOLS}
    body["instructions"] = "You are a coding agent."
    if previous is None:
        body["input"] = "fix the parser"
    else:
        body["previous_response_id"] = previous[0]
        body["input"] = [{"type": "function_call_output", "call_id": previous[1], "output": output}]
    fx = handled(session, ClientFrame(json.dumps(body)))
    while fx.render:
        job = fx.render.pop(0)
        fx += handled(session, Rendered(job.render_id, render_marked(job.items, job.fmt)))
    (started,) = fx.start
    n = len(started.request.prompt_token_ids)
    chunks = [
        [Prefilled(n, 0, 0, 1, replica="r")],
        [FunctionCallDelta(0, "tool_0", '{"cmd": "ls"}', 4)],
        [Done("tool_calls", 4, 1.0)],
    ]
    events = []
    for chunk in chunks:
        fx = handled(session, InferenceChunk(started.turn_id, chunk))
        events += fx.events
        for line in fx.usage:
            events += handled(session, Written(line.response_id, stored=True)).events
    response = json.loads(ENCODE(events[-1]))["response"]
    return response["id"], response["output"][-1]["call_id"]


def held_by(root: object) -> Counter[str]:
    """The objects the collector tracks that ``root`` reaches, by type (not through types,
    modules or functions: what the code is, not what the session holds)."""
    found: Counter[str] = Counter()
    seen: set[int] = set()
    stack = [root]
    while stack:
        o = stack.pop()
        if (
            id(o) in seen
            or not gc.is_tracked(o)
            or isinstance(o, (type, types.ModuleType, types.FunctionType))
        ):
            continue
        seen.add(id(o))
        found[type(o).__qualname__] += 1
        stack.extend(gc.get_referents(o))
    return found


def test_between_turns_a_session_keeps_neither_the_parsed_tools_nor_the_last_builder():
    session = Session(SessionConfig(), [MODEL], session_key="c1", clock=lambda: 1_700_000_000.0)
    previous: tuple[str, str] | None = None
    for i in range(4):
        previous = turn(session, previous, f"output {i}")
    held = held_by(session)
    assert held["Session"] == 1  # the walk does reach the session's state
    assert held["FunctionTool"] == 0
    assert held["ResponseBuilder"] == 0


def test_a_turn_adds_a_bounded_number_of_kept_objects():
    session = Session(SessionConfig(), [MODEL], session_key="c1", clock=lambda: 1_700_000_000.0)
    previous: tuple[str, str] | None = None
    counts = []
    for i in range(12):
        previous = turn(session, previous, f"output {i}")
        counts.append(sum(held_by(session).values()))
    per_turn = [b - a for a, b in itertools.pairwise(counts[4:])]
    # The conversation's own record grows (its prompt-cache breakpoints, two a turn); the
    # rest of a turn's objects are replaced by the next turn's, not kept beside them.
    assert max(per_turn) <= 4, counts
