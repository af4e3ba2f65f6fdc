"""The cost of keeping a connection's state in the cluster store, per turn: a session's
snapshot (a real :class:`~actors.core.session.Session`, ``store:false`` turns chained by
``previous_response_id``) written at every turn boundary through
:class:`store.connection_states.ContinuityStore` (its change appended, a snapshot now and then),
against a real redis-server or Redis Cluster, as the history grows (docs/reliability.md,
"Resuming on any node").

    python -m tests.support.continuity_cost redis://127.0.0.1:6379/0 [--cluster] [--tokens 100000]

Prints, per band of history length (prompt tokens), the bytes each turn wrote to the store
(median and mean: the mean counts the snapshots) beside the state's size (what a full
rewrite per turn would write), and the write time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass

from store.connection_states import ContinuityStore
from tests.actors.test_session import answer_text, new_session, send

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "hex",
]
WORDS_PER_TURN = 500  # about 500 tokens a turn: input and answer


@dataclass(frozen=True, slots=True)
class Turn:
    history_tokens: int  # the turn's prompt
    state_bytes: int  # the session's state after it
    written_bytes: int  # what its checkpoint wrote to the store
    write_ms: float


async def measure(url: str, *, cluster: bool = False, max_tokens: int = 100_000) -> list[Turn]:
    """Turns until the prompt passes ``max_tokens``, each checkpointed; the state a claim
    reads back at the end is checked to be the session's."""
    store = ContinuityStore(url, f"cost-{uuid.uuid4().hex[:8]}:", ttl_s=60, cluster=cluster)
    session = new_session()
    previous = None
    turns: list[Turn] = []
    try:
        history = 0
        i = 0
        while history < max_tokens:
            i += 1
            text = f"turn {i}: " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(WORDS_PER_TURN // 2))
            fx = send(session, input=text, store=False, previous_response_id=previous)
            history = len(fx.start[0].request.prompt_token_ids)
            answer = " ".join(WORDS[(i * j) % len(WORDS)] for j in range(WORDS_PER_TURN // 2))
            previous = answer_text(session, fx, answer).events[-1].response.id
            state = session.snapshot()
            before = store.bytes_written
            t0 = time.perf_counter()
            await store.save("c", 1, "secret", owner="o", deadline=1e9, holder="h", state=state)
            ms = (time.perf_counter() - t0) * 1000
            turns.append(Turn(history, len(state), store.bytes_written - before, ms))
        claimed = await ContinuityStore(url, store.key_prefix, ttl_s=60, cluster=cluster).claim(
            "c", "secret", "o", "h2"
        )
        assert claimed is not None and claimed.state == session.snapshot(), "the claim rebuilt another state"
        await store.forget("c", claimed.epoch)
    finally:
        await store.close()
    return turns


def bands(turns: list[Turn], edges: tuple[int, ...] = (2_000, 10_000, 50_000, 100_000)) -> list[dict]:
    """The turns grouped by history length: from 0 to each edge's band (2k: up to 2k; 10k:
    2k–10k; ...), with the median and mean bytes written per turn."""
    out = []
    low = 0
    for edge in edges:
        band = [t for t in turns if low < t.history_tokens <= edge] or [
            t for t in turns if t.history_tokens > low
        ][:1]
        if band:
            written = [t.written_bytes for t in band]
            out.append(
                {
                    "tokens": f"{low // 1000}k-{edge // 1000}k",
                    "turns": len(band),
                    "state_kb": band[-1].state_bytes / 1024,
                    "written_median": statistics.median(written),
                    "written_mean": statistics.fmean(written),
                    "write_ms_median": statistics.median(t.write_ms for t in band),
                }
            )
        low = edge
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--cluster", action="store_true", help="url lists the nodes of a Redis Cluster")
    parser.add_argument("--tokens", type=int, default=100_000, help="history length to grow to")
    args = parser.parse_args()
    turns = asyncio.run(measure(args.url, cluster=args.cluster, max_tokens=args.tokens))
    print(
        f"{'history':>10} {'turns':>5} {'state KB':>9} {'bytes/turn p50':>14} {'mean':>8} {'write ms p50':>12}"
    )
    for b in bands(turns):
        print(
            f"{b['tokens']:>10} {b['turns']:>5} {b['state_kb']:>9.1f} {b['written_median']:>14.0f} "
            f"{b['written_mean']:>8.0f} {b['write_ms_median']:>12.2f}"
        )
    total = sum(t.written_bytes for t in turns)
    print(
        f"{len(turns)} turns, {total / 1024:.0f} KB written in all, {total / len(turns):.0f} bytes a turn on average"
    )


if __name__ == "__main__":
    main()
