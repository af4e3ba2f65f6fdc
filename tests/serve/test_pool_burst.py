"""Regression test for a bug the soak (bench/soak.py) found (fixed in serve/pool.py).

With ``connections_per_actor > 1``, connections that arrive while no host has a free slot
and a new actor is still starting each start an actor of their own: ``ActorPool.acquire``
does not wait for (or share) an actor that is already starting.  In the soak, 200
connections ramped over 20 s with ``connections_per_actor=64, warm_actors=16`` on a
loaded machine made 138 session actors (~120 MiB each) instead of 4; load average went to
80 and 136 of the 200 handshakes timed out.
"""

from __future__ import annotations

import asyncio

import pytest

from serve.pool import ActorPool


class SlowActor:
    """A SessionHost stand-in whose start (``ready``) takes a while, as under load."""

    made = 0

    def __init__(self, *name: str) -> None:  # the pool passes a name, or not, by version
        SlowActor.made += 1

        class _Ready:
            async def remote(self) -> str:
                await asyncio.sleep(0.05)
                return "\0slow"

        self.ready = _Ready()


def test_a_burst_of_connections_waits_for_the_actor_already_starting():
    async def main() -> int:
        pool = ActorPool(SlowActor, lambda actor: None, per_actor=64, warm=16, prefix="t")
        await pool.warm_up()
        for _ in range(64):  # the first actor fills up; its replacement is starting
            await pool.acquire()
        before = SlowActor.made
        await asyncio.gather(*(pool.acquire() for _ in range(20)))  # 20 more arrive meanwhile
        return SlowActor.made - before

    started = asyncio.run(main())
    assert started <= 1, f"20 connections that fit one actor started {started} new actors"
