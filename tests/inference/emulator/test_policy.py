"""policy: deterministic choice between a schema-valid function call and a text answer."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from inference.chat_format import render_message
from inference.emulator import policy as pol
from inference.emulator.profiles import PolicyConfig
from inference.emulator.schema_values import value_for_schema
from inference.tokenizer import decode, encode
from inference.types import InferenceRequest, ToolSpec

POLICY = PolicyConfig(tool_rounds=2, text_tokens=40, seed=3)
READ = ToolSpec(
    "read_file",
    {
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
        "required": ["path"],
        "additionalProperties": False,
    },
)
LS = ToolSpec("list_dir", {"type": "object", "properties": {"dir": {"type": "string"}}})


def request(**kw) -> InferenceRequest:
    fields = {"request_id": "r", "model": "m", "prompt_token_ids": render_message("user", "go")}
    fields.update(kw)
    return InferenceRequest(**fields)


def only_segment(plan: pol.OutputPlan):
    assert len(plan.segments) == 1
    return plan.segments[0]


# --- deciding -------------------------------------------------------------------------


def test_same_request_and_seed_give_the_same_plan():
    r = request(tools=(READ, LS))
    assert pol.plan(r, POLICY) == pol.plan(r, POLICY)
    text = request()
    assert pol.plan(text, POLICY) == pol.plan(text, POLICY)


def test_the_seed_and_the_prompt_vary_the_plan():
    r = request()
    seeds = {pol.plan(r, POLICY.model_copy(update={"seed": s})) for s in range(5)}
    prompts = {pol.plan(request(prompt_token_ids=[1, 2, i]), POLICY) for i in range(5)}
    assert len(seeds) > 1 and len(prompts) > 1


def test_prompt_digest_is_stable_across_processes():
    # BLAKE2 over little-endian uint32 ids, not Python's salted hash().
    assert pol.prompt_digest([1, 2, 3], seed=0).hex() == pol.prompt_digest((1, 2, 3)).hex()
    assert pol.prompt_digest([1, 2, 3]).hex() == "f6a753e0395b8dfa6485b18612a446af"


def test_calls_a_tool_until_the_conversation_holds_tool_rounds_results():
    for results in range(POLICY.tool_rounds):
        seg = only_segment(pol.plan(request(tools=(READ,), tool_results_in_context=results), POLICY))
        assert isinstance(seg, pol.FunctionCallSegment) and seg.name == "read_file"
    seg = only_segment(pol.plan(request(tools=(READ,), tool_results_in_context=2), POLICY))
    assert isinstance(seg, pol.TextSegment)


def test_without_tools_answers_in_text():
    assert isinstance(only_segment(pol.plan(request(), POLICY)), pol.TextSegment)


def test_tool_choice_none_answers_in_text():
    seg = only_segment(pol.plan(request(tools=(READ,), tool_choice="none"), POLICY))
    assert isinstance(seg, pol.TextSegment)


def test_tool_choice_required_calls_even_after_the_rounds():
    r = request(tools=(READ,), tool_choice="required", tool_results_in_context=99)
    assert isinstance(only_segment(pol.plan(r, POLICY)), pol.FunctionCallSegment)


def test_tool_choice_naming_a_tool_calls_that_tool():
    for i in range(5):
        r = request(
            prompt_token_ids=[i], tools=(READ, LS), tool_choice="list_dir", tool_results_in_context=99
        )
        assert only_segment(pol.plan(r, POLICY)).name == "list_dir"


def test_tool_choice_naming_an_unknown_tool_is_an_error():
    with pytest.raises(pol.UnknownToolChoice) as info:
        pol.plan(request(tools=(READ,), tool_choice="rm_rf"), POLICY)
    assert info.value.tool_choice == "rm_rf"


# --- what it produces -----------------------------------------------------------------


def test_call_arguments_are_json_valid_for_the_tool():
    seg = only_segment(pol.plan(request(tools=(READ,)), POLICY))
    args = json.loads(seg.arguments)
    jsonschema.validate(args, READ.parameters)
    assert seg.token_ids == tuple(pol.encode(seg.arguments))


def test_missing_or_empty_schema_gives_empty_arguments():
    seg = only_segment(pol.plan(request(tools=(ToolSpec("ping"),)), POLICY))
    assert seg.arguments == "{}"


def test_text_answer_is_exactly_text_tokens_of_corpus_english():
    seg = only_segment(pol.plan(request(), POLICY))
    assert len(seg.token_ids) == POLICY.text_tokens
    text = decode(seg.token_ids)
    assert any(text.startswith(s[:20]) for s in pol.CORPUS)


@pytest.mark.parametrize("n", [1, 7, 500])
def test_text_answer_length_is_exact_for_any_size(n):
    assert len(pol.text_answer(n, random.Random(n))) == n


def _text_answer_by_encoding_the_text(n_tokens: int, rng: random.Random) -> tuple[int, ...]:
    """The definition ``text_answer`` is built to equal: the sampled sentences joined and
    encoded as one text (the same draws from ``rng``)."""
    parts, estimate = [], 0
    while True:
        while estimate < n_tokens:
            sentence = pol.CORPUS[rng.randrange(len(pol.CORPUS))]
            parts.append(sentence)
            estimate += len(encode(sentence)) + 1
        ids = encode(" ".join(parts))
        if len(ids) >= n_tokens:
            return tuple(ids[:n_tokens])
        estimate = len(ids)


@pytest.mark.parametrize("n", [1, 7, 100, 2000, 9000])
def test_text_answer_is_the_encoding_of_the_joined_sentences(n):
    for seed in range(5):
        mine, reference = random.Random(seed), random.Random(seed)
        assert pol.text_answer(n, mine) == _text_answer_by_encoding_the_text(n, reference)
        assert mine.random() == reference.random()  # the same draws: later choices do not move


@pytest.mark.parametrize("sizes", [range(0, 120), (2000, 2001, 4999)])
def test_a_text_segment_is_canonical_exactly_when_its_ids_encode_back(sizes):
    """The engine renders a canonical answer with its own ids (inference.emulator.engine), so the
    flag must never claim what encoding the text would not give."""
    for n in sizes:
        for seed in range(3):
            seg = pol.text_segment(n, random.Random(f"{n}/{seed}"))
            assert seg.token_ids == pol.text_answer(n, random.Random(f"{n}/{seed}"))
            assert seg.canonical is (tuple(encode(decode(seg.token_ids))) == seg.token_ids), n


def test_pydantic_style_schema_with_refs_and_optionals_is_honoured():
    class Range(BaseModel):
        start: int
        end: int | None = None

    class Edit(BaseModel):
        path: str
        ranges: list[Range]
        mode: str = "replace"

    schema = Edit.model_json_schema()
    for seed in range(20):
        jsonschema.validate(json.loads(pol.arguments_for(schema, random.Random(seed))), schema)


def test_draft4_boolean_exclusive_bounds_are_honoured():
    schema = {
        "type": "integer",
        "minimum": 3,
        "maximum": 5,
        "exclusiveMinimum": True,
        "exclusiveMaximum": True,
    }
    assert {value_for_schema(schema, random.Random(s)) for s in range(20)} == {4}


def test_strings_look_like_what_the_property_names():
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    args = json.loads(pol.arguments_for(schema, random.Random(0)))
    assert "." in args["path"]


# --- schema validity property ---------------------------------------------------------

_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-50, 50),
    st.text(max_size=6),
    st.floats(-10, 10, allow_nan=False).map(lambda x: round(x, 1) + 0.5),
)


@st.composite
def _string_schema(draw):
    s: dict = {"type": "string"}
    lo = draw(st.none() | st.integers(0, 12))
    hi = draw(st.none() | st.integers(lo or 0, 20))
    if lo is not None:
        s["minLength"] = lo
    if hi is not None:
        s["maxLength"] = hi
    if draw(st.booleans()):
        s["default"] = "d" * max(lo or 0, min(3, hi if hi is not None else 3))
    return s


@st.composite
def _numeric_schema(draw, kind):
    s: dict = {"type": kind}
    lo = draw(st.none() | st.integers(-100, 100))
    width = draw(st.integers(3, 300))
    if lo is not None:
        s["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = lo
    if draw(st.booleans()):
        top = (lo if lo is not None else 0) + width
        s["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = top
    if kind == "integer" and draw(st.booleans()):
        s["multipleOf"] = draw(st.integers(1, 2))
    return s


_leaf = st.one_of(
    _string_schema(),
    _numeric_schema("integer"),
    _numeric_schema("number"),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({}),
    st.just({"type": ["string", "null"]}),
    st.lists(_json_scalar, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
    _json_scalar.map(lambda v: {"const": v}),
)

# oneOf branches must be disjoint for any generator to be valid: distinct, non-overlapping types.
_disjoint_union = st.lists(
    st.sampled_from(["string", "integer", "boolean", "null", "object", "array"]),
    min_size=1,
    max_size=3,
    unique=True,
).map(lambda ts: [{"type": t} for t in ts])

_names = st.sampled_from(["path", "command", "query", "limit", "name", "flag", "items", "url"])


def _extend(children):
    obj = st.builds(
        lambda props, req_mask, extra, min_props: {
            "type": "object",
            "properties": props,
            "required": [k for k, r in zip(props, req_mask) if r],
            **({"additionalProperties": extra} if extra is not None else {}),
            **({"minProperties": min(min_props, len(props))} if min_props else {}),
        },
        st.dictionaries(_names, children, max_size=4),
        st.lists(st.booleans(), min_size=4, max_size=4),
        st.none() | st.booleans(),
        st.integers(0, 2),
    )
    arr = st.builds(
        lambda items, lo, extra: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + extra},
        children,
        st.integers(0, 2),
        st.integers(0, 2),
    )
    unique = st.just({"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 3})
    any_of = st.lists(children, min_size=1, max_size=3).map(lambda bs: {"anyOf": bs})
    one_of = _disjoint_union.map(lambda bs: {"oneOf": bs})
    all_of = st.builds(
        lambda a, b: {
            "allOf": [
                {"type": "object", "properties": {"a": a}, "required": ["a"]},
                {"properties": {"b": b}, "required": ["b"]},
            ]
        },
        children,
        children,
    )
    return st.one_of(obj, arr, unique, any_of, one_of, all_of)


_schemas = st.recursive(_leaf, _extend, max_leaves=12)


@st.composite
def _tool_schema(draw):
    """An object schema, sometimes routing a property through ``$defs``."""
    body = draw(_schemas)
    if draw(st.booleans()):
        return {
            "type": "object",
            "$defs": {"Thing": body},
            "properties": {"thing": {"$ref": "#/$defs/Thing"}},
            "required": ["thing"],
        }
    return {"type": "object", "properties": {"x": body}, "required": ["x"], "additionalProperties": False}


@settings(max_examples=300, deadline=None)
@given(schema=_schemas, seed=st.integers(0, 2**32))
def test_generated_values_validate_against_any_supported_schema(schema, seed):
    value = value_for_schema(schema, random.Random(seed))
    jsonschema.Draft202012Validator(schema).validate(value)


@settings(max_examples=150, deadline=None)
@given(schema=_tool_schema(), seed=st.integers(0, 2**32))
def test_generated_arguments_validate_against_the_tool_schema(schema, seed):
    arguments = pol.arguments_for(schema, random.Random(seed))
    jsonschema.Draft202012Validator(schema).validate(json.loads(arguments))


@settings(max_examples=50, deadline=None)
@given(schema=_tool_schema(), seed=st.integers(0, 2**16))
def test_generated_arguments_are_deterministic(schema, seed):
    assert pol.arguments_for(schema, random.Random(seed)) == pol.arguments_for(schema, random.Random(seed))


# --- per-request knobs through metadata -------------------------------------------------


def test_metadata_overrides_tool_rounds_text_length_and_seed():
    from inference.emulator.policy import policy_for

    base = PolicyConfig(tool_rounds=3, text_tokens=48, seed=0)
    req = InferenceRequest(
        "r",
        "m",
        [1, 2],
        metadata=(
            ("emulator.text_tokens", "7"),
            ("emulator.tool_rounds", "0"),
            ("emulator.seed", "9"),
            ("user_tag", "x"),
        ),
    )
    assert policy_for(req, base) == PolicyConfig(tool_rounds=0, text_tokens=7, seed=9)
    assert policy_for(InferenceRequest("r", "m", [1]), base) is base


def test_a_text_length_knob_shapes_the_answer_and_tool_rounds_end_the_loop():
    from inference.emulator.policy import policy_for

    tool = ToolSpec("t", {"type": "object", "properties": {}})
    req = InferenceRequest(
        "r",
        "m",
        [1, 2],
        tools=(tool,),
        tool_results_in_context=1,
        metadata=(("emulator.tool_rounds", "1"), ("emulator.text_tokens", "5")),
    )
    out = pol.plan(req, policy_for(req, PolicyConfig(tool_rounds=3)))
    assert isinstance(out.segments[0], pol.TextSegment) and out.total_tokens == 5


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("emulator.text_tokens", "0"),
        ("emulator.tool_rounds", "-1"),
        ("emulator.seed", "abc"),
        ("emulator.text_tokens", "1.5"),
    ],
)
def test_an_invalid_knob_value_is_a_typed_error(key, value):
    from inference.emulator.policy import InvalidMetadata, policy_for

    with pytest.raises(InvalidMetadata) as info:
        policy_for(InferenceRequest("r", "m", [1], metadata=((key, value),)), PolicyConfig())
    assert info.value.key == key and info.value.code == "invalid_value" and key in str(info.value)


def test_a_policy_memo_gives_policy_for_and_validates_each_distinct_metadata_once(monkeypatch):
    base = PolicyConfig(tool_rounds=3, text_tokens=48, seed=0)
    memo = pol.PolicyMemo(base, capacity=2)
    knobs = (("emulator.text_tokens", "7"), ("emulator.seed", "9"))
    made = []
    real = pol.policy_for
    monkeypatch.setattr(pol, "policy_for", lambda req, b: made.append(req.metadata) or real(req, b))

    first = memo.policy(InferenceRequest("r1", "m", [1], metadata=knobs))
    again = memo.policy(InferenceRequest("r2", "m", [1, 2], metadata=knobs))
    assert first == real(InferenceRequest("r", "m", [1], metadata=knobs), base) and again is first
    assert made == [knobs]
    assert memo.policy(InferenceRequest("r3", "m", [1])) is base and made == [knobs]
    for key in (("emulator.seed", "1"),), (("emulator.seed", "2"),):  # past capacity: forgets
        memo.policy(InferenceRequest("r", "m", [1], metadata=key))
    assert len(memo) <= 2
    held = len(memo)
    bad = InferenceRequest("r", "m", [1], metadata=(("emulator.text_tokens", "0"),))
    for _ in range(2):  # an invalid knob raises every time, nothing kept
        with pytest.raises(pol.InvalidMetadata):
            memo.policy(bad)
    assert len(memo) == held and made[-2:] == [bad.metadata, bad.metadata]


def test_the_plan_follows_the_tool_outputs():
    from inference.chat_format import render_function_call, render_function_call_output

    def planned(output: str) -> pol.OutputPlan:
        prompt = (
            render_message("user", "fix the test")
            + render_function_call("read_file", '{"path": "a.py"}')
            + render_function_call_output(output)
        )
        return pol.plan(request(prompt_token_ids=prompt, tools=(READ, LS), tool_results_in_context=1), POLICY)

    assert planned("print(1)") == planned("print(1)")
    assert len({planned(f"print({n})") for n in range(8)}) > 1


def test_reasoning_length_is_drawn_per_response_from_its_lognormal():
    from inference.emulator.policy import ReasoningSegment

    policy = PolicyConfig(reasoning_tokens=100, reasoning_tokens_p90=500)
    lengths = []
    for i in range(300):
        req = InferenceRequest(f"r{i}", "emu-fast", [i, 7, 9])
        first = pol.plan(req, policy).segments[0]
        assert isinstance(first, ReasoningSegment)
        assert pol.plan(req, policy).segments[0] == first  # a function of the conversation
        lengths.append(len(first.token_ids))
    lengths.sort()
    assert 80 <= lengths[150] <= 125  # median 100
    assert 380 <= lengths[270] <= 650  # p90 500
    fixed = PolicyConfig(reasoning_tokens=100)
    assert len(pol.plan(InferenceRequest("r", "emu-fast", [1]), fixed).segments[0].token_ids) == 100


# --- safe in a real checkout ------------------------------------------------------------


def test_shell_commands_are_read_only():
    from inference.emulator.schema_values import COMMANDS

    schema = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
    seen = {json.loads(pol.arguments_for(schema, random.Random(i)))["cmd"] for i in range(200)}
    assert seen == set(COMMANDS)
    for command in COMMANDS:
        assert command.split()[0] in ("ls", "pwd", "cat", "git")
        assert not any(w in command for w in ("pytest", "build", ">", "rm ", "mv ", "checkout", "reset"))
        assert command == "git --no-optional-locks status --short" or " status" not in command


WRITE = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}


@pytest.mark.parametrize("name", ["write_file", "apply_patch", "deleteFile", "remove-dir", "fs.move"])
def test_a_tool_that_changes_files_gets_paths_that_exist_nowhere(name):
    from inference.emulator.schema_values import PATHS, SCRATCH_DIR

    tool = ToolSpec(name, WRITE)
    for i in range(20):
        seg = only_segment(pol.plan(request(tools=(tool,), prompt_token_ids=[i]), POLICY))
        path = json.loads(seg.arguments)["path"]
        directory, _, rest = path.partition("/")
        assert directory.startswith(SCRATCH_DIR) and len(directory) == len(SCRATCH_DIR) + 8
        int(directory[len(SCRATCH_DIR) :], 16)
        assert rest in PATHS


def test_a_tool_that_reads_gets_ordinary_paths():
    from inference.emulator.schema_values import PATHS

    seg = only_segment(pol.plan(request(tools=(READ,)), POLICY))
    assert json.loads(seg.arguments)["path"] in PATHS


def test_numbers_are_whole_when_the_bounds_allow_it():
    schema = {
        "type": "object",
        "properties": {
            "yield_time_ms": {"type": "number"},
            "ratio": {"type": "number", "minimum": 0.1, "maximum": 0.9},
        },
        "required": ["yield_time_ms", "ratio"],
    }
    for i in range(20):
        args = json.loads(pol.arguments_for(schema, random.Random(i)))
        assert isinstance(args["yield_time_ms"], int) and isinstance(args["ratio"], float)


def test_a_patch_tool_gets_a_patch_of_a_path_that_exists_nowhere():
    from inference.emulator.schema_values import PATHS, SCRATCH_DIR

    tool = ToolSpec("apply_patch", custom=True)
    for i in range(10):
        seg = only_segment(pol.plan(request(tools=(tool,), prompt_token_ids=[i]), POLICY))
        assert seg.custom and seg.name == "apply_patch" and seg.token_ids == tuple(pol.encode(seg.arguments))
        lines = seg.arguments.split("\n")
        assert lines[0] == "*** Begin Patch" and lines[-1] == "*** End Patch" and lines[2] == "@@"
        action, _, path = lines[1].partition(": ")
        assert action == "*** Update File" and path.startswith(SCRATCH_DIR) and path.split("/", 1)[1] in PATHS
        assert lines[3].startswith("-") and lines[4].startswith("+")


def test_another_custom_tool_gets_a_sentence():
    seg = only_segment(pol.plan(request(tools=(ToolSpec("note", custom=True),)), POLICY))
    assert seg.custom and seg.arguments in pol.CORPUS
