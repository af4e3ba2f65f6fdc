"""Driving a :class:`~actors.core.session.Session` by hand, as its driver does: an input in,
and, when the effects start model calls, :class:`~actors.core.inputs.CallsStarted` at once
(the calls "left" then), its events after the input's own."""

from __future__ import annotations

from actors.core.inputs import CallsStarted, Input, LaneEvicted
from actors.core.session import Effects, Session


def handled(session: Session, event: Input) -> Effects:
    fx = session.handle(event)
    if fx.opening:
        fx.events += session.handle(CallsStarted(fx.opening)).events
    for eviction in fx.evict:  # another session's lane, taken by the host's cache budget
        eviction.session.handle(LaneEvicted(eviction.lane, eviction.response_id))
    return fx
