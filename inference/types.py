"""The seam between a session (``actors/``) and the inference deployment.

Everything here crosses a Ray boundary, so it is plain frozen dataclasses (cheap to
pickle).  A request is one model call; the deployment answers with a stream of
*chunks*: each stream item is a ``list[InferenceEvent]`` covering a few milliseconds of
output (tokens cross Ray in chunks, never one Ray message per token).

Event order in one stream::

    Prefilled                       (exactly once, in the first item, with the first token)
    (ReasoningDone | TextDelta | FunctionCallDelta)*
    Done                            (exactly once, last)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Literal, TypeVar

FinishReason = Literal["stop", "tool_calls", "max_output_tokens"]
CacheMode = Literal["implicit", "explicit"]
CacheTTL = Literal["30m", "12h"]

_T = TypeVar("_T")


def _pickled_by_fields(cls: type[_T]) -> type[_T]:
    """Pickle ``cls`` as its constructor and its fields' values: a slotted dataclass's own
    ``__getstate__`` looks its fields up again for every instance, which made pickling a
    request with its breakpoints, and a stream's chunks, several times slower."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    get: Callable[[Any], Any] = attrgetter(*names)
    one = len(names) == 1

    def __reduce__(self: Any) -> tuple[type[_T], tuple[Any, ...]]:
        return cls, (get(self),) if one else get(self)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign]
    return cls


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Breakpoint:
    """A prompt-cache breakpoint: the prompt's first ``offset`` tokens are a reusable prefix
    (``inference.emulator.breakpoint_cache``).  ``ttl``: its own minimum lifetime (``None``: the
    request's).  ``implicit``: the end of an earlier request's prompt in the conversation,
    where that request's implicit breakpoint was written: a match candidate, never written."""

    offset: int
    ttl: CacheTTL | None = None
    implicit: bool = False


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: its name and JSON schema for arguments; ``custom``: a
    freeform tool, called with free text instead of JSON arguments (Codex's ``apply_patch``)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    custom: bool = False


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One model call.

    ``prompt_token_ids`` is the conversation already rendered with the model's chat format
    (``inference.chat_format``): the concatenation of its items' segments, with no trailing
    generation header (the model generates after the last segment).  ``session_key``
    identifies the connection: its requests are pinned to one replica (``None`` for
    stateless callers).  ``cache_scope`` is whose prefix-cache entries the request may
    reuse: the session passes its API key's, so a key's connections and HTTP requests share
    entries and keys never do (``None``: the model's unscoped entries, for tools that call
    the deployment directly).  ``prompt_cache_key`` (the create's) only steers routing: a
    stateless request's route hashes it with the scope and the prompt's first tokens
    (``inference.routing``).  ``replica_hint`` is the replica that served the conversation's
    previous response (a resumed connection's state carries it): a session key not pinned
    yet is pinned there while it lives, so a conversation that moved to another session host
    finds its prefix cache again (``inference.routing``).
    ``generate=False`` only prefills (fills the prefix cache) and produces no output.
    ``cache_mode``, ``cache_ttl`` and ``breakpoints`` are the create's prompt-caching
    options and the breakpoints in its prompt, for a profile whose prefix cache follows the
    breakpoint rule (``inference.emulator.breakpoint_cache``); the block rule ignores them.
    """

    request_id: str
    model: str
    prompt_token_ids: Sequence[int]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"  # "auto" | "none" | "required" | a tool name
    parallel_tool_calls: bool = True
    tool_results_in_context: int = 0
    max_output_tokens: int | None = None
    generate: bool = True
    session_key: str | None = None
    cache_scope: str | None = None
    prompt_cache_key: str | None = None
    replica_hint: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()  # the create's ``metadata``, for per-request knobs
    cache_mode: CacheMode = "implicit"
    cache_ttl: CacheTTL = "30m"
    breakpoints: tuple[Breakpoint, ...] = ()


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Prefilled:
    """The prompt was processed; output starts now.  Times are emulated milliseconds.

    ``cached_tokens`` is what ``usage.input_tokens_details.cached_tokens`` reports
    (OpenAI's rule, ``prefix_cache.reported_cached_tokens``); ``reused_tokens`` is the
    prefix the replica's KV cache really reused (what shortened ``prefill_ms``).
    ``queue_ms`` is the time spent waiting for a batch slot; ``replica`` names the replica.
    ``written``: the prompt tokens written to the cache as ``(ttl_30m, ttl_12h)``, under the
    breakpoint rule; ``None`` (the block rule, other backends): every prompt token not
    reused is written, with no lifetime (``usage`` reports no ``cache_write_tokens_details``).
    """

    prompt_tokens: int
    cached_tokens: int
    queue_ms: float
    prefill_ms: float
    reused_tokens: int = 0
    replica: str = ""
    written: tuple[int, int] | None = None


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class ReasoningDone:
    """The model finished ``tokens`` tokens of hidden reasoning (they took decode time and
    count in ``usage.output_tokens_details.reasoning_tokens``; their text is never sent)."""

    tokens: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class TextDelta:
    """A chunk of assistant message text (one or more real cl100k tokens)."""

    text: str
    tokens: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class FunctionCallDelta:
    """A chunk of function-call arguments — or, with ``custom``, of a custom tool call's
    input.  ``index`` numbers the calls of one response from 0; the first delta of a call
    announces it (its ``name`` is always set)."""

    index: int
    name: str
    arguments_delta: str
    tokens: int
    custom: bool = False


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Done:
    """End of stream.  ``output_tokens`` counts every generated token.

    ``context_token_ids``: what the call adds to the conversation as the engine's own token
    ids (a real model's generation prompt, output ids and closing,
    ``inference.chat_template.TemplateFormat.continuation``); the session appends them as
    they are.  The emulator sends its rendering of the output (``chat_format``, what the
    session would render from the same text; the prefix cache holds the same ids), so the
    session does not tokenise the output again; ``None`` (no output): the session renders
    the output items itself."""

    finish_reason: FinishReason
    output_tokens: int
    decode_ms: float
    context_token_ids: tuple[int, ...] | None = None


InferenceEvent = Prefilled | ReasoningDone | TextDelta | FunctionCallDelta | Done
