"""The one way out of the session core (actors.core.driver): the order it carries effects out
in, follow-up inputs queued rather than re-entering the session, what a session with no
connection may be asked for.  That it is the product's only caller of ``handle``:
tests/test_layout.py."""

from __future__ import annotations

import json

import pytest

from actors.config import SessionConfig
from actors.core.cache_budget import CacheBudget
from actors.core.driver import QUIET, Driver
from actors.core.inputs import ClientFrame, Disconnected, InferenceChunk, Input, Released, Written
from actors.core.session import Effects, Session
from inference.types import Done, Prefilled, TextDelta
from tests.support.session_driver import handled

MODEL = "emu-fast"


def create(**body) -> ClientFrame:
    return ClientFrame(json.dumps({"type": "response.create", "model": MODEL, "input": "hello", **body}))


class Watched(Session):
    """A session that records its inputs, and fails if it is handed one while handling another."""

    def __init__(self, **kw) -> None:
        super().__init__(SessionConfig(), [MODEL], session_key="conn-1", clock=lambda: 1_700_000_000.0, **kw)
        self.inputs: list[str] = []
        self._in_handle = False

    def handle(self, event: Input) -> Effects:
        assert not self._in_handle, "re-entered while working"
        self._in_handle = True
        try:
            self.inputs.append(type(event).__name__)
            return super().handle(event)
        finally:
            self._in_handle = False


class Log:
    """A port that logs what it is asked, and can hand the driver a follow-up input while it
    carries effects out (as the connection does for a ledger line journaled at once)."""

    def __init__(self) -> None:
        self.driver: Driver | None = None
        self.calls: list[tuple[str, list[str]]] = []
        self.response_ids: set[str] = set()
        self.follow_up: list[Input] = []

    def start(self, fx: Effects) -> None:
        self.calls.append(
            ("start", [f"turn {t.turn_id}" for t in fx.start] + [f"cancel {c}" for c in fx.cancel])
        )

    def carry_out(self, fx: Effects) -> None:
        self.calls.append(
            ("carry_out", [f"error {e.error.code}" if e.type == "error" else e.type for e in fx.events])
        )
        self.response_ids |= {e.response.id for e in fx.events if hasattr(e, "response")}
        assert self.driver is not None
        while self.follow_up:
            self.driver.drive(self.follow_up.pop(0))
            self.calls.append(("handed back", []))

    def settled(self) -> None:
        self.calls.append(("settled", []))


def driven(session: Session) -> tuple[Driver, Log]:
    port = Log()
    port.driver = Driver(session, port)
    return port.driver, port


FINISHED = [Prefilled(3, 0, 0, 1), TextDelta("Hi", 1), Done("stop", 1, 1.0)]


def test_a_started_calls_first_events_join_its_batch_after_the_call_has_left():
    session = Watched()
    driver, port = driven(session)
    driver.drive(create())
    assert session.inputs == ["ClientFrame", "CallsStarted"]
    assert port.calls == [
        ("start", ["turn 0"]),
        ("carry_out", ["response.created", "response.in_progress"]),
        ("settled", []),
    ]


def test_a_follow_up_input_waits_until_the_effects_before_it_are_carried_out():
    session = Watched()
    driver, port = driven(session)
    driver.drive(create(store=False))
    (response_id,) = port.response_ids
    port.calls.clear()
    port.follow_up.append(Written(response_id, stored=True))  # its ledger line, journaled at once
    driver.drive(InferenceChunk(0, FINISHED))
    # Handed back during carry_out, the Written is handled once carry_out has returned.
    assert session.inputs[-2:] == ["InferenceChunk", "Written"]
    assert [name for name, _ in port.calls] == ["carry_out", "handed back", "carry_out", "settled"]
    assert port.calls[0][1][-1] == "response.completed"
    assert session.idle


class Buggy(Watched):
    """A session with a bug for one input of each kind."""

    def handle(self, event: Input) -> Effects:
        if (isinstance(event, ClientFrame) and event.data == "trigger") or isinstance(event, Disconnected):
            raise KeyError("internal detail")
        return super().handle(event)


def test_a_bug_a_client_frame_hits_is_answered_with_server_error_and_the_session_goes_on():
    session = Buggy()
    driver, port = driven(session)
    driver.drive(ClientFrame("trigger"))
    driver.drive(ClientFrame("not json"))
    assert port.calls == [
        ("carry_out", ["error server_error"]),
        ("settled", []),
        ("carry_out", ["error invalid_json"]),
        ("settled", []),
    ]
    with pytest.raises(KeyError):  # another input's bug is its caller's
        driver.drive(Disconnected())
    driver.drive(ClientFrame("not json"))  # and the driver is not left working
    assert port.calls[-2] == ("carry_out", ["error invalid_json"])


def test_another_sessions_lane_the_budget_took_is_handed_to_it():
    host = CacheBudget(max_tokens=60)
    one, two = Watched(cache=host), Watched(cache=host)
    for session in (one, two):
        (turn,) = handled(session, create(input="some words " * 15, store=False)).start
        handled(session, InferenceChunk(turn.turn_id, FINISHED))
    assert "LaneEvicted" in one.inputs and "LaneEvicted" not in two.inputs
    assert one.snapshot() != two.snapshot() and b'"lanes":[]' in one.snapshot().replace(b" ", b"")


def test_a_session_with_no_connection_may_be_asked_for_nothing_but_evictions():
    session = Watched()
    Driver(session, QUIET).drive(Disconnected())
    Driver(session, QUIET).drive(Released())
    with pytest.raises(AssertionError):
        Driver(session, QUIET).drive(create())  # a model call to start, with no connection
