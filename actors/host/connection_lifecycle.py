"""A connection's lifecycle: its states, what moves it on, and every transition in one table
(:data:`TRANSITIONS`); what becomes of a client frame in each state in another
(:data:`FRAMES`).  tests/actors/host/test_connection_lifecycle.py walks both."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from ..protocol import ErrorEvent, ServerEvent

# How a drain (shutdown, redeploy, scale-down) ends a connection once its responses have
# finished: RFC 6455's 1012, which clients (the openai SDK among them) take as "reconnect".
SERVICE_RESTART = (1012, "service restart")


class State(enum.Enum):
    """Where a connection stands; each method checks it before it moves on."""

    OPEN = "open"  # client input goes to the session
    DRAINING = "draining"  # shutting down: new creates are refused, responses in flight finish
    ENDING = "ending"  # the server ended it: input is ignored, events() ends after what is queued
    # A drain ended it: events() ends after what is queued, and a frame the client sent before
    # it saw the close is answered before the close frame (FRAMES).
    DRAIN_ENDING = "drain ending"
    CLOSED = "closed"  # the client is gone: generations are cancelled

    @property
    def accepting(self) -> bool:
        return self in (State.OPEN, State.DRAINING)


class Move(enum.Enum):
    """What moves a connection on: :meth:`~actors.host.connection.Connection.drain`,
    :meth:`~actors.host.connection.Connection.end` (and ``finish_with``),
    :meth:`~actors.host.connection.Connection.close`."""

    DRAIN = "drain"  # the host is shutting down
    END = "end"  # the server ends the connection
    CLOSE = "close"  # the socket is gone


# Every transition of a connection's lifecycle; a move from a state not listed with it is
# ignored (a drain of a connection the server already ends, a second close…).
TRANSITIONS: dict[tuple[State, Move], State] = {
    (State.OPEN, Move.DRAIN): State.DRAINING,
    (State.OPEN, Move.END): State.ENDING,
    (State.OPEN, Move.CLOSE): State.CLOSED,
    (State.DRAINING, Move.END): State.DRAIN_ENDING,
    (State.DRAINING, Move.CLOSE): State.CLOSED,
    (State.ENDING, Move.CLOSE): State.CLOSED,
    (State.DRAIN_ENDING, Move.CLOSE): State.CLOSED,
}


class Frames(enum.Enum):
    """What becomes of a client frame read in a state."""

    SESSION = "session"  # handed to the session; its answers are queued in order
    BEFORE_CLOSE = "before close"  # handed to the session; its answers go before the close frame
    IGNORED = "ignored"  # dropped unread


FRAMES: dict[State, Frames] = {
    State.OPEN: Frames.SESSION,
    State.DRAINING: Frames.SESSION,  # a create is refused: server_shutting_down
    # The client sent it without knowing: a create is answered (server_shutting_down), not
    # dropped; frames still on the wire when the close leaves are the client's to resend.
    State.DRAIN_ENDING: Frames.BEFORE_CLOSE,
    State.ENDING: Frames.IGNORED,
    State.CLOSED: Frames.IGNORED,
}


def late_answers(events: Iterable[ServerEvent]) -> tuple[list[ServerEvent], list[ServerEvent]]:
    """``events`` a session answered with while the connection is :attr:`State.DRAIN_ENDING`,
    split into the answers to the client's late frames (its error events: a draining session
    refuses every create with ``server_shutting_down``), written before the close frame, and
    the rest (a response in flight at the drain's cut-off), which go the usual way."""
    late: list[ServerEvent] = []
    rest: list[ServerEvent] = []
    for event in events:
        (late if isinstance(event, ErrorEvent) else rest).append(event)
    return late, rest
