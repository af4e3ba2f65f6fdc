"""The billing decision (actors.host.billing): every combination of its facts, one rule each."""

from __future__ import annotations

import itertools

from actors.host.billing import RULES, Billing, Terminal, billing


def _matches(pattern, facts) -> bool:
    return all(p is None or p == f for p, f in zip(pattern, facts, strict=True))


def test_every_combination_of_facts_matches_exactly_one_rule():
    for facts in itertools.product((False, True), repeat=4):
        assert sum(_matches(pattern, facts) for pattern, _ in RULES) == 1, facts


def test_the_decisions():
    def b(line, record, commits, checkpoints):
        return billing(Terminal(line, record, commits, checkpoints))

    assert b(False, False, True, True) is Billing.UNBILLED  # a failure before inference: nothing billed
    assert b(True, True, True, True) is Billing.WITH_RECORD  # store:true: record and line together
    assert b(True, True, False, False) is Billing.WITH_RECORD
    assert b(True, False, True, False) is Billing.COMMIT  # store.ledger: commit
    assert b(True, False, True, True) is Billing.COMMIT  # (the commit then writes the state too)
    assert b(True, False, False, True) is Billing.JOURNAL_AND_STATE
    assert b(True, False, False, False) is Billing.JOURNAL
    assert [o for o in Billing if o.waits] == [Billing.WITH_RECORD, Billing.COMMIT, Billing.JOURNAL_AND_STATE]


def test_a_write_that_failed_turns_the_terminal_event_into_failed_unbilled_with_its_error():
    from actors.errors import StoreUnavailable
    from actors.host.billing import failed_instead
    from actors.protocol import ResponseCompleted, ResponseErrorBody, ResponseFailed, ResponseObject

    response = ResponseObject(id="resp_1", created_at=1, status="completed", model="emu-fast")
    completed = ResponseCompleted(sequence_number=7, response=response)
    failed = failed_instead(completed, StoreUnavailable())
    assert isinstance(failed, ResponseFailed) and failed.sequence_number == 7
    assert failed.response.status == "failed" and failed.response.usage is None
    assert failed.response.error is not None and failed.response.error.code == "store_unavailable"
    assert failed_instead(completed).response.error.code == "server_error"  # type: ignore[union-attr]
    before = ResponseErrorBody(code="rate_limit_exceeded", message="busy")
    already = ResponseFailed(
        sequence_number=3, response=response.model_copy(update={"status": "failed", "error": before})
    )
    assert failed_instead(already, StoreUnavailable()).response.error == before  # it had failed already


def test_a_batch_is_billed_in_order_each_terminal_event_with_its_own_line_and_record():
    from actors.host.billing import Bill, billed
    from actors.protocol import ResponseCompleted, ResponseInProgress, ResponseObject
    from store import StoredResponse, UsageEntry

    def response(rid: str, status: str = "completed") -> ResponseObject:
        return ResponseObject(id=rid, created_at=1, status=status, model="emu-fast")

    def line(rid: str) -> UsageEntry:
        return UsageEntry(rid, "o", "emu-fast", "websocket", 10, 0, 2, 1.0)

    progress = ResponseInProgress(sequence_number=1, response=response("resp_a", "in_progress"))
    stored = ResponseCompleted(sequence_number=2, response=response("resp_a"))
    journaled = ResponseCompleted(sequence_number=5, response=response("resp_b"))
    unbilled = ResponseCompleted(sequence_number=3, response=response("resp_c"))
    record = StoredResponse("resp_a", "o", 1.0, {}, [], [])
    lines = [line("resp_b"), line("resp_a")]

    out = billed(
        [progress, stored, unbilled, journaled], lines, [record], commits_lines=False, checkpoints=False
    )
    assert out == [
        progress,
        Bill(stored, Billing.WITH_RECORD, lines[1], record),
        unbilled,
        Bill(journaled, Billing.JOURNAL, lines[0], None),
    ]
    events = [progress, unbilled]
    assert billed(events, [], [], commits_lines=True, checkpoints=True) is events, "no line: nothing to pair"
