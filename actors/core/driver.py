"""The one way out of a session: :class:`Driver` hands a :class:`~actors.core.session.Session`
its inputs and carries out the :class:`~actors.core.turn.Effects` it answers with.

It is the only caller of :meth:`Session.handle <actors.core.session.Session.handle>` in the
product (tests/test_layout.py checks it), and the tests drive the core through it too.  The
I/O the effects need is its :class:`Port`'s: the connection's (:mod:`actors.host.connection`),
a recording one in the tests (tests/support/session_driver.py), or :data:`QUIET` where the
input is known to ask for nothing but evictions.

The order of one input's effects (:class:`~actors.core.turn.Effects`): the port stops the
calls of ``cancel`` and starts those of ``start``; the session is handed
:class:`~actors.core.inputs.CallsStarted` and the started responses' first events join the
batch; each other session whose lane the host's cache budget took is handed
:class:`~actors.core.inputs.LaneEvicted`; the port carries out the rest (events, records,
ledger lines, figures, loads, renders).  An input the port hands back while this happens (a
render done inline, a ledger line journaled) waits in a queue and is handled once the effects
before it are carried out: the session is never re-entered while it is working.  Once the
queue is empty the port is told (:meth:`Port.settled`).  No asyncio, no I/O here.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Protocol

from ..errors import ServerError
from ..protocol import error_event
from . import inputs as ev
from .session import Effects, Session

__all__ = ["QUIET", "Driver", "Port"]

log = logging.getLogger(__name__)


class Port(Protocol):
    """The I/O a :class:`Driver` needs to carry out a session's effects."""

    def start(self, fx: Effects) -> None:
        """Stop the model calls of ``fx.cancel``; start those of ``fx.start``."""

    def carry_out(self, fx: Effects) -> None:
        """Everything else in ``fx``: send its events (a terminal event once its ledger line,
        and record if stored, are written or journaled), keep its figures, load its loads,
        render its renders.  A follow-up input it has at once goes to :meth:`Driver.drive`,
        which queues it."""

    def settled(self) -> None:
        """The session has handled every input queued: nothing more is coming from it now."""


class Driver:
    """Drives one session through one :class:`Port`."""

    __slots__ = ("_port", "_waiting", "_working", "session")

    def __init__(self, session: Session, port: Port) -> None:
        self.session = session
        self._port = port
        self._waiting: deque[ev.Input] = deque()  # follow-up inputs handed over while working
        self._working = False

    def drive(self, event: ev.Input) -> None:
        """Hand ``event`` to the session and carry out what it answers, then every input
        queued meanwhile, in order.  Called while working (by the port, for a follow-up
        input), it queues ``event`` and returns."""
        if self._working:
            self._waiting.append(event)
            return
        self._working = True
        try:
            while True:
                self._apply(self._handle(event))
                if not self._waiting:
                    break
                event = self._waiting.popleft()
        finally:
            self._working = False
        self._port.settled()

    def _handle(self, event: ev.Input) -> Effects:
        try:
            return self.session.handle(event)
        except Exception:
            if not isinstance(event, ev.ClientFrame):
                raise
            # A bug a client frame hit: server_error (logged, its text not sent); the
            # session stays usable.
            log.exception("unexpected error handling a client frame")
            return Effects(events=[error_event(ServerError())])

    def _apply(self, fx: Effects) -> None:
        if fx.start or fx.cancel:
            self._port.start(fx)
            opening = fx.opening
            if opening:
                opened = self.session.handle(ev.CallsStarted(opening))
                assert only_events(opened), "CallsStarted answers with the responses' first events"
                fx.events += opened.events
        for eviction in fx.evict:  # another connection's lane, taken by the host's cache budget
            evicted = eviction.session.handle(ev.LaneEvicted(eviction.lane, eviction.response_id))
            assert only_events(evicted) and not evicted.events, "LaneEvicted asks for nothing"
        self._port.carry_out(fx)


def only_events(fx: Effects) -> bool:
    """``fx`` asks for nothing but events to be sent."""
    return not (fx.evict or _asks_work(fx))


def nothing_but_evictions(fx: Effects) -> bool:
    """``fx`` asks for nothing but other connections' lanes to be evicted."""
    return not (fx.events or _asks_work(fx))


def _asks_work(fx: Effects) -> bool:
    return bool(fx.start or fx.cancel or fx.load or fx.render or fx.persist or fx.usage or fx.timings)


class _Quiet:
    """The port of a session with no connection to carry anything out: a state restored
    before its socket is served (it may evict other connections' lanes), a session whose
    socket is gone (:class:`~actors.core.inputs.Disconnected`) or whose state is dropped
    (:class:`~actors.core.inputs.Released`).  Anything else asked of it is a bug."""

    def start(self, fx: Effects) -> None:
        raise AssertionError(f"a session with no connection was asked to start model calls: {fx!r}")

    def carry_out(self, fx: Effects) -> None:
        assert nothing_but_evictions(fx), f"a session with no connection was asked for {fx!r}"

    def settled(self) -> None:
        pass


QUIET: Port = _Quiet()
