"""``response.inject`` (OpenAI's multi-agent beta, ``OpenAI-Beta: responses_multi_agent=v1``;
docs/protocol.md §2.5, §3.7): client-owned tool output put into a response that is still
running — the shipped form of this server's ``response.append`` (docs/append-mode.md).

A response takes injected input when it waits for tool output: it pauses on its function
calls instead of completing (append mode, or a create with ``multi_agent.enabled``).  The
input must answer calls the response issued and has no result for yet.

* The response is paused on its calls: the input is committed at once
  (``response.inject.created``) and sampling resumes with it, as after ``response.append``.
* A model call is running (the response was resumed with some of its calls still open):
  the input is held (:class:`Injections`) and committed when that call stops, which then
  pauses whatever it produced (text included) so the model continues with the input.
* The response ended before held input was committed: ``response.inject.failed``
  (``response_already_completed``) returns it, after the terminal event.

A target that is not running fails at once: ``response_already_completed`` for a lane's
latest response, ``response_not_found`` otherwise.  Malformed input is a typed 400
``error`` (the parser's, or ``invalid_value`` naming ``input[i]`` / ``response_id``).

The session decides when these apply; this module owns the rules and what waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidRequest
from ..protocol import (
    InjectCreated,
    InjectFailed,
    InjectFailedError,
    InputItem,
    OutputCustomToolCall,
    OutputFunctionCall,
    ResponseCreate,
    ResponseInject,
)
from .rollout import ToolResult
from .turn import Turn


def waits_for_tools(create: ResponseCreate, transport: str) -> bool:
    """Whether a response of ``create`` waits for injected tool output instead of completing
    on its function calls: ``multi_agent.enabled`` on a WebSocket (HTTP has no inject)."""
    return transport == "websocket" and create.multi_agent is not None and create.multi_agent.enabled


def open_calls(turn: Turn) -> frozenset[str]:
    """The calls of the running response that have no result yet: the rollout's open calls
    and those finished since it last paused."""
    folded = turn.rollout.folded if turn.rollout is not None else 0
    issued = frozenset(
        o.call_id
        for o in turn.builder.output[folded:]
        if isinstance(o, (OutputFunctionCall, OutputCustomToolCall)) and o.status == "completed"
    )
    return issued | (turn.rollout.open_calls if turn.rollout is not None else frozenset())


def sent(event: ResponseInject) -> list[dict[str, Any]]:
    """The input items as the client sent them (what a failure returns)."""
    return [item.model_dump(mode="json", exclude_unset=True, by_alias=True) for item in event.input]


InjectCode = Literal["response_already_completed", "response_not_found"]


def failed(event: ResponseInject, code: InjectCode, message: str, stream_id: str | None) -> InjectFailed:
    return InjectFailed(
        response_id=event.response_id,
        error=InjectFailedError(code=code, message=message),
        input=sent(event),
        stream_id=stream_id,
    )


def not_running(event: ResponseInject, finished: tuple[str | None, object] | None) -> InjectFailed:
    """The target runs nowhere on this connection; ``finished``: the lane (and its entry)
    whose latest response it is, if any."""
    if finished is not None:
        return failed(
            event,
            "response_already_completed",
            f"Response '{event.response_id}' already completed.",
            finished[0],
        )
    return failed(
        event,
        "response_not_found",
        f"No running response with id '{event.response_id}' on this connection.",
        None,
    )


def check(
    turn: Turn, event: ResponseInject, items: Sequence[InputItem], pending: Sequence[ToolResult]
) -> list[ToolResult]:
    """The input (``items``: ``event.input`` with its references resolved) if the running
    response can take it: tool output for its open calls, none answered twice;
    :class:`InvalidRequest` otherwise."""
    if not turn.builder.pause_on_calls:
        raise InvalidRequest(
            f"Response '{event.response_id}' does not take injected input: it was not created with "
            "multi_agent enabled.",
            param="response_id",
        )
    waiting = open_calls(turn) - {r.call_id for r in pending}
    results: list[ToolResult] = []
    for i, item in enumerate(items):
        if not isinstance(item, ToolResult):
            raise InvalidRequest(
                "response.inject takes function_call_output (or custom_tool_call_output) items.",
                param=f"input[{i}]",
            )
        if item.call_id not in waiting:
            raise InvalidRequest(
                f"Response '{event.response_id}' has no open call with call_id {item.call_id}.",
                param=f"input[{i}].call_id",
            )
        waiting -= {item.call_id}
        results.append(item)
    return results


def created(turn: Turn) -> InjectCreated:
    """The commit: numbered in the response's own sequence."""
    b = turn.builder
    return InjectCreated(sequence_number=b.next_seq(), response_id=b.response.id, stream_id=turn.lane)


@dataclass(slots=True)
class _Pending:
    event: ResponseInject
    results: list[ToolResult]
    lane: str | None


class Injections:
    """Injected input accepted for a response whose model call is running, not committed
    yet (committed when the call stops, or returned if the response ends first)."""

    def __init__(self) -> None:
        self._pending: dict[str, list[_Pending]] = {}

    def pending(self, response_id: str) -> list[ToolResult]:
        """The input accepted for ``response_id`` and not committed yet."""
        return [r for h in self._pending.get(response_id, ()) for r in h.results]

    def accept(self, turn: Turn, event: ResponseInject, results: list[ToolResult]) -> None:
        self._pending.setdefault(turn.builder.response.id, []).append(_Pending(event, results, turn.lane))
        turn.builder.stop_after_call = True  # whatever the call produces, the model continues

    def commit(self, response_id: str) -> list[ToolResult]:
        """The pending input of a response whose model call stopped (committed now)."""
        return [r for h in self._pending.pop(response_id, ()) for r in h.results]

    def settle(self, response_id: str) -> list[InjectFailed]:
        """The response ended: its pending input comes back."""
        return [
            failed(
                h.event,
                "response_already_completed",
                f"Response '{response_id}' ended before the injected input could be used.",
                h.lane,
            )
            for h in self._pending.pop(response_id, ())
        ]

    def clear(self) -> None:
        self._pending.clear()


__all__ = [
    "Injections",
    "ToolResult",
    "check",
    "created",
    "failed",
    "not_running",
    "open_calls",
    "waits_for_tools",
]
