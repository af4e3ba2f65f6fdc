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
