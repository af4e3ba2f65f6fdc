"""The driver's side of a run, the same for client processes and Ray actors.

A :class:`Fleet` calls one method of every worker (bench/runner/worker.py) and returns their
answers.  :func:`drive`: connect every loop; release every first turn at once; the measured
window (after the warm-up, or after every first turn was answered); records pulled in batches
every :data:`PULL_EVERY_S` while it runs (``on_records`` sees each batch); the rest and each
worker's own figures at the end.  With ``rollouts_per_loop`` the window ends early once every
loop has run its rollouts.

:class:`LoadRun` is a run that goes on until told to stop (:meth:`LoadRun.stop`), at the
latest at the end of the spec's window (``warmup_s + duration_s`` after the release: its
deadline), while its driver measures something else beside it; it also asks how many loops
still run and how many connections are open, and sends turns on the connections held open.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .model import OPEN_AT_RELEASE, LoadResult, LoadSpec, TurnRecord

PULL_EVERY_S = 5.0
DONE_POLL_S = 0.5  # with rollouts_per_loop: how often the driver asks whether every loop ended
RELEASE_DELAY_S = 1.0  # from the last connection open to the release of the first turns
# chains, resume and rollouts open no connection before the release: only ``start`` must reach every worker first
CHAINS_RELEASE_DELAY_S = 0.25


class Fleet(Protocol):
    def call(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every worker, at once; their answers in order."""
        ...


def shares(loops: int, workers: int) -> list[list[int]]:
    """Loop indices per worker, dealt round-robin (loop ``i`` to worker ``i % workers``)."""
    k = max(1, min(workers, loops))
    return [list(range(i, loops, k)) for i in range(k)]


class Drive:
    """One run's driver: :meth:`begin` (connect, release, the window), :meth:`wait` (pull the
    records until the window's end or ``stop``), :meth:`finish` (the result)."""

    def __init__(
        self,
        fleet: Fleet,
        spec: LoadSpec,
        *,
        on_records: Callable[[list[TurnRecord]], None] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fleet, self.spec, self.on_records = fleet, spec, on_records
        self.clock, self.sleep = clock, sleep
        self.records: list[TurnRecord] = []
        self.connected = 0
        self.release_at = self.start = self.end = 0.0

    def begin(self) -> None:
        """Every loop connected (or, with ``arrivals``, each at its release), the first turns
        released, the window set."""
        fleet, spec = self.fleet, self.spec
        self.connected = sum(fleet.call("connect"))
        delay = CHAINS_RELEASE_DELAY_S if spec.workload in OPEN_AT_RELEASE else RELEASE_DELAY_S
        self.release_at = self.clock() + delay
        fleet.call("start", self.release_at)
        if spec.window_after_first_turns:
            self.start = max(fleet.call("first_turns_answered"))
        else:
            self.start = self.release_at + spec.warmup_s
        self.end = self.start + spec.duration_s
        fleet.call("set_end", self.end)

    def take(self, batches: Sequence[list[TurnRecord]]) -> None:
        batch = [r for b in batches for r in b]
        self.records.extend(batch)
        if self.on_records is not None and batch:
            self.on_records(batch)

    def wait(self) -> None:
        """Pull the records until the window's end (or, with ``rollouts_per_loop`` or the
        rollouts workload, until every loop ran its rollouts: the window ends then)."""
        spec = self.spec
        while (left := self.end - self.clock()) > 0:
            self.sleep(min(DONE_POLL_S if spec.until_done else PULL_EVERY_S, left))
            self.take(self.fleet.call("pull"))
            if spec.until_done and not sum(self.fleet.call("running")):
                self.end = max(self.start, min(self.end, self.clock()))  # every loop ran its rollouts
                break

    def stop_now(self) -> None:
        """End the window now (if it has not ended): the loops stop (a turn in flight completes)."""
        now = self.clock()
        if now < self.end:
            self.end = now
            self.fleet.call("set_end", self.end)

    def finish(self) -> LoadResult:
        """Wait for the loops to stop; the records and each worker's own figures."""
        start = min(self.start, self.end)
        outs = self.fleet.call("finish", (start, self.end))
        self.take([o["records"] for o in outs])
        errors = {int(k): v for o in outs for k, v in o["errors"].items()}
        connect_failures: Counter[str] = Counter()
        untyped: Counter[str] = Counter()
        for o in outs:
            connect_failures.update(o.get("connect_failures") or {})
            untyped.update(o.get("connect_untyped") or {})
        checks = [o["check"] for o in outs if o.get("check") is not None]
        for other in checks[1:]:
            checks[0].merge(other)
        stats = [o["stats"] for o in outs]
        return LoadResult(
            self.records,
            stats,
            window=(start, self.end),
            release_at=self.release_at,
            errors=errors,
            # with arrivals (or chains, resume, rollouts) each loop connects at its release: as the workers counted
            connected=sum(c.connected for c in stats)
            if self.spec.arrivals or self.spec.workload in OPEN_AT_RELEASE
            else self.connected,
            loops=self.spec.loops,
            lag_ms=[x for o in outs for x in o["lag_ms"]],
            stalls=[s for o in outs for s in o["stalls"]],
            check=checks[0] if checks else None,
            connect_failures=dict(connect_failures),
            connects=[c for o in outs for c in o.get("connects", ())],
            connections=[c for o in outs for c in o.get("connections", ())],
            connect_untyped=dict(untyped),
        )


def drive(
    fleet: Fleet,
    spec: LoadSpec,
    *,
    on_records: Callable[[list[TurnRecord]], None] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> LoadResult:
    """Run ``spec`` on ``fleet`` for its window."""
    d = Drive(fleet, spec, on_records=on_records, clock=clock, sleep=sleep)
    d.begin()
    d.wait()
    return d.finish()


class LoadRun:
    """A run that goes on until :meth:`stop` (at the latest until its window's end: the
    spec's deadline), its workers' connections open meanwhile; ``close`` ends the workers."""

    def __init__(
        self,
        fleet: Fleet,
        spec: LoadSpec,
        close: Callable[[bool], None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self._close = close
        self._drive = Drive(fleet, spec, clock=clock)
        self._result: LoadResult | None = None
        try:
            self._drive.begin()
        except BaseException:
            close(True)
            raise
        self._deadline = self._drive.end

    @property
    def release_at(self) -> float:
        return self._drive.release_at

    @property
    def deadline(self) -> float:
        """When the loops stop if :meth:`stop` is not called before (time.time())."""
        return self._deadline

    def running(self) -> int:
        """Loops still running (arriving, or in their rollouts; a held connection is not)."""
        return sum(self._drive.fleet.call("running"))

    def in_turn(self) -> int:
        """Loops waiting for the answer to a create now."""
        return sum(self._drive.fleet.call("in_turn"))

    def opened(self) -> int:
        """Connections open now."""
        return sum(self._drive.fleet.call("opened"))

    def held_turns(self, turns: int) -> int:
        """``turns`` turns, one after another, on every connection held open (all at once);
        each a new rollout's first create, recorded with kind ``held``.  How many completed."""
        return sum(self._drive.fleet.call("held_turns", turns))

    # ---- the resume workload's steps (Resume.steps): every session of the run at once

    def turns(self, turns: int) -> int:
        """``turns`` turns on every session, in lockstep; how many sessions completed them."""
        return sum(self._drive.fleet.call("session_turns", turns))

    def resume(self, targets: Mapping[str | None, str]) -> int:
        """Every session resumed at ``targets[the server its connection is on]`` (``None``:
        not known) with one turn there; how many did."""
        return sum(self._drive.fleet.call("session_resume", dict(targets)))

    def go(self, think_s: float) -> None:
        """Every session turning, ``think_s`` between its turns, until :meth:`halt`."""
        self._drive.fleet.call("session_go", think_s)

    def halt(self) -> None:
        """Stop :meth:`go`'s turns (the turns in flight complete)."""
        self._drive.fleet.call("session_halt")

    def progress(self) -> dict[int, tuple[int, bool]]:
        """Each session's completed turns so far and whether it failed, by loop."""
        return {k: v for answer in self._drive.fleet.call("session_progress") for k, v in answer.items()}

    def stop(self) -> LoadResult:
        """End the run now; its result (the window ends now, or ended at the deadline)."""
        if self._result is not None:
            return self._result
        try:
            self._drive.stop_now()
            self._result = self._drive.finish()
        except BaseException:
            self._close(True)
            raise
        self._close(False)
        return self._result

    def __enter__(self) -> LoadRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._result is None:
            if exc[0] is None:
                self.stop()
            else:
                self._close(True)
