"""``responses-ws replay``'s readers on synthetic logs written from the formats' definitions
(tests/bench/data/replay: a Codex rollout, a Claude Code log, a file of neither kind)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.replay import log_formats as formats
from bench.replay import synth
from bench.replay.driver import ToolTime
from bench.replay.shape import Call, Input, ShapeFile, StepShape, Text, ToolOutput, Usage, build
from inference.emulator import scenario as sc
from inference.tokenizer import encode

DATA = Path(__file__).parent / "data" / "replay"
CODEX = next((DATA / "codex").rglob("rollout-*.jsonl"))
CLAUDE = next((DATA / "claude").rglob("*.jsonl"))
UNKNOWN = DATA / "notes.jsonl"


@pytest.fixture(scope="module")
def codex():
    session, errors = formats.read_session(CODEX)
    return session, errors


@pytest.fixture(scope="module")
def claude():
    session, errors = formats.read_session(CLAUDE)
    return session, errors


def test_a_codex_rollout_becomes_its_steps(codex):
    s, errors = codex
    assert s.format == "codex" and s.model == "gpt-5-codex"  # turn_context
    assert (
        s.instructions_source == "recorded" and s.instructions_tokens > 900
    )  # session_meta.base_instructions
    assert [len(st.calls) for st in s.steps] == [1, 2, 1, 1, 0, 1, 1, 0]
    # event_msg token_count: usage per step; a repeated count (same totals) is no new step
    assert [st.recorded.output_tokens for st in s.steps] == [79, 231, 415, 54, 118, 53, 31, 97]
    assert [st.reasoning_reported for st in s.steps] == [64, 180, 300, 40, 50, 30, 20, 50]
    assert {st.reasoning_source for st in s.steps} == {"usage"}  # encrypted reasoning is sized by the usage
    # each step is replayed at its recorded output: reasoning is what the visible part leaves
    assert [st.output_tokens for st in s.steps] == [79, 231, 415, 54, 118, 53, 31, 97]
    assert all(st.reasoning_tokens == st.recorded.output_tokens - st.visible_tokens for st in s.steps)
    assert s.steps[1].text_tokens == len(encode("I will read the parser and its test side by side."))
    assert s.steps[0].inputs[0].kind == "developer" and s.steps[0].inputs[-1].kind == "user"
    assert s.steps[2].calls[0].kind == "custom" and s.steps[2].calls[0].name == "apply_patch"
    assert s.steps[5].calls[0].name == "shell"
    # first prompt beyond its items: the definitions the rollout does not record
    assert s.tool_definition_tokens == 2350 - s.instructions_tokens - sum(i.tokens for i in s.steps[0].inputs)
    assert (
        not errors[1:]
        and "malformed line" in str(errors[0])
        and str(errors[0]).endswith(f"{CODEX}:28: malformed line (not a JSON object): skipped")
    )


def test_codex_tool_durations_come_from_the_outputs_and_parallel_calls_wait_for_the_slowest(codex):
    s, _ = codex
    assert [st.tool_s for st in s.steps] == [0.4, 1.2, 0.2, 2.5, 0.0, 0.1, 0.5, 0.0]
    outputs = [i for st in s.steps for i in st.inputs if i.kind == "tool_output"]
    # the shell call's output (metadata.duration_seconds too) went into the compaction's summary
    assert [i.tool_s_source for i in outputs] == [
        "wall_time",
        "wall_time",
        "wall_time",
        "metadata.duration_seconds",
        "wall_time",
        "wall_time",
    ]
    assert [i.answers for i in s.steps[2].inputs] == [(1, 0), (1, 1)]  # joined on call_id


def test_a_codex_compaction_starts_a_new_chain_from_its_summary(codex):
    s, _ = codex
    assert [st.new_chain for st in s.steps] == [False] * 6 + [True, False]
    assert [i.kind for i in s.steps[6].inputs] == ["compaction_summary"]
    assert s.steps[6].inputs[0].tokens > 150  # the message and the replacement history
    assert s.steps[5].gap_s == pytest.approx(40.2, abs=0.05)  # the human read the answer for 40 s


def test_codex_records_it_does_not_replay_are_skipped_with_why(codex):
    s, _ = codex
    skipped = {k.kind: k for k in s.skipped}
    assert set(skipped) == {"world_state", "malformed", "response_item.web_search_call"}
    assert skipped["world_state"].reason == "record type not known to this reader"
    assert skipped["malformed"].first_line == 28


def test_a_claude_code_log_becomes_one_step_per_message_id(claude):
    s, errors = claude
    assert not errors
    assert s.format == "claude" and s.model == "claude-sonnet-4-5"
    assert len(s.steps) == 6 and [len(st.calls) for st in s.steps] == [1, 1, 2, 0, 1, 0]
    first = s.steps[0]  # thinking, text and tool_use on three lines of one message
    assert first.reasoning_source == "text" and first.reasoning_reported == 90 and first.text_tokens > 0
    assert first.output_tokens == first.recorded.output_tokens == 112  # replayed at what the model spent
    assert first.recorded.input_tokens == 3 + 14000 and first.recorded.cached_tokens == 0
    assert s.steps[1].recorded.cached_tokens == 14000  # cache_read_input_tokens
    assert s.instructions_source == "inferred"
    assert s.instructions_tokens == 14003 - first.inputs[0].tokens
    redacted = s.steps[2]  # redacted thinking: the usage's output beyond the visible calls
    assert redacted.reasoning_source == "residual"
    assert redacted.reasoning_tokens == 150 - sum(c.argument_tokens for c in redacted.calls)


def test_claude_tool_time_is_durationMs_or_the_time_to_the_result_line(claude):
    s, _ = claude
    outputs = {i.answers: i for st in s.steps for i in st.inputs if i.kind == "tool_output"}
    assert outputs[(2, 1)].tool_s_source == "durationMs" and outputs[(2, 1)].tool_s == 0.045
    # its tool_use line came 0.2 s before the message's last line, the result 3.1 s after it
    assert outputs[(2, 0)].tool_s_source == "timestamps" and outputs[(2, 0)].tool_s == pytest.approx(
        3.3, abs=0.01
    )
    assert s.steps[2].tool_s == outputs[(2, 0)].tool_s  # the slowest of the parallel calls


def test_a_claude_compaction_and_the_lines_it_skips(claude):
    s, _ = claude
    after = s.steps[4]
    assert after.new_chain and [i.kind for i in after.inputs] == ["compaction_summary", "user"]
    assert after.gap_s == pytest.approx(5.5, abs=0.05)  # from the compaction to the user's message
    assert sorted((k.first_line, k.kind, k.reason) for k in s.skipped) == [
        (1, "summary", "log metadata, not part of the conversation"),
        (2, "file-history-snapshot", "log metadata, not part of the conversation"),
        (15, "assistant", "a sub-agent's line in the main log (replay its own log)"),
        (16, "assistant", "an API error notice written by the client, not a model response"),
    ]


def test_a_file_of_another_format_is_named_and_the_others_still_read(tmp_path):
    sessions, errors = formats.read_sessions([DATA, tmp_path / "missing.jsonl"])
    assert sorted(s.format for s in sessions) == ["claude", "codex"]
    messages = [str(e) for e in errors]
    assert f"{UNKNOWN}:1: not a Codex rollout nor a Claude Code log" in "\n".join(messages)
    assert f"{tmp_path / 'missing.jsonl'}: no such file or folder" in messages


def test_the_exported_shape_holds_no_text(codex, claude):
    exported = ShapeFile(sessions=[codex[0], claude[0]]).model_dump_json()
    for word in ("parser", "verbose", "README", "pytest", "header", "/home/dev"):
        assert word not in exported
    assert ShapeFile.model_validate_json(exported).sessions[0].steps == codex[0].steps


def test_each_step_becomes_a_turn_the_scenario_format_accepts(codex):
    s, _ = codex
    for step in s.steps:
        turn, dropped = synth.turn_script(step)
        assert not dropped
        parsed = sc.ScriptedTurn.model_validate(turn)
        assert parsed.reasoning_tokens == step.reasoning_tokens
        assert sum(c.arguments_tokens for c in parsed.calls) == sum(c.argument_tokens for c in step.calls)
        assert (parsed.text_tokens or 0) == step.text_tokens or (not step.calls and parsed.text_tokens == 1)


def test_calls_past_the_metadata_limit_are_left_out_and_counted():
    step = StepShape(
        index=0,
        calls=[{"name": f"tool_number_{i}", "kind": "function", "argument_tokens": 10} for i in range(20)],
    )
    turn, dropped = synth.turn_script(step)
    assert dropped > 0 and len(turn["calls"]) == 20 - dropped
    assert len(synth.encode_turn(turn)) <= synth.METADATA_VALUE_LIMIT


def test_synthetic_text_is_the_recorded_size():
    for n in (1, 17, 900):
        assert abs(len(encode(synth.text(n, "s", n))) - n) <= 1
    assert synth.text(40, "a") == synth.text(40, "a") != synth.text(40, "b")


@pytest.mark.parametrize(
    "text,recorded,expected",
    [("recorded", 2.0, 2.0), ("none", 2.0, 0.0), ("x0.25", 2.0, 0.5), ("1.5", 9.0, 1.5)],
)
def test_tool_time_options(text, recorded, expected):
    assert ToolTime.parse(text).seconds(recorded, calls=1) == expected
    assert ToolTime.parse(text).seconds(recorded, calls=0) == 0.0


def test_the_metadata_value_of_a_turn_is_what_the_server_parses(codex):
    step = codex[0].steps[1]
    meta = synth.metadata(synth.turn_script(step)[0], "responses_ws.timings")
    scenario = sc.from_metadata(sc.TURN_KEY, meta[sc.TURN_KEY])
    assert [c.name for c in scenario.turns[0].calls] == ["exec_command", "exec_command"]
    assert json.loads(meta[sc.TURN_KEY])["text_tokens"] == step.text_tokens


def test_output_the_breakdown_does_not_explain_is_replayed_as_hidden_reasoning():
    # A held-out Codex rollout reported reasoning_output_tokens 0 while each step spent
    # hundreds of output tokens on a short call: the replay keeps what the model spent.
    records = [
        Input(line=1, kind="user", tokens=40),
        Call(line=2, call_id="c1", name="shell", kind="function", argument_tokens=18),
        Usage(line=3, input_tokens=3000, cached_tokens=0, output_tokens=312, reasoning_tokens=0),
        ToolOutput(line=4, call_id="c1", tokens=300, duration_s=1.0),
        Text(line=5, tokens=25),
        Usage(line=6, input_tokens=3400, cached_tokens=3072, output_tokens=25, reasoning_tokens=0),
    ]
    steps, _ = build(records)
    assert [st.output_tokens for st in steps] == [312, 25]
    assert (steps[0].reasoning_tokens, steps[0].reasoning_source, steps[0].reasoning_reported) == (
        294,
        "residual",
        None,
    )
    assert (steps[1].reasoning_tokens, steps[1].reasoning_source) == (0, "none")  # nothing unexplained


def test_the_scripted_turn_key_is_the_emulators():
    from inference.emulator.scenario import TURN_KEY

    assert synth.TURN_KEY == TURN_KEY
