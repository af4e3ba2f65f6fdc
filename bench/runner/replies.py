"""What a turn's answer says, whatever the loop (bench/runner's loops, chains and resumes):
the terminal event parsed (:func:`parse_reply`), its usage (:func:`usage_fields`) and the
turn's :class:`~bench.runner.model.TurnRecord` (:func:`answered`)."""

from __future__ import annotations

import json
from typing import Any, TypedDict

from .channels import Reply
from .model import TurnRecord


def parse_reply(reply: Reply) -> tuple[dict[str, Any] | None, bool, str | None]:
    """The terminal event's Response, whether the turn completed, and its error code."""
    if reply.status is not None:
        return None, False, f"http_{reply.status}"
    if not reply.raw:
        return None, False, "stream_ended"
    last = json.loads(reply.raw)
    kind = last.get("type")
    if kind == "response.output_item.done" and reply.segment is not None:  # append mode's pause
        return {"id": reply.response_id, "output": reply.segment}, True, None
    response = last.get("response")
    if kind == "response.completed":
        if reply.segment is not None:  # append mode: this answer's items, the whole rollout's usage
            response = {**response, "output": reply.segment}
        return response, True, None
    if kind == "error":
        err = last.get("error")
        return None, False, (err.get("code") if isinstance(err, dict) else None) or "error"
    err = (response or {}).get("error") or {}
    return response, False, err.get("code") or str(kind)


class Usage(TypedDict):
    input_tokens: int | None
    cached_tokens: int | None
    output_tokens: int | None


def usage_fields(response: dict[str, Any] | None) -> Usage:
    """A Response's usage as a :class:`TurnRecord`'s fields: ``input_tokens``,
    ``cached_tokens`` (``input_tokens_details.cached_tokens``) and ``output_tokens``, each None
    where the usage says nothing (or the answer carried none)."""
    usage = (response or {}).get("usage") or {}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    return Usage(
        input_tokens=usage.get("input_tokens"),
        cached_tokens=None if cached is None else int(cached),
        output_tokens=usage.get("output_tokens"),
    )


def answered(
    index: int,
    kind: str,
    reply: Reply,
    ok: bool,
    target: str,
    code: str | None,
    model_ms: float | None = None,
    **fields: Any,
) -> TurnRecord:
    """An answered turn's :class:`TurnRecord`: the reply's client-side times (sent, total, to
    the first output delta, to the first event, the final event's gap), ``fields`` besides."""
    return TurnRecord(
        index,
        kind,
        reply.sent,
        reply.total_s * 1000,
        model_ms,
        ok,
        target=target,
        ttft_ms=None if reply.ttft_s is None else reply.ttft_s * 1000,
        error_code=code,
        first_event_ms=None if reply.first_s is None else reply.first_s * 1000,
        final_gap_ms=None if reply.gap_s is None else reply.gap_s * 1000,
        **fields,
    )
