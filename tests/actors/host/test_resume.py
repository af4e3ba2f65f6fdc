"""The resume registry and token format (pure logic; the end-to-end behaviour is in
tests/integration/test_resume.py)."""

from __future__ import annotations

import asyncio

import pytest

from actors.core.inputs import Released
from actors.core.session import Effects
from actors.errors import InvalidResumeToken
from actors.host.resume import Held, ResumeRegistry, make_token, new_secret, parse_token
from tests.support.waiting import MovableClockLoop, run_with_movable_clock


class StubSession:
    """Stands in for actors.core.session.Session: the registry only releases it."""

    released = False

    def handle(self, event: object) -> Effects:
        assert isinstance(event, Released)
        self.released = True
        return Effects()


def test_a_token_round_trips_and_anything_else_is_refused():
    secret = new_secret()
    assert parse_token(make_token("rws-abc-a1", "rws-abc-7", secret)) == ("rws-abc-a1", "rws-abc-7", secret)
    for bad in ("", "rws1", "rws1.a.b", "rws2.a.b.c", "rws1..b.c", "rws1.a.b.c.d"):
        with pytest.raises(InvalidResumeToken):
            parse_token(bad)


def test_check_needs_the_right_secret_and_owner_and_a_parked_state_expires():
    async def main(loop: MovableClockLoop) -> None:
        registry = ResumeRegistry(grace_s=60.0)
        session = StubSession()
        held = Held("c1", "owner-a", "s3cret", session=session, lifetime_deadline=0.0)
        registry.add(held)
        assert registry.check("c1", "s3cret", "owner-a") is held
        for conn, secret, owner in (
            ("c1", "wrong", "owner-a"),
            ("c1", "s3cret", "owner-b"),
            ("c2", "s3cret", "owner-a"),
        ):
            with pytest.raises(InvalidResumeToken):
                registry.check(conn, secret, owner)
        registry.park(held)
        registry.claim(held)  # a resume stops the countdown
        await loop.advance(120.0)
        assert registry.check("c1", "s3cret", "owner-a") is held and not session.released
        registry.park(held)
        await loop.advance(59.0)
        assert registry.check("c1", "s3cret", "owner-a") is held, "still within its grace"
        await loop.advance(2.0)
        assert session.released and len(registry) == 0
        await asyncio.wait_for(registry.wait_gone("c1"), 1)  # gone: returns at once
        with pytest.raises(InvalidResumeToken):
            registry.check("c1", "s3cret", "owner-a")

    run_with_movable_clock(main)
