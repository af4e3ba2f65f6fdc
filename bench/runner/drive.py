"""The driver's side of a run, the same for client processes and Ray actors.

A :class:`Fleet` calls one method of every worker (bench/runner/worker.py) and returns their
answers.  :func:`drive`: connect every loop; release every first turn at once; the measured
window (after the warm-up, or after every first turn was answered); records pulled in batches
every :data:`PULL_EVERY_S` while it runs (``on_records`` sees each batch); the rest and each
worker's own figures at the end.  With ``rollouts_per_loop`` the window ends early once every
loop has run its rollouts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .model import LoadResult, LoadSpec, TurnRecord

PULL_EVERY_S = 5.0
DONE_POLL_S = 0.5  # with rollouts_per_loop: how often the driver asks whether every loop ended
RELEASE_DELAY_S = 1.0  # from the last connection open to the release of the first turns


class Fleet(Protocol):
    def call(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every worker, at once; their answers in order."""
        ...


def shares(loops: int, workers: int) -> list[list[int]]:
    """Loop indices per worker, dealt round-robin (loop ``i`` to worker ``i % workers``)."""
    k = max(1, min(workers, loops))
    return [list(range(i, loops, k)) for i in range(k)]


def drive(
    fleet: Fleet,
    spec: LoadSpec,
    *,
    on_records: Callable[[list[TurnRecord]], None] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> LoadResult:
    connected = sum(fleet.call("connect"))
    release_at = clock() + RELEASE_DELAY_S
    fleet.call("start", release_at)
    if spec.window_after_first_turns:
        start = max(fleet.call("first_turns_answered"))
    else:
        start = release_at + spec.warmup_s
    end = start + spec.duration_s
    fleet.call("set_end", end)
    records: list[TurnRecord] = []

    def take(batches: Sequence[list[TurnRecord]]) -> None:
        batch = [r for b in batches for r in b]
        records.extend(batch)
        if on_records is not None and batch:
            on_records(batch)

    while (left := end - clock()) > 0:
        sleep(min(PULL_EVERY_S if spec.rollouts_per_loop is None else DONE_POLL_S, left))
        take(fleet.call("pull"))
        if spec.rollouts_per_loop is not None and not sum(fleet.call("running")):
            end = max(start, min(end, clock()))  # every loop ran its rollouts: the window ends now
            break
    outs = fleet.call("finish", (start, end))
    take([o["records"] for o in outs])
    errors = {int(k): v for o in outs for k, v in o["errors"].items()}
    connect_failures: Counter[str] = Counter()
    for o in outs:
        connect_failures.update(o.get("connect_failures") or {})
    checks = [o["check"] for o in outs if o.get("check") is not None]
    for other in checks[1:]:
        checks[0].merge(other)
    return LoadResult(
        records,
        [o["stats"] for o in outs],
        window=(start, end),
        release_at=release_at,
        errors=errors,
        connected=connected,
        loops=spec.loops,
        lag_ms=[x for o in outs for x in o["lag_ms"]],
        stalls=[s for o in outs for s in o["stalls"]],
        check=checks[0] if checks else None,
        connect_failures=dict(connect_failures),
    )
