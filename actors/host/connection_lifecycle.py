"""A connection's lifecycle: its states, what moves it on, and every transition in one table
(tests/actors/host/test_connection_lifecycle.py walks it)."""

from __future__ import annotations

import enum

# How a drain (shutdown, redeploy, scale-down) ends a connection once its responses have
# finished: RFC 6455's 1012, which clients (the openai SDK among them) take as "reconnect".
SERVICE_RESTART = (1012, "service restart")


class State(enum.Enum):
    """Where a connection stands; each method checks it before it moves on."""

    OPEN = "open"  # client input goes to the session
    DRAINING = "draining"  # shutting down: new creates are refused, responses in flight finish
    ENDING = "ending"  # the server ended it: input is ignored, events() ends after what is queued
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
    (State.DRAINING, Move.END): State.ENDING,
    (State.DRAINING, Move.CLOSE): State.CLOSED,
    (State.ENDING, Move.CLOSE): State.CLOSED,
}
