"""One client process's share of the loops, and its measure of itself.

:class:`LoadWorker` runs in a client process of this machine (bench/runner/local.py) or in a
Ray actor on a client node (bench/runner/cluster.py); the driver calls, in order,
:meth:`connect`, :meth:`start`, [:meth:`first_turns_answered`], :meth:`set_end`,
:meth:`pull` any number of times, and :meth:`finish`.  Every turn's record stays here until
pulled: records travel in batches, never one call per turn.

It measures itself while it runs: its process CPU time, sampled every
:data:`CPU_SAMPLE_S`, and its event loop's lateness waking from a :data:`LAG_TICK_S` sleep
(a client too busy to read its sockets shows here, not as the server's time).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from ..invariants import RunCheck
from .chains import ChainLoop, ChainTurns, HttpChainLoop
from .channels import Channel, CheckedWsChannel, Connections, HttpChannel, WsChannel, http_client
from .connecting import ConnectLog
from .locate import Locator
from .loop import HISTORY_POOL, Encoder, Loop, Pace, workload
from .model import OPEN_AT_RELEASE, ClientStats, ConnectionRecord, LoadSpec, TurnRecord, client_stats
from .resume import ResumeLoop

LAG_TICK_S = 0.01
CPU_SAMPLE_S = 0.5
STALL_MS = 20.0  # a tick this late is kept with its time (a stall)
CONNECT_CONCURRENCY = 64
FINISH_TIMEOUT_S = 120.0  # turns in flight at the end of the window complete within this
FINISH_POLL_S = 0.05


def runqueue_wait_s() -> float | None:
    """Seconds this thread has been runnable but waiting for a core (Linux schedstat)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


async def watch_lag(
    ticks: list[tuple[float, float]],
    cpu: list[tuple[float, float]],
    stalls: list[tuple[float, float]],
    waits: list[tuple[float, float]] | None = None,
) -> None:
    """Every tick: how late (ms) this process's event loop woke, with when; every
    :data:`CPU_SAMPLE_S`: the process's CPU seconds so far (and into ``waits`` its event
    loop thread's run-queue wait so far)."""
    next_cpu = 0.0
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(LAG_TICK_S)
        late = (time.perf_counter() - t0 - LAG_TICK_S) * 1000
        now = time.time()
        ticks.append((now, late))
        if late >= STALL_MS:
            stalls.append((now, late))
        if now >= next_cpu:
            cpu.append((now, time.process_time()))
            if waits is not None and (w := runqueue_wait_s()) is not None:
                waits.append((now, w))
            next_cpu = now + CPU_SAMPLE_S


class LoadWorker:
    def __init__(
        self, spec: LoadSpec, loops: list[int], node_id: str | None = None, node_ip: str | None = None
    ) -> None:
        self.spec = spec
        self.node_id, self.node_ip = node_id, node_ip
        self._encoder: Encoder | None = None  # built when a loop needs it (chains send their own)
        self.records: list[TurnRecord] = []
        self.pace: Pace | None = None
        self.loop_indices = loops
        self.loops: list[Loop | ChainTurns | ResumeLoop] = []
        self.ready: list[bool] = []
        self.http: dict[str, Any] = {}
        self.ticks: list[tuple[float, float]] = []
        self.cpu: list[tuple[float, float]] = []
        self.stalls: list[tuple[float, float]] = []
        self.waits: list[tuple[float, float]] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.watcher: asyncio.Task[None] | None = None
        self.release_at = 0.0
        self.check = RunCheck() if spec.check_events else None
        self.connects = ConnectLog(spec.connect_attempts)  # every open and failed attempt
        self.locator = None if spec.locate is None else Locator(spec.locate)
        self.connections = Connections(self._locate if self.locator is not None else None)

    async def _locate(self, record: ConnectionRecord) -> None:
        assert self.locator is not None
        record.server = await self.locator.find(record.local_port)

    def _ws(self, target: str, loop: int, headers: dict[str, str] | None = None) -> WsChannel:
        spec = self.spec
        ping = spec.chains.ping_interval_s if spec.workload == "chains" else None
        keepalive: dict[str, Any] = {} if ping is None else {"ping_interval_s": ping}
        compression = {"chains": spec.chains.compression, "resume": spec.resume.compression}.get(
            spec.workload
        )
        return WsChannel(
            target,
            spec.api_key,
            spec.open_timeout_s,
            connections=self.connections,
            loop=loop,
            compression=compression,
            headers=headers,
            lookup_in_background=spec.workload == "resume",  # a resume's first create is not delayed
            **keepalive,
        )

    def _session_ws(self, loop: int, target: str, headers: dict[str, str] | None) -> WsChannel:
        return self._ws(target, loop, headers)

    def _channel(self, target: str, loop: int) -> Channel:
        if self.check is not None:
            name = f"{os.getpid()}.{self.check.counts['connections']}"
            return CheckedWsChannel(target, self.spec.api_key, self.check.connection(name))
        if self.spec.transport == "ws":
            return self._ws(target, loop)
        if target not in self.http:
            self.http[target] = http_client(target, self.spec.api_key)
        return HttpChannel(self.http[target])

    def _maker(self, target: str, loop: int) -> Callable[[], Channel]:
        return lambda: self._channel(target, loop)

    @property
    def enc(self) -> Encoder:
        """The pre-encoded parts of the creates of the spec's workload (built once)."""
        if self._encoder is None:
            spec = self.spec
            w = spec.custom_workload or workload(spec.preset, spec.seed, spec.resume_tokens)
            self._encoder = Encoder.build(
                w, spec.transport, spec.store, f"{spec.seed}/{self.loop_indices[:1]}"
            )
        return self._encoder

    def _ws_maker(self, target: str, loop: int) -> Callable[[], WsChannel]:
        return lambda: self._ws(target, loop)

    async def connect(self) -> int:
        """Build the loops, open their connections (with ``arrivals``: none yet, each opens at
        its release); how many opened."""
        self.pace = Pace(len(self.loop_indices), rollouts=self.spec.rollouts_per_loop)
        if self.spec.workload == "resume":  # each loop opens its session's connections itself
            for i in self.loop_indices:
                target = self.spec.target(i)
                opener = functools.partial(self._session_ws, i)
                self.loops.append(
                    ResumeLoop(i, target, self.spec.resume, self.pace, self.records, opener, self.connects)
                )
            self.ready = [True] * len(self.loops)
            self.watcher = asyncio.create_task(watch_lag(self.ticks, self.cpu, self.stalls, self.waits))
            return 0
        if self.spec.workload == "chains":  # each loop opens its connections itself, one a chain
            for i in self.loop_indices:
                target = self.spec.target(i)
                chains = self.spec.chains
                if self.spec.transport != "ws":
                    maker = self._maker(target, i)
                    http = HttpChainLoop(i, target, chains, self.pace, self.records, maker, self.spec.seed)
                    self.loops.append(http)
                    continue
                ws_maker = self._ws_maker(target, i)
                self.loops.append(
                    ChainLoop(
                        i, target, chains, self.pace, self.records, ws_maker, self.connects, self.spec.seed
                    )
                )
            self.ready = [True] * len(self.loops)
            self.watcher = asyncio.create_task(watch_lag(self.ticks, self.cpu, self.stalls, self.waits))
            return 0
        if self.spec.workload == "rollouts":  # each loop opens a connection a rollout itself
            from .agent import agent_loops

            sink, connects = self.records, self.connects
            self.loops = list(
                await agent_loops(self.spec, self.loop_indices, self.pace, sink, self.connections, connects)
            )
            self.ready = [True] * len(self.loops)
            self.watcher = asyncio.create_task(watch_lag(self.ticks, self.cpu, self.stalls, self.waits))
            return 0
        fresh = self.spec.workload == "codex"
        for i in self.loop_indices:
            target = self.spec.target(i)
            self.loops.append(
                Loop(
                    i,
                    target,
                    self.enc,
                    self.pace,
                    self.records,
                    self._maker(target, i),
                    fresh_connection=fresh,
                    connects=self.connects,
                    continues=self.spec.continues[i] if self.spec.continues else None,
                )
            )
        for key in range(HISTORY_POOL):
            self.enc.history(key)  # every resumed history, encoded before the release
        if self.spec.arrivals:
            self.ready = [False] * len(self.loops)
            self.watcher = asyncio.create_task(watch_lag(self.ticks, self.cpu, self.stalls, self.waits))
            return 0
        sem = asyncio.Semaphore(CONNECT_CONCURRENCY)

        async def open_one(lp: Loop | ChainTurns | ResumeLoop) -> bool:
            async with sem:
                try:
                    await lp.open()
                    return True
                except Exception as exc:  # noqa: BLE001 - counted
                    lp.errors.append(f"connect: {type(exc).__name__}: {exc}"[:200])
                    return False

        self.ready = list(await asyncio.gather(*(open_one(lp) for lp in self.loops)))
        self.watcher = asyncio.create_task(watch_lag(self.ticks, self.cpu, self.stalls, self.waits))
        return sum(self.ready)

    async def start(self, release_at: float) -> None:
        """Every loop sends its first turn at ``release_at`` (time.time()), or loop ``i`` at
        ``i / loops`` of the spec's ``ramp_s`` after it; with ``arrivals`` it opens its
        connection then.  A loop that stops before the run's end keeps its connection open
        (``hold``) or closes it."""
        assert self.pace is not None, "connect() first"
        pace, spec = self.pace, self.spec
        self.release_at = release_at
        step = spec.ramp_s / spec.loops

        async def run(k: int, lp: Loop | ChainTurns | ResumeLoop) -> None:
            at = release_at + lp.index * step
            ran = False
            try:
                if spec.arrivals:
                    await asyncio.sleep(max(0.0, at - time.time()))
                    try:
                        await lp.open()
                    except Exception as exc:  # noqa: BLE001 - counted by type in connects.failures
                        lp.errors.append(f"connect: {type(exc).__name__}: {exc}"[:200])
                        return
                    self.ready[k] = True
                if not self.ready[k] or spec.rollouts_per_loop == 0:
                    return
                ran = True
                await lp.run(at)
            except Exception as exc:  # noqa: BLE001 - a loop's failure is counted, not raised
                lp.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            finally:
                if not ran:
                    pace.first_done()  # no first turn: the storm is over for this loop
                if not spec.hold:
                    await lp.channel.close()

        self.tasks = [asyncio.create_task(run(k, lp)) for k, lp in enumerate(self.loops)]

    async def first_turns_answered(self) -> float:
        """When the last of this process's first turns was answered (time.time())."""
        assert self.pace is not None
        await self.pace.storm_over.wait()
        return time.time()

    async def set_end(self, end_at: float) -> None:
        assert self.pace is not None
        self.pace.end_at = end_at

    async def running(self) -> int:
        """How many of this process's loops are still running."""
        return sum(not t.done() for t in self.tasks)

    async def in_turn(self) -> int:
        """How many of this process's loops wait for the answer to a create now."""
        return sum(lp.in_turn for lp in self.loops)

    async def opened(self) -> int:
        """How many of this process's connections are open."""
        return sum(lp.channel.is_open for lp in self.loops)

    async def held_turns(self, turns: int) -> int:
        """``turns`` turns, one after another, on every connection held open (its loop
        stopped), all at once; each a new rollout's first create (kind ``held``).  How many
        completed."""
        held = [
            lp
            for lp, t in zip(self.loops, self.tasks)
            if t.done() and lp.channel.is_open and isinstance(lp, Loop)
        ]

        async def chain(lp: Loop) -> int:
            done = 0
            for _ in range(turns):
                if await lp.turn(lp.held_create(), "held") is None:
                    break
                done += 1
            return done

        return sum(await asyncio.gather(*(chain(lp) for lp in held)))

    # ---- the resume workload's steps (Resume.steps): every session of this process at once

    async def _sessions(self) -> list[ResumeLoop]:
        """This process's sessions that are well, once every one opened (or failed to)."""
        if self.tasks:
            await asyncio.wait(self.tasks)
        return [lp for lp in self.loops if isinstance(lp, ResumeLoop) and not lp.failed]

    async def session_turns(self, turns: int) -> int:
        """``turns`` turns on every session, in lockstep (each round's turns sent at once);
        how many sessions completed them all."""
        for _ in range(turns):
            sessions = await self._sessions()
            await asyncio.gather(*(lp.step(lp.next_turn) for lp in sessions))
        return len(await self._sessions())

    async def session_resume(self, targets: dict[str | None, str]) -> int:
        """Every session resumed at ``targets[the server its connection is on]`` and one turn
        sent there; how many did both."""
        sessions = await self._sessions()
        return sum(await asyncio.gather(*(lp.resume_by_server(targets) for lp in sessions)))

    async def session_go(self, think_s: float) -> None:
        """Every session turning, ``think_s`` between its turns, until :meth:`session_halt`."""
        for lp in await self._sessions():
            lp.go(think_s)

    async def session_halt(self) -> None:
        await asyncio.gather(*(lp.halt() for lp in self.loops if isinstance(lp, ResumeLoop)))

    async def session_progress(self) -> dict[int, tuple[int, bool]]:
        """Each session's completed turns so far, and whether it failed."""
        return {lp.index: (lp.completed, lp.failed) for lp in self.loops if isinstance(lp, ResumeLoop)}

    async def pull(self) -> list[TurnRecord]:
        """The records since the last pull."""
        out, self.records[:] = list(self.records), []
        return out

    async def finish(self, window: tuple[float, float]) -> dict[str, Any]:
        """Wait for the loops to stop, close everything; the remaining records, the
        errors by loop and this process's :class:`ClientStats` over ``window``."""
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        while (pending := [lp for lp, t in zip(self.loops, self.tasks) if not t.done()]) and (
            time.monotonic() < deadline
        ):
            if not any(lp.in_turn for lp in pending):
                break  # the rest are in a tool's time (begun before the end was known): no more turns
            await asyncio.sleep(FINISH_POLL_S)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.session_halt()
        if self.watcher is not None:
            self.watcher.cancel()
        await asyncio.gather(*(lp.channel.close() for lp in self.loops), return_exceptions=True)
        await asyncio.gather(*(c.aclose() for c in self.http.values()), return_exceptions=True)
        stats: ClientStats = client_stats(
            self.node_id,
            self.node_ip,
            os.getpid(),
            self.cpu,
            self.ticks,
            window,
            loops=len(self.loops),
            # chains, resume: the loops that opened a connection (each opens its own)
            connected=len({r.loop for r in self.connections.records})
            if self.spec.workload in OPEN_AT_RELEASE
            else sum(self.ready),
            waits=self.waits,
        )
        return {
            "records": await self.pull(),
            "errors": {lp.index: lp.errors[:5] for lp in self.loops if lp.errors},
            "stats": stats,
            "stalls": [s for s in self.stalls if window[0] <= s[0] <= window[1]],
            "lag_ms": [ms for t, ms in self.ticks if window[0] <= t <= window[1]],
            "check": self.check,
            "connect_failures": dict(self.connects.failures),
            "connect_untyped": dict(self.connects.untyped),
            "connects": self.connects.opened,
            "connections": self.connections.records,
        }
