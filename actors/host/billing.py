"""How a terminal event is billed before it is sent: a pure decision, as a table.

A terminal event with usage has a ledger line; a ``store:true`` one has its record too.
:func:`billed` pairs a batch's terminal events with their lines and records and asks
:func:`billing` which way each goes; the connection (:mod:`actors.host.connection`) carries
it out:

====================  ==========================================================================
``UNBILLED``          no line (a failure before inference ran): sent at once
``WITH_RECORD``       the record and its line in one transaction; the lane waits for the write
``COMMIT``            ``store.ledger: commit``: the line committed first; the lane waits
``JOURNAL``           the line journaled (committed write-behind), the event sent at once
``JOURNAL_AND_STATE`` journaled, and the lane waits for the connection's state to be written
                      (resume on any node)
====================  ==========================================================================

A journal that cannot keep the line, or a write that fails, turns the event into
``response.failed`` without usage (not billed, :func:`failed_instead`), with the error the
failure maps to (``store_unavailable`` for a write the store could not take now:
:func:`actors.errors.write_failure`).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from store import StoredResponse, UsageEntry

from ..errors import APIError, ServerError
from ..protocol import TERMINAL_EVENTS, ResponseErrorBody, ResponseFailed, ServerEvent


class Billing(enum.Enum):
    UNBILLED = "unbilled"
    WITH_RECORD = "with_record"
    COMMIT = "commit"
    JOURNAL = "journal"
    JOURNAL_AND_STATE = "journal_and_state"

    @property
    def waits(self) -> bool:
        """The lane's events wait for a write before this event goes."""
        return self in (Billing.WITH_RECORD, Billing.COMMIT, Billing.JOURNAL_AND_STATE)


@dataclass(frozen=True, slots=True)
class Terminal:
    """What the decision reads: the event's ledger line and record, and the host's setup."""

    line: bool  # the event reports usage: it has a ledger line
    record: bool  # store:true: its record is written with the line
    commits_lines: bool  # store.ledger: commit (a store:false line is committed before)
    checkpoints: bool  # resume on any node: the state is written before a terminal event goes


# First match wins; ``None`` matches either value.  Every combination matches one rule
# (tests/actors/host/test_billing.py walks them).
RULES: tuple[tuple[tuple[bool | None, bool | None, bool | None, bool | None], Billing], ...] = (
    ((False, None, None, None), Billing.UNBILLED),
    ((True, True, None, None), Billing.WITH_RECORD),
    ((True, False, True, None), Billing.COMMIT),
    ((True, False, False, True), Billing.JOURNAL_AND_STATE),
    ((True, False, False, False), Billing.JOURNAL),
)


def _first_match(facts: tuple[bool, bool, bool, bool]) -> Billing:
    for pattern, outcome in RULES:
        if all(p is None or p == f for p, f in zip(pattern, facts, strict=True)):
            return outcome
    raise AssertionError(f"no billing rule for {facts}")  # pragma: no cover - RULES is total


# RULES read once for each of the sixteen combinations (a terminal event each turn asks).
_DECIDED = {
    (a, b, c, d): _first_match((a, b, c, d)) for a, b, c, d in itertools.product((False, True), repeat=4)
}


def billing(terminal: Terminal) -> Billing:
    return _DECIDED[(terminal.line, terminal.record, terminal.commits_lines, terminal.checkpoints)]


@dataclass(frozen=True, slots=True)
class Bill:
    """A terminal event with its ledger line (and its record, ``store:true``), and the way
    it is billed."""

    event: ServerEvent
    how: Billing
    line: UsageEntry
    record: StoredResponse | None


def billed(
    events: Sequence[ServerEvent],
    usage: Sequence[UsageEntry],
    persist: Sequence[StoredResponse],
    *,
    commits_lines: bool,
    checkpoints: bool,
) -> Sequence[ServerEvent | Bill]:
    """A batch's events in order, each terminal event that has a ledger line as its
    :class:`Bill`; the rest (``UNBILLED``) as they are.  Every line and record belongs to a
    terminal event of the batch."""
    if not usage:
        assert not persist, "a record comes with its ledger line"
        return events
    records = {record.id: record for record in persist}
    lines = {entry.response_id: entry for entry in usage}
    out: list[ServerEvent | Bill] = []
    for event in events:
        line = lines.pop(event.response.id, None) if isinstance(event, TERMINAL_EVENTS) else None
        if line is None:
            out.append(event)
            continue
        record = records.pop(line.response_id, None)
        how = billing(Terminal(True, record is not None, commits_lines, checkpoints))
        out.append(Bill(event, how, line, record))
    assert not records and not lines, "a record and a ledger line come with their terminal event"
    return out


def failed_instead(event: ServerEvent, error: APIError | None = None) -> ResponseFailed:
    """``response.failed`` without usage (not billed) in place of a terminal event whose
    record or ledger line could not be written: same sequence number, the output as
    generated; ``error`` (``server_error`` if none) unless the response had failed already."""
    assert isinstance(event, TERMINAL_EVENTS)
    failure = error or ServerError()
    before = event.response.error if isinstance(event, ResponseFailed) else None
    response = event.response.model_copy(
        update={
            "status": "failed",
            "completed_at": None,
            "incomplete_details": None,
            "usage": None,
            "error": before
            or ResponseErrorBody(code=failure.code or ServerError.code, message=failure.message),
        }
    )
    return ResponseFailed(sequence_number=event.sequence_number, response=response, stream_id=event.stream_id)
