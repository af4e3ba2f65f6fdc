"""Driving a :class:`~actors.core.session.Session` in a test through the product's own
:class:`~actors.core.driver.Driver`, with a port that records what it is asked to carry out
(no model call runs, nothing is sent or written): the effects of one input, with the started
responses' first events after the input's own, as the connection gets them."""

from __future__ import annotations

from actors.core.driver import Driver
from actors.core.inputs import Input
from actors.core.session import Effects, Session


class Recorded:
    """A :class:`~actors.core.driver.Port` that keeps every effect it is handed."""

    def __init__(self) -> None:
        self.fx = Effects()

    def start(self, fx: Effects) -> None:
        pass  # the started turns are in ``fx.start``, recorded with the rest by carry_out

    def carry_out(self, fx: Effects) -> None:
        self.fx += fx

    def settled(self) -> None:
        pass


def handled(session: Session, event: Input) -> Effects:
    """What the driver carries out for ``event``."""
    port = Recorded()
    Driver(session, port).drive(event)
    return port.fx
