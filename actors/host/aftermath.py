"""What becomes of a connection's state when its socket has ended: a pure decision, as a
table (:meth:`actors.host.lifecycle.Lifecycle.settle` carries it out), and what the gateway
is told of it (:data:`OUTCOME`).

==================  ===========================================================================
``MOVED``           another socket resumed it here (superseded): it lives on there
``FENCED``          another holder has it (resume on any node): dropped here only
``ENDED``           closed for good (the client's 1000, or the server ended it outside a drain):
                    dropped, and deleted from the cluster store
``HANDED_ON``       a drain's close: dropped here, its state kept in the cluster store
                    (resumable on another node)
``PARKED``          kept for a resume on this host (and in the cluster store, if on)
``DISCARDED``       dropped
==================  ===========================================================================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .handoff import Outcome


class Aftermath(enum.Enum):
    MOVED = "moved"
    FENCED = "fenced"
    ENDED = "ended"
    HANDED_ON = "handed_on"
    PARKED = "parked"
    DISCARDED = "discarded"


@dataclass(frozen=True, slots=True)
class SocketEnd:
    """The facts of a socket's end the decision reads."""

    superseded: bool  # a resume took the state onto another socket of this host
    continuity: bool  # resume on any node is on (the state lives in the cluster store)
    fenced: bool  # another holder claimed the state
    client_closed: bool  # the client sent a 1000 close, and the server had not ended it
    server_ended: bool  # the server ended the connection (a drain, a limit, an error)
    draining: bool  # the host is draining
    parking: bool  # resumes on this host are on (the registry keeps parked states)


# First match wins; each rule lists the facts it needs (``True``/``False``) and ignores the
# rest.  tests/actors/host/test_aftermath.py walks every combination.
RULES: tuple[tuple[dict[str, bool], Aftermath], ...] = (
    ({"superseded": True}, Aftermath.MOVED),
    ({"continuity": True, "fenced": True}, Aftermath.FENCED),
    ({"continuity": True, "client_closed": True}, Aftermath.ENDED),
    ({"continuity": True, "server_ended": True, "draining": False}, Aftermath.ENDED),
    ({"continuity": True, "draining": True}, Aftermath.HANDED_ON),
    ({"parking": True, "server_ended": False, "draining": False}, Aftermath.PARKED),
    ({}, Aftermath.DISCARDED),
)


def aftermath(end: SocketEnd) -> Aftermath:
    for needs, outcome in RULES:
        if all(getattr(end, name) is value for name, value in needs.items()):
            return outcome
    raise AssertionError("the last rule matches everything")  # pragma: no cover


# What the gateway hears of each (actors.host.handoff.Outcome): a state that lives on keeps its
# host slot until the host says it is gone.
OUTCOME: dict[Aftermath, Outcome] = {
    Aftermath.MOVED: Outcome.MOVED,
    Aftermath.FENCED: Outcome.CLOSED,
    Aftermath.ENDED: Outcome.CLOSED,
    Aftermath.HANDED_ON: Outcome.CLOSED,
    Aftermath.PARKED: Outcome.PARKED,
    Aftermath.DISCARDED: Outcome.CLOSED,
}
