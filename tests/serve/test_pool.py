"""The session-host pool's decisions, with a fake clock and host creation/killing behind its
seams (serve/pool.py; the sizing rules are in docs/scaling.md)."""

from __future__ import annotations

import asyncio

import pytest

from serve.pool import ActorPool, ArrivalRate, NoCapacity, PoolPolicy


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Hosts:
    """Injected ``create``/``kill``: a start finishes when the test says so (``finish``), or
    at once with ``instant``."""

    def __init__(self, *, instant: bool = False, clock: Clock | None = None, startup_s: float = 1.0) -> None:
        self.instant = instant
        self.clock = clock
        self.startup_s = startup_s
        self.made: list[str] = []
        self.killed: list[str] = []
        self._pending: list[asyncio.Future[None]] = []

    async def create(self, name: str) -> str:
        self.made.append(name)
        if self.clock is not None:  # a start takes startup_s of the fake clock
            self.clock.t += self.startup_s
        if not self.instant:
            fut = asyncio.get_running_loop().create_future()
            self._pending.append(fut)
            await fut
        return name

    def kill(self, handle: str) -> None:
        self.killed.append(handle)

    async def finish(self, n: int = 1) -> None:
        for _ in range(10):  # let the pool's start tasks reach create()
            if len(self._pending) >= n:
                break
            await asyncio.sleep(0)
        for fut in self._pending[:n]:
            fut.set_result(None)
        del self._pending[:n]
        for _ in range(3):
            await asyncio.sleep(0)

    @property
    def starting(self) -> int:
        return len(self._pending)


def policy(**kw) -> PoolPolicy:
    base = dict(
        soft=4, hard=8, warm=2, max_hosts=10, max_starting=2, idle_timeout_s=30.0, admission_wait_s=1.0
    )
    return PoolPolicy(**{**base, **kw})


def pool_with(hosts: Hosts, clock: Clock, **kw) -> ActorPool:
    return ActorPool(hosts.create, hosts.kill, policy(**kw), prefix="t", clock=clock)


def run(coro):
    return asyncio.run(coro)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_connections_pack_onto_the_fullest_host_below_the_soft_target():
    async def main():
        hosts, clock = Hosts(instant=True), Clock()
        pool = pool_with(hosts, clock, warm=4)
        await pool.warm_up()
        assert len(pool.hosts()) == 1
        leases = [await pool.acquire() for _ in range(4)]
        assert {lease.host.name for lease in leases} == {"t-a0"}, "fills the first host to its soft target"
        await asyncio.sleep(0)
        assert len(pool.hosts()) >= 2, "a spare host started ahead of demand"
        nxt = await pool.acquire()
        assert nxt.host.name != "t-a0" and nxt.host.connections == 1
        pool.shutdown()

    run(main())


def test_admission_never_waits_for_a_start_while_a_live_host_is_below_its_hard_cap():
    async def main():
        hosts, clock = Hosts(), Clock()
        pool = pool_with(hosts, clock, warm=1)
        task = asyncio.ensure_future(pool.warm_up())
        await hosts.finish()
        await task
        # A burst of 8 (the hard cap) while replacements are still starting: all admitted at once.
        leases = [pool.try_acquire() or await pool.acquire() for _ in range(8)]
        assert all(lease.host.name == "t-a0" for lease in leases)
        assert hosts.starting <= 2, "starts are bounded, not one per connection"
        # The ninth must wait for a start; it gets the new host when it is ready.
        ninth = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        assert not ninth.done()
        await hosts.finish()
        assert (await ninth).host.name != "t-a0"
        pool.shutdown()

    run(main())


def test_past_the_hard_caps_with_nothing_starting_admission_is_refused_at_once_with_a_retry_hint():
    async def main():
        hosts, clock = Hosts(instant=True), Clock()
        pool = pool_with(hosts, clock, max_hosts=1, warm=1)
        await pool.warm_up()
        for _ in range(8):
            await pool.acquire()
        with pytest.raises(NoCapacity) as refused:
            await pool.acquire()
        assert refused.value.retry_after_s >= 1
        assert pool.counters.refused == 1
        pool.shutdown()

    run(main())


def test_a_waiting_upgrade_is_refused_after_admission_wait_s():
    async def main():
        hosts, clock = Hosts(), Clock()
        pool = pool_with(hosts, clock, soft=1, hard=1, warm=0, admission_wait_s=0.05)
        with pytest.raises(NoCapacity):
            await pool.acquire()  # the start never finishes in time
        assert hosts.starting == 1
        pool.shutdown()

    run(main())


def test_a_burst_shares_the_hosts_already_starting_instead_of_starting_one_each():
    async def main():
        hosts, clock = Hosts(), Clock()
        pool = pool_with(hosts, clock, soft=64, hard=64, warm=16, max_starting=2, admission_wait_s=5)
        waiting = [asyncio.ensure_future(pool.acquire()) for _ in range(100)]
        await settle()
        assert hosts.starting == 2, "bounded starts while 100 upgrades wait"
        await hosts.finish(2)
        await settle()
        assert sum(f.done() for f in waiting) == 100, "two hosts of 64 take all 100"
        assert len(hosts.made) <= 4
        pool.shutdown()

    run(main())


def test_the_free_slot_watermark_follows_the_arrival_rate():
    async def main():
        clock = Clock()
        hosts = Hosts(instant=True, clock=clock, startup_s=2.0)
        pool = pool_with(hosts, clock, soft=100, hard=400, warm=10, max_starting=4)
        await pool.warm_up()
        assert pool.wanted_free() == 10
        for _ in range(200):  # 200 arrivals within a second
            clock.t += 0.005
            await pool.acquire()
        assert pool.wanted_free() > 100, "a fast arrival rate keeps more slots ahead"
        await settle()
        assert pool.free_slots() >= pool.wanted_free(), "hosts started to match it"
        clock.t += 60
        assert pool.wanted_free() == 10, "and decays back when arrivals stop"
        pool.shutdown()

    run(main())


def test_idle_hosts_stop_after_the_timeout_with_hysteresis_newest_first():
    async def main():
        hosts, clock = Hosts(instant=True), Clock()
        pool = pool_with(hosts, clock, soft=4, hard=4, warm=2, max_starting=4)
        await pool.warm_up()
        leases = [await pool.acquire() for _ in range(12)]
        await settle()
        n = len(pool.hosts())
        assert n >= 3
        for lease in leases:
            pool.release(lease)
        pool.tick()
        assert hosts.killed == [], "not before the idle timeout"
        clock.t += 31
        pool.tick()
        live = pool.hosts()
        assert hosts.killed and hosts.killed[0] == f"t-a{max(int(h[3:]) for h in hosts.made)}", "newest first"
        assert len(live) >= 1 and pool.stats()["free_slots"] >= 2 * pool.wanted_free()
        assert pool.stats()["free_slots"] - 4 < max(2 * pool.wanted_free(), 2), (
            "stops only while twice the wanted slots stay"
        )
        pool.shutdown()

    run(main())


def test_a_dead_host_is_forgotten_and_replaced():
    async def main():
        hosts, clock = Hosts(instant=True), Clock()
        pool = pool_with(hosts, clock, warm=2)
        await pool.warm_up()
        lease = await pool.acquire()
        pool.host_died(lease.host)
        await asyncio.sleep(0)
        assert lease.host not in pool.hosts() and lease.host.name in hosts.killed
        assert pool.hosts(), "a replacement started"
        pool.shutdown()

    run(main())


def test_the_arrival_rate_decays_exponentially():
    rate = ArrivalRate(window_s=5.0)
    for i in range(50):
        rate.add(i * 0.1)  # 10 per second for 5 s
    assert 5 < rate.now(4.9) < 10
    assert rate.now(4.9 + 5) < rate.now(4.9) / 2.5


def test_http_work_goes_to_another_host_than_new_websockets_and_keeps_two_hosts():  # http_hosts=0
    async def main():
        hosts, clock = Hosts(instant=True), Clock()
        pool = pool_with(hosts, clock, warm=1)
        await pool.warm_up()
        assert len(pool.hosts()) == 1
        first = await pool.acquire_http()
        assert first.host is pool.hosts()[0] and first.keep_alive, "with one host, HTTP shares it"
        await settle()
        assert len(pool.hosts()) == 2, "HTTP work brings a second host"
        lease = await pool.acquire()
        second = await pool.acquire_http()
        assert second.host is not lease.host, "not the host new connections go to"
        pool.release_http(first.host)
        pool.release_http(second.host)
        clock.t += 31
        pool.tick()
        assert len(pool.hosts()) == 1, "idle again: back to one"
        pool.shutdown()

    run(main())


def test_with_http_hosts_http_gets_hosts_of_its_own_that_websockets_never_share():
    async def main():
        hosts, clock = Hosts(), Clock()
        pool = pool_with(hosts, clock, warm=1, soft=2, hard=2, http_hosts=1, admission_wait_s=5.0)
        warming = asyncio.ensure_future(pool.warm_up())
        await hosts.finish()
        await warming
        websocket_host = (await pool.acquire()).host
        first, second = (asyncio.ensure_future(pool.acquire_http()) for _ in range(2))
        await settle()
        assert not first.done() and [name[:3] for name in hosts.made] == ["t-a", "t-h"], (
            "the first HTTP connections wait for the one HTTP host starting"
        )
        await hosts.finish()
        lease = await first
        assert lease.host.http_only and lease.keep_alive and (await second).host is lease.host
        assert pool.stats()["http_actors"] == 1 and pool.stats()["actors"] == 1
        # WebSockets fill their host, then wait for a WebSocket host: never the idle-looking HTTP host.
        assert (await pool.acquire()).host is websocket_host
        overflow = asyncio.ensure_future(pool.acquire())
        await hosts.finish()
        assert not (await overflow).host.http_only
        assert lease.host in pool.hosts(), "drained and watched with the others"
        for _ in range(2):
            pool.release_http(lease.host)
        clock.t += 31
        pool.tick()
        assert pool.stats()["http_actors"] == 1 and (await pool.acquire_http()).host is lease.host, (
            "kept when idle"
        )
        pool.host_died(lease.host)
        waiting = asyncio.ensure_future(pool.acquire_http())
        await settle()
        assert hosts.made[-1].startswith("t-h") and not waiting.done(), "a dead one is replaced on demand"
        pool.shutdown()

    run(main())


def test_an_http_connection_waits_for_the_http_host_at_most_admission_wait_s_then_a_websocket_host_stands_in():
    async def main():
        hosts, clock = Hosts(), Clock()
        pool = pool_with(hosts, clock, warm=1, http_hosts=1, admission_wait_s=0.01)
        warming = asyncio.ensure_future(pool.warm_up())
        await hosts.finish()
        await warming
        stand_in = await pool.acquire_http()  # the HTTP host is still starting
        assert not stand_in.host.http_only and not stand_in.keep_alive, "one request, then routed again"
        await hosts.finish()
        assert (await pool.acquire_http()).host.http_only
        pool.shutdown()

    run(main())


def test_a_hosts_hard_cap_is_what_its_open_file_limit_leaves():
    from actors.config import SessionConfig
    from serve.pool import policy_from

    cfg = SessionConfig()
    assert policy_from(cfg).hard == cfg.hard_connections_per_actor == 4096
    assert policy_from(cfg, 65_536).hard == 4096
    small = policy_from(cfg, 1500)  # half of the limit; the soft target never above it
    assert (small.hard, small.soft) == (750, 750)
