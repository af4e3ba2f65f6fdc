"""What becomes of a state when its socket ends (actors.host.aftermath): every combination of
the facts, against the rules written out longhand."""

from __future__ import annotations

import dataclasses
import itertools

from actors.host.aftermath import OUTCOME, Aftermath, SocketEnd, aftermath
from actors.host.handoff import Outcome

FACTS = [f.name for f in dataclasses.fields(SocketEnd)]


def _longhand(e: SocketEnd) -> Aftermath:
    if e.superseded:
        return Aftermath.MOVED
    if e.continuity and e.fenced:
        return Aftermath.FENCED
    if e.continuity and (e.client_closed or (e.server_ended and not e.draining)):
        return Aftermath.ENDED
    if e.continuity and e.draining:
        return Aftermath.HANDED_ON
    if e.parking and not e.server_ended and not e.draining:
        return Aftermath.PARKED
    return Aftermath.DISCARDED


def test_every_combination_of_facts():
    seen = set()
    for values in itertools.product((False, True), repeat=len(FACTS)):
        end = SocketEnd(**dict(zip(FACTS, values, strict=True)))
        assert aftermath(end) is _longhand(end), end
        seen.add(aftermath(end))
    assert seen == set(Aftermath), "every outcome is reachable"


def test_named_cases():
    base = dict.fromkeys(FACTS, False)
    assert (
        aftermath(SocketEnd(**{**base, "parking": True})) is Aftermath.PARKED
    )  # a dropped socket, resumable here
    assert aftermath(SocketEnd(**{**base, "parking": True, "draining": True})) is Aftermath.DISCARDED
    on = {**base, "continuity": True, "parking": True}
    assert aftermath(SocketEnd(**{**on, "draining": True, "server_ended": True})) is Aftermath.HANDED_ON
    assert aftermath(SocketEnd(**{**on, "server_ended": True})) is Aftermath.ENDED  # a limit, outside a drain
    assert aftermath(SocketEnd(**{**on, "client_closed": True})) is Aftermath.ENDED


def test_the_gateway_hears_of_a_state_that_lives_on_and_it_keeps_its_slot():
    assert set(OUTCOME) == set(Aftermath)
    assert {a for a, o in OUTCOME.items() if o.keeps_slot} == {Aftermath.MOVED, Aftermath.PARKED}
    assert OUTCOME[Aftermath.MOVED] is Outcome.MOVED and OUTCOME[Aftermath.PARKED] is Outcome.PARKED
