"""Connection-to-actor assignment, with actor creation and killing behind the pool's seams."""

from __future__ import annotations

import asyncio

from serve.pool import ActorPool


class FakeActor:
    """Stands in for a SessionHost handle: only ``ready.remote()`` is used by the pool."""

    made = 0

    def __init__(self, name: str) -> None:
        FakeActor.made += 1
        self.name = name
        outer = self

        class _Ready:
            async def remote(self) -> str:
                return f"\0{outer.name}"

        self.ready = _Ready()


def make_pool(per_actor: int, warm: int) -> tuple[ActorPool, list]:
    killed: list = []
    return ActorPool(FakeActor, killed.append, per_actor=per_actor, warm=warm, prefix="t"), killed


def test_dedicated_actors_host_one_connection_at_a_time_and_idle_ones_are_reused():
    async def main():
        pool, killed = make_pool(per_actor=1, warm=1)
        await pool.warm_up()
        a = await pool.acquire()  # a spare starts in the background
        pool.release(a)  # before it is ready: the idle actor stays as the warm one
        assert killed == []
        await asyncio.sleep(0.01)  # the spare lands: one idle actor too many, the newest goes
        assert len(killed) == 1 and killed[0] is not a.host.actor
        made = FakeActor.made
        b = await pool.acquire()
        assert b.host is a.host and FakeActor.made == made, "the idle actor is reused, none started"
        c = await pool.acquire()
        assert c.host is not b.host and b.conn_id != c.conn_id, "one connection per actor"
        await asyncio.sleep(0.01)
        pool.release(b)
        pool.release(c)
        assert pool.stats() == {"actors": 1, "free_slots": 1, "starting": 0}, "idle actors beyond the warm count stop"
        pool.shutdown()

    asyncio.run(main())


def test_shared_actors_host_up_to_per_actor_connections():
    async def main():
        pool, killed = make_pool(per_actor=2, warm=0)
        leases = [await pool.acquire() for _ in range(3)]
        assert leases[0].host is leases[1].host and leases[2].host is not leases[0].host
        pool.release(leases[0])
        made = FakeActor.made
        again = await pool.acquire()
        assert FakeActor.made == made and again.host in {leases[0].host, leases[2].host}, \
            "a shared actor with room is reused, none is started"
        for lease in (again, leases[1], leases[2]):
            pool.release(lease)
        assert len(killed) == 2 and not set(killed) - {leases[0].host.actor, leases[2].host.actor}, \
            "idle actors beyond the warm count are stopped"

    asyncio.run(main())


def test_warm_slots_are_refilled_in_the_background():
    async def main():
        pool, _ = make_pool(per_actor=1, warm=2)
        await pool.warm_up()
        made = FakeActor.made
        await pool.acquire()
        await asyncio.sleep(0.01)
        assert FakeActor.made == made + 1, "one replacement started for the slot taken"

    asyncio.run(main())


def test_a_dead_actor_is_dropped():
    async def main():
        pool, killed = make_pool(per_actor=4, warm=0)
        lease = await pool.acquire()
        pool.release(lease, dead=True)
        assert killed == [lease.host.actor]
        assert (await pool.acquire()).host is not lease.host

    asyncio.run(main())


def test_an_actor_started_on_demand_during_a_top_up_does_not_leave_an_extra_idle_actor():
    async def main():
        pool, killed = make_pool(per_actor=1, warm=1)
        await pool.warm_up()
        a = await pool.acquire()  # starts a spare in the background
        b = await pool.acquire()  # the spare has not landed: b's actor is started on demand
        await asyncio.sleep(0.01)  # the spare lands
        pool.release(a)
        pool.release(b)
        assert pool.stats() == {"actors": 1, "free_slots": 1, "starting": 0}, "exactly the warm count is left"
        assert len(killed) == 2
        pool.shutdown()

    asyncio.run(main())
