"""Scripted scenarios: the format, which turn a request answers, and the plan it becomes."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from inference.chat_format import render_function_call, render_function_call_output, render_message
from inference.emulator import policy as pol
from inference.emulator import scenario as sc
from inference.emulator.profiles import PolicyConfig
from inference.tokenizer import decode, encode
from inference.types import InferenceRequest

EXAMPLE = Path(__file__).parents[3] / "configs" / "scenario.example.yaml"  # quoted in docs/replay.md


def request(prompt, **kw) -> InferenceRequest:
    return InferenceRequest("r", "m", prompt, **kw)


def conversation(responses: int) -> list[int]:
    """A user message, then ``responses`` model responses each answered by a tool output
    (the second response is two parallel calls: one response, two segments)."""
    tokens = render_message("user", "go")
    for i in range(responses):
        calls = 2 if i == 1 else 1
        for _ in range(calls):
            tokens += render_function_call("exec_command", '{"cmd": "ls"}')
        for _ in range(calls):
            tokens += render_function_call_output("out")
    return tokens


def test_the_documented_example_parses_and_turn_i_answers_the_ith_request():
    scenario = sc.load_scenario(EXAMPLE.read_text())
    policy = PolicyConfig(scenario=scenario)
    first = pol.plan(request(conversation(0)), policy).segments
    assert [type(s).__name__ for s in first] == ["ReasoningSegment", "TextSegment", "FunctionCallSegment"]
    assert len(first[0].token_ids) == 30
    assert decode(first[1].token_ids) == "Let me look at the files."
    assert json.loads(first[2].arguments) == {"cmd": "ls"} and first[2].token_ids == tuple(
        encode(first[2].arguments)
    )
    second = pol.plan(request(conversation(1)), policy).segments
    assert [s.name for s in second] == ["exec_command", "apply_patch"]
    assert second[0].arguments == '{"cmd": "cat README.md"}'
    assert len(second[1].token_ids) == 40 and json.loads(second[1].arguments)["input"]
    third = pol.plan(request(conversation(2)), policy).segments  # two parallel calls count as one response
    assert [len(s.token_ids) for s in third] == [25] and type(third[0]).__name__ == "TextSegment"
    assert sc.turn_for(request(conversation(3)), scenario) is None  # after_last: policy


def test_past_the_last_turn_the_policy_decides_or_the_last_turn_repeats():
    scenario = sc.Scenario(turns=[sc.ScriptedTurn(text="only")])
    past = request(conversation(1))
    assert sc.turn_for(past, scenario) is None
    seeded = pol.plan(past, PolicyConfig(scenario=scenario, text_tokens=7))
    assert seeded == pol.plan(past, PolicyConfig(text_tokens=7))
    repeat = scenario.model_copy(update={"after_last": "repeat_last"})
    assert decode(pol.plan(past, PolicyConfig(scenario=repeat)).segments[0].token_ids) == "only"


def test_text_tokens_reasoning_and_argument_sizes_are_exact_and_the_same_on_every_prompt():
    turn = sc.ScriptedTurn(
        reasoning_tokens=120, text_tokens=45, calls=[sc.ScriptedCall(name="f", arguments_tokens=300)]
    )
    scenario = sc.Scenario(turns=[turn], after_last="repeat_last")
    a = pol.plan(request(conversation(0)), PolicyConfig(scenario=scenario)).segments
    b = pol.plan(request(conversation(3)), PolicyConfig(scenario=scenario)).segments
    assert [len(s.token_ids) for s in a] == [120, 45, 300]
    assert a == b  # seeded by the turn, never the prompt: the same on every transport


@pytest.mark.parametrize("n", [1, 6, 7, 8, 9, 20, 57, 333, 4096])
def test_arguments_of_a_size_are_json_of_that_many_tokens(n):
    text = sc.arguments_of_size(n)
    assert isinstance(json.loads(text), dict)
    wrapper = len(encode('{"input": ""}'))
    assert len(encode(text)) == (n if n > wrapper else 1)


def test_max_output_tokens_still_cuts_a_scripted_text():
    scenario = sc.Scenario(turns=[sc.ScriptedTurn(text_tokens=500)])
    segments = pol.plan(
        request(conversation(0), max_output_tokens=20), PolicyConfig(scenario=scenario)
    ).segments
    assert len(segments[0].token_ids) == 21  # one past the limit: the engine sees the cut


@pytest.mark.parametrize(
    "bad",
    [
        {"turns": []},
        {"turns": [{}]},
        {"turns": [{"text": "a", "text_tokens": 3}]},
        {"turns": [{"calls": [{"name": "f"}]}]},
        {"turns": [{"calls": [{"name": "f", "arguments": "{}", "arguments_tokens": 3}]}]},
        {"turns": [{"text": "a", "error": {"code": "server_error"}}]},
        {"turns": [{"error": {"code": "no_such_code"}}]},
        {"turns": [{"text": "a", "unknown": 1}]},
    ],
)
def test_a_malformed_scenario_is_refused(bad):
    with pytest.raises(ValidationError):
        sc.Scenario.model_validate(bad)


def test_an_error_turn_raises_the_injected_error_which_pickles():
    scenario = sc.load_scenario('[{"error": {"code": "rate_limit_exceeded", "message": "slow down"}}]')
    with pytest.raises(sc.InjectedError) as caught:
        pol.plan(request(conversation(0)), PolicyConfig(scenario=scenario))
    again = pickle.loads(pickle.dumps(caught.value))
    assert (again.code, again.public_message) == ("rate_limit_exceeded", "slow down")


def test_metadata_carries_a_scenario_or_one_turn_and_a_turn_wins():
    turn = json.dumps({"text": "from the turn"})
    scenario = json.dumps({"turns": [{"text": "from the scenario"}]})
    updates = pol.metadata_overrides([("emulator.turn", turn), ("emulator.scenario", scenario)])
    req = request(conversation(4), metadata=(("emulator.scenario", scenario), ("emulator.turn", turn)))
    assert updates["scenario"].turns[0].text == "from the turn"
    assert decode(pol.plan(req, pol.policy_for(req, PolicyConfig())).segments[0].token_ids) == "from the turn"
    only = pol.metadata_overrides([("emulator.scenario", scenario)])["scenario"]
    assert only.after_last == "policy" and only.turns[0].text == "from the scenario"


@pytest.mark.parametrize(
    "key,value",
    [
        ("emulator.turn", "not json"),
        ("emulator.turn", '{"text": 3}'),
        ("emulator.scenario", '{"turns": [{}]}'),
    ],
)
def test_a_bad_scenario_in_metadata_is_invalid_metadata(key, value):
    with pytest.raises(pol.InvalidMetadata) as caught:
        pol.metadata_overrides([(key, value)])
    assert caught.value.key == key


def test_responses_in_context_counts_runs_of_output_segments():
    assert sc.responses_in_context(render_message("user", "hi")) == 0
    tokens = (
        render_message("user", "hi")
        + render_message("assistant", "hello")
        + render_message("user", "more")
        + render_function_call("f", "{}")
        + render_function_call("g", "{}")
        + render_function_call_output("x")
        + render_function_call_output("y")
    )
    assert sc.responses_in_context(tokens) == 2


def test_a_scripted_call_of_a_custom_tool_is_a_custom_call_and_counts_as_a_response():
    from inference.chat_format import render_custom_tool_call
    from inference.types import ToolSpec

    patch = "*** Begin Patch\n*** Delete File: README.md\n*** End Patch"  # a scenario may name real paths
    scenario = sc.Scenario(
        turns=[
            sc.ScriptedTurn(calls=[sc.ScriptedCall(name="apply_patch", arguments=patch)]),
            sc.ScriptedTurn(text="done"),
        ]
    )
    tools = (ToolSpec("apply_patch", custom=True), ToolSpec("exec_command"))
    (seg,) = pol.plan(
        request(render_message("user", "go"), tools=tools), PolicyConfig(scenario=scenario)
    ).segments
    assert seg.custom and seg.name == "apply_patch" and seg.arguments == patch
    after = (
        render_message("user", "go")
        + render_custom_tool_call("apply_patch", patch)
        + render_message("user", "applied")
    )
    assert sc.responses_in_context(after) == 1
    (text,) = pol.plan(request(after, tools=tools), PolicyConfig(scenario=scenario)).segments
    assert decode(text.token_ids) == "done"
