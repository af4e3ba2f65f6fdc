"""The wire types (inference.types) pickle as their fields: every one comes back equal, of
its own type, through pickle and deepcopy."""

from __future__ import annotations

import copy
import pickle
from array import array

import pytest

from inference.types import (
    Breakpoint,
    Done,
    FunctionCallDelta,
    InferenceRequest,
    Prefilled,
    ReasoningDone,
    TextDelta,
    ToolSpec,
)

VALUES = [
    Breakpoint(128, "12h", implicit=True),
    ToolSpec("shell", {"type": "object", "properties": {"cmd": {"type": "string"}}}),
    InferenceRequest(
        request_id="resp_1",
        model="m",
        prompt_token_ids=array("I", [1, 2, 3]),
        tools=(ToolSpec("t"),),
        session_key="conn_1",
        metadata=(("k", "v"),),
        breakpoints=(Breakpoint(1), Breakpoint(2, implicit=True)),
    ),
    Prefilled(3, 0, 0.5, 1.0, reused_tokens=2, replica="r1", written=(1, 2)),
    ReasoningDone(7),
    TextDelta("héllo", 2),
    FunctionCallDelta(0, "shell", '{"cmd"', 3, custom=True),
    Done("tool_calls", 5, 2.5, (9, 8)),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_wire_value_comes_back_equal_through_pickle_and_deepcopy(value: object) -> None:
    for back in (pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL)), copy.deepcopy(value)):
        assert type(back) is type(value) and back == value
