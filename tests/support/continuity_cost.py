"""The cost of keeping a connection's state in the cluster store, per turn: a session's
snapshot sealed and written with the fencing script, against a real redis-server, for
conversations of growing length (docs/reliability.md, "Resuming on any node").

    python -m tests.support.continuity_cost redis://127.0.0.1:6379/0

Prints p50/p99 in ms of the whole per-turn write (snapshot + seal + Lua round trip), of a
claim (what a resume pays before rebuilding) and of the rebuild (restore: parse, render,
classify every item).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid

from actors.core.inputs import StateRestored
from store.continuity import ContinuityStore
from tests.actors.test_session import answer_text, new_session, send


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def main(url: str, turns: int = 40, rounds: int = 30) -> None:
    store = ContinuityStore(url, f"cost-{uuid.uuid4().hex[:8]}:", ttl_s=30)
    session = new_session()
    previous = None
    epoch = 1
    print(
        f"{'turns':>5} {'state KB':>8} {'write p50':>9} {'p99':>7} {'claim p50':>9} {'p99':>7} {'rebuild p50':>11} {'p99':>7}"
    )
    for i in range(1, turns + 1):
        fx = send(session, input=f"turn {i}: " + "words " * 120, store=False, previous_response_id=previous)
        previous = answer_text(session, fx, "An answer " * 30).events[-1].response.id
        if i not in (1, 10, 20, 40):
            continue
        writes, claims, rebuilds = [], [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            state = session.snapshot()
            await store.save("c", epoch, "secret", owner="o", deadline=1e9, holder="h", state=state)
            writes.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            claimed = await store.claim("c", "secret", "o", "h")
            claims.append((time.perf_counter() - t0) * 1000)
            assert claimed is not None and claimed.state is not None
            epoch = claimed.epoch
            t0 = time.perf_counter()
            new_session().handle(StateRestored(claimed.state))
            rebuilds.append((time.perf_counter() - t0) * 1000)
        print(
            f"{i:>5} {len(state) / 1024:>8.1f} {pct(writes, 50):>9.2f} {pct(writes, 99):>7.2f} "
            f"{pct(claims, 50):>9.2f} {pct(claims, 99):>7.2f} {pct(rebuilds, 50):>11.2f} {pct(rebuilds, 99):>7.2f}"
        )
    await store.forget("c", epoch)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
