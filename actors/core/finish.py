"""What a turn leaves when its response ends, as pure functions of the turn: the lane's new
context entry, the ledger line, the figures and the terminal event, the stored record; and
what a failed model call tells the client.  The session decides when (its ``_finish``)."""

from __future__ import annotations

from store import StoredResponse, UsageEntry

from ..protocol import RESPONSE_ERROR_CODES, ResponseCompleted, ResponseIncomplete
from . import rollout
from .context import ContextEntry, extend
from .timings import Report, as_metadata
from .turn import Turn


def context_entry(turn: Turn) -> ContextEntry:
    """The conversation as the lane caches it from now: the parent extended by this turn's
    input and output (an append-mode rollout: its one response of many calls)."""
    b = turn.builder
    response = b.response
    if turn.rollout is not None:
        turn.rollout = rollout.fold(turn.rollout, response.output, turn.fmt)
        entry = turn.rollout.context
    else:
        entry = extend(
            turn.parent,
            response.id,
            input_tokens=turn.input_tokens,
            inputs=turn.inputs,
            output=response.output,
            call_ids=turn.call_ids,
            tool_results=turn.request.tool_results_in_context,
            store=turn.store,
            scan=turn.scan,
            fmt=turn.fmt,
            output_tokens=b.context_tokens,
            input_marks=turn.input_marks,
        )
    entry.replica = b.replica
    return entry


def terminal(turn: Turn) -> tuple[Report, ResponseCompleted | ResponseIncomplete]:
    """The response's figures and its terminal event (the figures in its metadata if the
    client asked, taken again as the sender encodes it: actors.core.timings)."""
    b = turn.builder
    report = Report.at_finish(
        b.response.id, turn.timer, (b.queue_ms, b.prefill_ms, b.decode_ms), final=turn.store
    )
    event = b.terminal(as_metadata(report.ms) if turn.timings_requested else None)
    if turn.timings_requested:
        report.into = event.response.metadata
    return report, event


def stored_record(turn: Turn, entry: ContextEntry, *, owner: str, created_at: float) -> StoredResponse:
    """The record of a ``store:true`` response: the response as sent, terminal metadata
    included, with its input items and the conversation it continues."""
    response = turn.builder.response
    return StoredResponse(
        id=response.id,
        owner=owner,
        created_at=created_at,
        response=response.model_dump(mode="json"),
        input_items=turn.inputs,
        context=entry.items,
    )


def usage_line(turn: Turn, *, owner: str, transport: str, created_at: float) -> UsageEntry:
    """The ledger line of a response whose terminal event reports usage."""
    r = turn.builder.response
    assert r.usage is not None
    return UsageEntry(
        response_id=r.id,
        owner=owner,
        model=r.model,
        transport=transport,  # type: ignore[arg-type]
        input_tokens=r.usage.input_tokens,
        cached_tokens=r.usage.input_tokens_details.cached_tokens,
        output_tokens=r.usage.output_tokens,
        created_at=created_at,
    )


def failure(exc: BaseException) -> dict[str, str]:
    """The ``response.failed`` error of a model call that raised ``exc``: its code if the
    wire has it (and a scripted scenario's message, inference.emulator.scenario), else ``server_error``."""
    code = getattr(exc, "code", None)
    fail = {"code": code if code in RESPONSE_ERROR_CODES else "server_error"}
    message = getattr(exc, "public_message", None)
    if isinstance(message, str) and code in RESPONSE_ERROR_CODES:
        fail["message"] = message
    return fail
