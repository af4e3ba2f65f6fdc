"""The scripted, deterministic policy that stands in for a model's choices.

``plan(request, policy)`` decides what one response contains: a function call with
arguments valid against the tool's JSON schema, or a final text answer of real English
cl100k tokens.  It is a pure function: the same request and seed give the same plan, on
any machine and in any process (choices are seeded by ``policy.seed`` and a BLAKE2 digest
of the prompt tokens, never by Python's salted ``hash()``).  Call ids are not part of the
rendered prompt (``inference.chat_format``), so the same rollout plans alike on every run
and transport.

Decision rule: with function tools available and ``tool_choice != "none"``
the model calls a tool while the conversation holds fewer than ``tool_rounds`` tool
results, or always when ``tool_choice`` is ``"required"`` or names a tool; otherwise it
answers in text.  One call per response (``parallel_tool_calls`` is not exercised yet).
``function`` and ``custom`` (freeform) tools are called; a custom tool gets free text
(``custom_input``).  The calls are safe in a real checkout: shell commands are read-only, a
tool whose name says it changes files (``schema_values.changes_files``) gets paths in a
directory that does not exist, and a patch tool a patch of such a path (docs/emulator.md,
"What the scripted model does with your tools").

Per-request knobs (``policy_for``): a request's ``metadata`` (the create's ``metadata``
object) may override the policy for that one response, so a benchmark can shape its
workload without restarting the server.  Keys, all optional, values decimal strings:

=========================  =======================================================
``emulator.tool_rounds``   tool results in context before the model answers in text
``emulator.text_tokens``   length of the text answer in tokens (>= 1)
``emulator.seed``          seed of the scripted choices (text, tool, arguments)
``emulator.reasoning_tokens``  hidden reasoning before the output (0: none); its median
                           when ``emulator.reasoning_tokens_p90`` is larger
``emulator.reasoning_tokens_p90``  90th percentile of a lognormal reasoning length, drawn
                           per response from the plan's seed (0: a fixed length)
=========================  =======================================================

Reasoning is hidden, as a reasoning model's is when no summary is asked for: its tokens
are real cl100k text that takes decode time and counts in ``usage.output_tokens`` (and
``output_tokens_details.reasoning_tokens``), but it is never streamed, emitted as an item or
kept in the context (docs/emulator.md, "Reasoning").

``emulator.scenario`` and ``emulator.turn`` carry a scripted scenario or one scripted turn
(``inference.emulator.scenario``); with one, or with the configuration's ``scenario``, ``plan``
follows the script.

Other metadata keys are ignored; a listed key with a value that is not a valid number
raises ``InvalidMetadata`` before anything is generated.
"""

from __future__ import annotations

import functools
import json
import math
import random
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from inference.emulator import scenario as scripted
from inference.emulator.profiles import PolicyConfig
from inference.emulator.schema_values import Unsatisfiable, changes_files, scratch_path, value_for_schema
from inference.tokenizer import decode, encode
from inference.types import InferenceRequest, ToolSpec

# Plain English about everyday coding-agent work; sampled to make final answers.
CORPUS: tuple[str, ...] = (
    "I read the configuration file and found the setting that controls the timeout.",
    "The failing test expects the parser to reject an empty header, and now it does.",
    "I renamed the helper so that its name says what it returns instead of how.",
    "All unit tests pass locally, including the new case for an unknown model id.",
    "The build script copies the assets before it compiles the templates.",
    "I added a regression test that reproduces the bug with a two-line input file.",
    "The function was called twice because the retry loop did not reset its counter.",
    "Logging now includes the request id, which makes the trace much easier to follow.",
    "I moved the constants into a module of their own and updated every import.",
    "The cache was never evicting entries, so I bounded it with a least recently used policy.",
    "The directory listing shows three source files and one folder of fixtures.",
    "I checked the lock file and the pinned version matches the one in the manifest.",
    "The error came from a missing comma in the JSON document, not from the code.",
    "I replaced the sleep in the test with a fake clock, so it no longer depends on timing.",
    "The patch touches two files and keeps the public interface unchanged.",
    "Type checking found one function that could return None on an empty list.",
    "The benchmark prints its numbers and saves them next to the profile it ran on.",
    "I split the long function into three steps that each have a clear contract.",
    "The command exited with status zero and wrote its report to the results folder.",
    "Reading the stack trace, the exception starts in the loader and surfaces in the handler.",
    "I documented the new option in the README together with its default value.",
    "The migration runs once and records its version, so running it again does nothing.",
    "Every public function in the module now has a docstring that states its contract.",
    "The flaky test was sharing a temporary directory with another test, which I fixed.",
    "I searched the repository for other callers and found none outside the package.",
    "The diff is small: one new branch in the parser and a test that covers it.",
    "Formatting the file changed only whitespace, so the review should be quick.",
    "The new endpoint returns the same shape as the old one, so clients keep working.",
    "I ran the linter and it reported no problems in the files I changed.",
    "Next, I suggest adding a property test that feeds the decoder input in random pieces.",
)


@dataclass(frozen=True, slots=True)
class TextSegment:
    """Assistant message text, as the token ids the model emits.  ``canonical``: the ids
    are their own text's encoding (``encode(decode(token_ids)) == token_ids``), so the
    message, once sent whole, renders with them instead of encoding its text again."""

    token_ids: tuple[int, ...]
    canonical: bool = False


@dataclass(frozen=True, slots=True)
class FunctionCallSegment:
    """A function call: tool name and the JSON arguments (``token_ids == encode(arguments)``);
    with ``custom``, a custom tool's call and ``arguments`` its free-text input."""

    name: str
    arguments: str
    token_ids: tuple[int, ...]
    custom: bool = False


@dataclass(frozen=True, slots=True)
class ReasoningSegment:
    """Hidden reasoning: tokens that are decoded but never sent (module doc)."""

    token_ids: tuple[int, ...]


Segment = ReasoningSegment | TextSegment | FunctionCallSegment


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """What one response will contain, in order."""

    segments: tuple[Segment, ...]

    @property
    def total_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)


class UnknownToolChoice(ValueError):
    """``tool_choice`` names a function that is not among the request's tools."""

    code = "invalid_value"
    status = 400

    def __init__(self, tool_choice: str) -> None:
        super().__init__(tool_choice)
        self.tool_choice = tool_choice

    def __str__(self) -> str:
        return f"tool_choice names an unknown function: '{self.tool_choice}'."


class InvalidMetadata(ValueError):
    """A ``metadata`` knob (``METADATA_KEYS``) has an invalid value."""

    code = "invalid_value"
    status = 400

    def __init__(self, key: str, value: str) -> None:
        super().__init__(key, value)
        self.key = key
        self.value = value

    def __str__(self) -> str:
        return f"Invalid value for metadata key '{self.key}': '{self.value}'."


METADATA_KEYS: dict[str, str] = {
    "emulator.tool_rounds": "tool_rounds",
    "emulator.text_tokens": "text_tokens",
    "emulator.seed": "seed",
    "emulator.reasoning_tokens": "reasoning_tokens",
    "emulator.reasoning_tokens_p90": "reasoning_tokens_p90",
}


def metadata_overrides(metadata: Iterable[tuple[str, object]]) -> dict[str, Any]:
    """The policy fields a request's ``metadata`` sets; :class:`InvalidMetadata` for a value
    that is not a whole number within the field's bounds (callers can check early)."""
    updates: dict[str, Any] = {}
    for key, value in metadata:
        if key in scripted.METADATA_KEYS:
            try:
                script = scripted.from_metadata(key, str(value))
            except ValueError:  # pydantic's ValidationError included
                raise InvalidMetadata(key, str(value)) from None
            if key == scripted.TURN_KEY or "scenario" not in updates:  # one turn wins over a scenario
                updates["scenario"] = script
            continue
        field = METADATA_KEYS.get(key)
        if field is None:
            continue
        try:
            updates[field] = int(str(value).strip())
            _field_check(field).validate_python(updates[field])
        except (ValueError, ValidationError):
            raise InvalidMetadata(key, str(value)) from None
    return updates


@functools.cache
def _field_check(field: str) -> TypeAdapter[Any]:
    """The check of one :class:`PolicyConfig` field's value (its type and bounds), made once:
    a model built for each value to assign it cost tens of microseconds a request."""
    info = PolicyConfig.model_fields[field]
    kind: Any = info.annotation
    return TypeAdapter(Annotated[kind, *info.metadata] if info.metadata else kind)


def policy_for(request: InferenceRequest, base: PolicyConfig) -> PolicyConfig:
    """``base`` with the request's ``metadata`` overrides applied (see module doc)."""
    updates = metadata_overrides(request.metadata)
    return base.model_copy(update=updates) if updates else base


class PolicyMemo:
    """:func:`policy_for` made once per distinct ``metadata``: a client's creates resend the
    same few knobs turn after turn, and validating them (pydantic, per key) was about a
    quarter of the engine's work on a steady turn.  The policies are immutable in use, so
    requests with equal metadata share one.  Bounded: forgets all past ``capacity``
    distinct metadata.  A request whose metadata is invalid raises each time, nothing kept."""

    def __init__(self, base: PolicyConfig, capacity: int = 1024) -> None:
        self._base = base
        self._capacity = capacity
        self._known: dict[tuple[tuple[str, str], ...], PolicyConfig] = {}

    def __len__(self) -> int:
        return len(self._known)

    def policy(self, request: InferenceRequest) -> PolicyConfig:
        metadata = request.metadata
        if not metadata:
            return self._base
        known = self._known.get(metadata)
        if known is None:
            known = policy_for(request, self._base)
            if len(self._known) >= self._capacity:
                self._known.clear()
            self._known[metadata] = known
        return known


_MODES = ("auto", "none", "required")


def plan(
    request: InferenceRequest, policy: PolicyConfig, prompt_seed: Callable[[], int] | None = None
) -> OutputPlan:
    """The output of one response: hidden reasoning if asked for, then one function call or
    one text answer (see module doc) — or what the scenario says.  ``prompt_seed``: the
    plan's seed (the digest of the prompt and ``policy.seed``) computed by the caller, who
    may know most of it already (``inference.emulator.prompt_memo``)."""
    turn = scripted.turn_for(request, policy.scenario) if policy.scenario is not None else None
    if turn is not None:
        return scripted_plan(request, turn, policy.seed)
    seed = prompt_seed() if prompt_seed is not None else _seed(request.prompt_token_ids, policy.seed)
    rng = random.Random(seed)
    thinking: tuple[Segment, ...] = ()
    if policy.reasoning_tokens:  # its own generator: the visible output does not change with it
        think = random.Random(seed + 1)
        thinking = (ReasoningSegment(text_answer(reasoning_length(policy, think), think)),)
    tool = _tool_to_call(request, policy, rng)
    if tool is not None:
        if tool.custom:
            arguments = custom_input(tool.name, rng)
        else:
            arguments = arguments_for(tool.parameters, rng, scratch_paths=changes_files(tool.name))
        segment = FunctionCallSegment(tool.name, arguments, tuple(encode(arguments)), custom=tool.custom)
        return OutputPlan((*thinking, segment))
    # Never plan more text than can be sent: one token past ``max_output_tokens`` is enough
    # for the engine to see the cut (the planned text is then a prefix of the uncut one).
    n = policy.text_tokens
    if request.max_output_tokens is not None:
        n = min(n, request.max_output_tokens + 1)
    return OutputPlan((*thinking, text_segment(n, rng)))


def scripted_plan(request: InferenceRequest, turn: scripted.ScriptedTurn, seed: int) -> OutputPlan:
    """A scenario turn's output (``inference.emulator.scenario``): reasoning, text, then its calls;
    raises ``InjectedError`` for an error turn.  Synthetic text and reasoning are seeded by
    ``seed`` and the turn, never the prompt, so they are the same on every transport."""
    if turn.error is not None:
        raise scripted.InjectedError(turn.error.code, turn.error.message)
    rng = random.Random(f"{seed}:{turn.model_dump_json()}")
    segments: list[Segment] = []
    if turn.reasoning_tokens:
        segments.append(ReasoningSegment(text_answer(turn.reasoning_tokens, rng)))
    if turn.text is not None:
        segments.append(TextSegment(tuple(encode(turn.text)), canonical=True))
    elif turn.text_tokens is not None:
        n = (
            turn.text_tokens
            if request.max_output_tokens is None
            else min(turn.text_tokens, request.max_output_tokens + 1)
        )
        segments.append(text_segment(n, rng))
    custom = {t.name for t in request.tools if t.custom}
    for call in turn.calls:  # a call of a custom tool is its call, ``arguments`` its input
        arguments = call.argument_text()
        segments.append(
            FunctionCallSegment(call.name, arguments, tuple(encode(arguments)), custom=call.name in custom)
        )
    return OutputPlan(tuple(segments))


Z90 = 1.2815515655446004  # the standard normal's 0.9 quantile


def reasoning_length(policy: PolicyConfig, rng: random.Random) -> int:
    """``policy.reasoning_tokens``, or a draw from the lognormal of that median and
    ``reasoning_tokens_p90`` (at least 1, at most the field's bound)."""
    median, p90 = policy.reasoning_tokens, policy.reasoning_tokens_p90
    if p90 <= median:
        return median
    sigma = math.log(p90 / median) / Z90
    return max(1, min(65_536, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


def _tool_to_call(request: InferenceRequest, policy: PolicyConfig, rng: random.Random) -> ToolSpec | None:
    tools = request.tools
    if not tools or request.tool_choice == "none":
        return None
    if request.tool_choice not in _MODES:
        for tool in tools:
            if tool.name == request.tool_choice:
                return tool
        raise UnknownToolChoice(request.tool_choice)
    if request.tool_choice == "required" or request.tool_results_in_context < policy.tool_rounds:
        return tools[rng.randrange(len(tools))]
    return None


def prompt_digest(token_ids: Sequence[int], seed: int = 0) -> bytes:
    """A stable 16-byte digest of a seed and a token sequence (little-endian uint32 ids)."""
    packed = array("I", token_ids)
    if sys.byteorder != "little":
        packed.byteswap()
    h = blake2b(digest_size=16)
    h.update(seed.to_bytes(16, "little", signed=True))
    h.update(packed.tobytes())
    return h.digest()


def _seed(token_ids: Sequence[int], seed: int) -> int:
    """The RNG seed of one plan: a digest of the conversation's tokens (module doc)."""
    return int.from_bytes(prompt_digest(token_ids, seed), "little")


def arguments_for(schema: dict[str, Any] | None, rng: random.Random, *, scratch_paths: bool = False) -> str:
    """JSON arguments valid against ``schema``; ``"{}"`` for a missing or empty schema,
    or for one this generator cannot satisfy (see ``schema_values`` for what it honours).
    ``scratch_paths``: paths that exist nowhere, for a tool that changes files."""
    if not schema:
        return "{}"
    try:
        return json.dumps(value_for_schema(schema, rng, scratch_paths=scratch_paths))
    except Unsatisfiable:
        return "{}"


def custom_input(tool_name: str, rng: random.Random) -> str:
    """The free-text input of a custom tool's call.  A patch tool (``patch`` in its name,
    Codex's ``apply_patch``) gets a patch in Codex's format that updates a file in a
    directory that exists nowhere (``schema_values.scratch_path``): applying it fails and
    changes nothing.  Any other custom tool gets a corpus sentence."""
    if "patch" in tool_name.lower():
        path = scratch_path(rng)
        return (
            "*** Begin Patch\n"
            f"*** Update File: {path}\n"
            "@@\n"
            f"-{CORPUS[rng.randrange(len(CORPUS))]}\n"
            f"+{CORPUS[rng.randrange(len(CORPUS))]}\n"
            "*** End Patch"
        )
    return CORPUS[rng.randrange(len(CORPUS))]


def text_answer(n_tokens: int, rng: random.Random) -> tuple[int, ...]:
    """Exactly ``n_tokens`` cl100k ids of English text: corpus sentences sampled by ``rng``,
    joined with spaces as one text, then cut.  The ids are that text's encoding (real BPE
    merges across sentence boundaries) put together from each sentence's own: no merge
    crosses the space between two corpus sentences, so the pieces add up to the whole
    (``tests/inference/emulator/test_policy.py`` checks it against encoding the text), at a fraction
    of the cost of encoding thousands of tokens per response."""
    return _answer(n_tokens, rng)[0]


def text_segment(n_tokens: int, rng: random.Random) -> TextSegment:
    """:func:`text_answer` as a segment, ``canonical`` if the cut text encodes back to its
    ids.  The whole sentences before the cut do (the pieces add up, and a space before a
    sentence is where the encoder splits the text anyway), so only the last sentence's
    part is encoded again to know."""
    ids, last = _answer(n_tokens, rng)
    tail = ids[last:]
    return TextSegment(ids, canonical=tuple(encode(decode(tail))) == tail)


def _answer(n_tokens: int, rng: random.Random) -> tuple[tuple[int, ...], int]:
    """:func:`text_answer`'s ids, and where the sentence the cut falls in begins among them."""
    if not n_tokens:
        return (), 0
    alone, after_space = _corpus_ids()
    parts: list[int] = []  # corpus indices, in order
    ids: list[int] = []  # the encoding of the first ``joined`` parts
    joined = estimate = 0
    while True:
        while estimate < n_tokens:
            i = rng.randrange(len(CORPUS))
            parts.append(i)
            estimate += len(alone[i]) + 1
        for k in range(joined, len(parts)):
            last = len(ids)
            ids += after_space[parts[k]] if k else alone[parts[k]]
            if len(ids) >= n_tokens:
                return tuple(ids[:n_tokens]), last
        joined = len(parts)
        estimate = len(ids)


@functools.cache
def _corpus_ids() -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """Each corpus sentence's ids, alone (the text's first) and after a space (the others)."""
    return tuple(tuple(encode(s)) for s in CORPUS), tuple(tuple(encode(" " + s)) for s in CORPUS)
