"""bench drain's verdict from the runner's records: each connection's end and each turn's
fate counted as the case it is, the violations among them, and what the clients saw handed
to the ledger's reconciliation."""

from __future__ import annotations

import pytest

from bench.kinds.drain import VIOLATIONS, seen_of, tally
from bench.runner import ConnectionRecord, LoadResult, TurnRecord
from bench.runner.channels import SHUTTING_DOWN

pytestmark = pytest.mark.unit


def turn(rid: str | None, terminal: str | None, code: str | None = None, **kw: object) -> TurnRecord:
    return TurnRecord(0, "steady", 10.0, 5.0, None, terminal == "response.completed", error_code=code,
                      response_id=rid, store=rid is not None and rid.startswith("s"), terminal=terminal, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_the_records_are_counted_case_by_case_and_only_violations_are_violations():
    result = LoadResult(
        records=[
            turn("s1", "response.completed", input_tokens=9, output_tokens=4, cached_tokens=1),
            turn("r2", "response.completed", resent=True, input_tokens=9, output_tokens=2),
            turn(None, None, SHUTTING_DOWN),
            turn(None, None, "closed_1012"),  # never started: resent, no violation
            turn("r3", None, "closed_1012"),  # started, then cut: lost
            turn("r4", "response.failed", "server_error"),
            turn("r5", None, "invalid_request"),
        ],
        clients=[],
        connections=[
            ConnectionRecord(0, 0, 1.0, 1, closed=2.0, close_code=1012),
            ConnectionRecord(0, 1, 2.0, 2, closed=3.0, close_code=1006),
            ConnectionRecord(0, 2, 3.0, 3, closed=4.0),
            ConnectionRecord(0, 3, 4.0, 4, closed=5.0, left_open=True),
            ConnectionRecord(0, 4, 5.0, 5, closed=6.0, stopped=True),
        ],
        connect_failures={
            "connect:http_503": 3,
            "connect:InvalidMessage": 1,
            "connect:ConnectionResetError": 2,
        },
        connect_untyped={"connect:http_503": 1},
    )
    counts, examples = tally(result, 0.0)
    assert counts["opened"] == 5 and counts["closed_1012"] == 1 and counts["client_closed"] == 1
    assert (counts["upgrade_refused_typed"], counts["upgrade_refused_untyped"]) == (2, 1)
    assert (counts["upgrade_unanswered"], counts["upgrade_reset"]) == (1, 2)
    assert (counts["closed_abnormally"], counts["closed_other_code"]) == (1, 1)
    assert (counts["response.completed"], counts["response.failed"], counts["response_failed"]) == (2, 1, 1)
    assert (counts["create_refused_draining"], counts["resent"], counts["lost_terminal"]) == (1, 1, 1)
    assert counts["error_other"] == 1
    assert sum(counts[v] for v in VIOLATIONS) == 9 and len(examples) == 8  # one example a case seen
    seen = seen_of(result)
    assert set(seen.responses) == {"s1", "r2", "r3", "r4", "r5"}
    assert seen.responses["s1"].store and seen.responses["s1"].usage == (9, 1, 4)
    assert seen.responses["r3"].terminal is None and seen.responses["r4"].usage is None
