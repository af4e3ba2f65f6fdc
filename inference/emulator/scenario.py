"""Scripted scenarios: the emulated model does exactly what a test (or a replay) says.

A :class:`Scenario` is a list of turns; turn *i* is what the model's *i*-th response of a
conversation contains — hidden reasoning of a given length, a text answer (exact words or
a length), function calls (exact arguments or an argument size), or an error to fail the
response with.  The *i* of a request is the number of model responses already in its
context (runs of ``assistant`` / ``function_call`` / ``custom_tool_call`` / ``reasoning``
segments), so it counts the same on a socket chained with ``previous_response_id``, on
chained HTTP and on a full resend.  Past the last turn the seeded policy decides again (``after_last: policy``) or
the last turn repeats (``repeat_last``).

Where a scenario comes from (docs/replay.md, "Scripted scenarios"):

- the server's configuration, ``inference.policy.scenario`` (every conversation follows it);
- a request's ``metadata["emulator.scenario"]``: a scenario as JSON, for that request;
- a request's ``metadata["emulator.turn"]``: one turn as JSON, followed by that response
  whatever its context holds (what ``responses-ws replay`` sends, one per recorded step).

A request's metadata wins over the configuration.  ``inference.emulator.policy.plan`` turns the
turn :func:`turn_for` selects into its output plan (``scripted_plan``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.chat_format import separator_id
from inference.tokenizer import encode

if TYPE_CHECKING:
    from inference.types import InferenceRequest

SCENARIO_KEY = "emulator.scenario"
TURN_KEY = "emulator.turn"
METADATA_KEYS = (SCENARIO_KEY, TURN_KEY)
ERROR_CODES = ("server_error", "rate_limit_exceeded", "invalid_prompt")
Tokens = Annotated[int, Field(ge=0, le=65_536)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptedCall(_Strict):
    """One function call: ``arguments`` exactly (a JSON string, or an object dumped as
    JSON), or JSON arguments of ``arguments_tokens`` cl100k tokens (``{"input": "…"}``)."""

    name: Annotated[str, Field(min_length=1, description="the function called")]
    arguments: str | dict[str, Any] | None = Field(
        None, description="its arguments exactly (JSON text or an object)"
    )
    arguments_tokens: Tokens | None = Field(None, description="or JSON arguments of this many tokens")

    @model_validator(mode="after")
    def _one_source(self) -> ScriptedCall:
        if (self.arguments is None) == (self.arguments_tokens is None):
            raise ValueError("a call needs exactly one of 'arguments' and 'arguments_tokens'")
        return self

    def argument_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        if self.arguments is not None:
            return json.dumps(self.arguments)
        return arguments_of_size(self.arguments_tokens or 0)


class ScriptedError(_Strict):
    """Fail the response: ``response.failed`` with this code and message."""

    code: Literal["server_error", "rate_limit_exceeded", "invalid_prompt"] = Field(
        "server_error", description="response.failed's error code"
    )
    message: Annotated[str, Field(min_length=1, max_length=512, description="and its message")] = (
        "Injected by the scenario."
    )


class ScriptedTurn(_Strict):
    """One response, in order: reasoning, then text, then the calls (or only an error)."""

    reasoning_tokens: Tokens = Field(0, description="hidden reasoning tokens first")
    text: str | None = Field(None, description="the answer's text exactly")
    text_tokens: Annotated[int, Field(ge=1, le=65_536)] | None = Field(
        None, description="or text of this many tokens"
    )
    calls: list[ScriptedCall] = Field([], description="function calls after the text")
    error: ScriptedError | None = Field(None, description="or only this: the response fails")

    @model_validator(mode="after")
    def _coherent(self) -> ScriptedTurn:
        if self.text is not None and self.text_tokens is not None:
            raise ValueError("a turn has 'text' or 'text_tokens', not both")
        says = self.text is not None or self.text_tokens is not None or bool(self.calls)
        if self.error is not None and (says or self.reasoning_tokens):
            raise ValueError("a turn with an 'error' has nothing else")
        if self.error is None and not says:
            raise ValueError("a turn needs 'text', 'text_tokens', 'calls' or 'error'")
        return self


class Scenario(_Strict):
    """Turn *i* answers the conversation's *i*-th model request (module doc)."""

    turns: Annotated[
        list[ScriptedTurn], Field(min_length=1, description="turn i answers the i-th model request")
    ]
    after_last: Literal["policy", "repeat_last"] = Field(
        "policy", description="past the last turn: the seeded policy again, or the last turn repeated"
    )


class InjectedError(RuntimeError):
    """A scenario turn's ``error``: the session fails the response with its code and
    message (``args == (code, message)``, so it pickles across Ray unchanged)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.public_message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.public_message}"


def load_scenario(text: str) -> Scenario:
    """A scenario from YAML or JSON text (JSON is YAML); ``ValueError`` if it is not one.
    A bare list of turns is accepted as ``{"turns": [...]}``."""
    data = yaml.safe_load(text)
    if isinstance(data, list):
        data = {"turns": data}
    return Scenario.model_validate(data)


def from_metadata(key: str, value: str) -> Scenario:
    """The scenario a metadata value carries (``ValueError``/pydantic's if it does not)."""
    if key == TURN_KEY:
        return Scenario(turns=[ScriptedTurn.model_validate_json(value)], after_last="repeat_last")
    return Scenario.model_validate_json(value)


@lru_cache(maxsize=1)
def _output_heads() -> tuple[tuple[int, ...], ...]:
    return tuple(
        tuple(encode(f"{kind}\n")) for kind in ("assistant", "function_call", "custom_tool_call", "reasoning")
    )


def responses_in_context(tokens: Sequence[int]) -> int:
    """How many model responses a rendered conversation holds: the runs of consecutive
    output segments (``inference.chat_format``: a response's items are contiguous)."""
    sep, heads = separator_id(), _output_heads()
    runs, inside = 0, False
    for i, token in enumerate(tokens):
        if token != sep:
            continue
        is_output = any(tuple(tokens[i + 1 : i + 1 + len(h)]) == h for h in heads)
        if is_output and not inside:
            runs += 1
        inside = is_output
    return runs


def turn_for(request: InferenceRequest, scenario: Scenario) -> ScriptedTurn | None:
    """The turn this request answers; ``None`` past the end with ``after_last: policy``."""
    if len(scenario.turns) == 1 and scenario.after_last == "repeat_last":
        return scenario.turns[0]
    i = responses_in_context(request.prompt_token_ids)
    if i < len(scenario.turns):
        return scenario.turns[i]
    return scenario.turns[-1] if scenario.after_last == "repeat_last" else None


_WORDS = ("the", "file", "and", "the", "test")  # each one cl100k token after a space


def arguments_of_size(n: int) -> str:
    """JSON arguments (``{"input": "…"}``) of ``n`` cl100k tokens (exactly, for ordinary
    sizes); ``"{}"`` when ``n`` is no more than the wrapper's own tokens."""
    head, tail = '{"input": "', '"}'
    wrapper = len(encode(head + tail))
    if n <= wrapper:
        return "{}"

    def text(k: int) -> str:
        return head + " ".join(_WORDS[i % len(_WORDS)] for i in range(k)) + tail

    k = n - wrapper
    for _ in range(8):  # one word is one token: this converges at once
        size = len(encode(text(k)))
        if size == n:
            break
        k = max(1, k + n - size)
    return text(k)
