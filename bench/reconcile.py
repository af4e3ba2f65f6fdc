"""The usage ledger against what clients saw: the fault benchmark's verdict (``bench ledger``).

Clients record every response they saw start (``response.created``) and the terminal event
they saw end it, if any (:class:`Seen`); the ledger is read from the store afterwards, one
row per line.  The rule (docs/reliability.md, usage is billed exactly once): a response
whose terminal event carried ``usage`` has exactly one line with that usage; a response
whose terminal event carried none (failed unbilled) has no line; no line belongs to a
response no client saw start.  A response the client saw start but not end (its host was
killed) may have a line or not: the kill came after, or before, its line's commit; such
lines are counted apart (``billed_unseen``), as is whether each stored one can be fetched.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Line:
    """One ledger row, as read from the store."""

    response_id: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int


@dataclass(slots=True)
class Response:
    transport: str
    store: bool
    terminal: str | None = None  # the terminal event's type, once seen
    usage: tuple[int, int, int] | None = None  # (input, cached, output) as the terminal event reported


@dataclass
class Seen:
    """What the clients saw, by response id."""

    responses: dict[str, Response] = field(default_factory=dict)

    def created(self, response: dict[str, Any], transport: str) -> None:
        self.responses[response["id"]] = Response(transport, bool(response.get("store", True)))

    def finished(self, event_type: str, response: dict[str, Any]) -> None:
        seen = self.responses.setdefault(response["id"], Response("?", bool(response.get("store", True))))
        seen.terminal = event_type
        seen.usage = usage_of(response.get("usage"))


def usage_of(usage: dict[str, Any] | None) -> tuple[int, int, int] | None:
    if usage is None:
        return None
    return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]


def read_ledger(data_dir: str | Path) -> list[Line]:
    """Every line of the SQLite ledger in ``data_dir`` (docs/operations.md, the usage ledger)."""
    with contextlib.closing(sqlite3.connect(Path(data_dir) / "responses.sqlite3")) as conn:
        rows = conn.execute(
            "SELECT response_id, input_tokens, cached_tokens, output_tokens FROM usage"
        ).fetchall()
    return [Line(*row) for row in rows]


async def read_redis_ledger(
    url: str, owners: list[str], key_prefix: str = "rws:", *, cluster: bool = False
) -> list[Line]:
    """Every line of ``owners``' in the Redis ledger at ``url`` (a Redis Cluster's nodes with
    ``cluster``: every shard of each owner's ledger), read as the store reads them
    (:meth:`store.redis.RedisStore.usage`; a line written twice would be read twice)."""
    from store.redis import RedisStore

    store = RedisStore(url, key_prefix, cluster=cluster)
    try:
        entries = [e for owner in owners for e in await store.usage(owner)]
    finally:
        await store.close()
    return [Line(e.response_id, e.input_tokens, e.cached_tokens, e.output_tokens) for e in entries]


def reconcile(seen: Seen, lines: list[Line]) -> dict[str, Any]:
    """Counts of each case, the ``mismatches`` (cases the rule forbids) and a few examples."""
    counts = Counter(line.response_id for line in lines)
    by_id = {line.response_id: line for line in lines}
    out: Counter[str] = Counter()
    examples: list[str] = []

    def bad(case: str, rid: str) -> None:
        out[case] += 1
        if len(examples) < 10:
            examples.append(f"{case}: {rid}")

    for rid, n in counts.items():
        if n > 1:
            bad("duplicate_lines", rid)
    for rid, r in seen.responses.items():
        line = by_id.get(rid)
        if r.terminal is None:
            out["billed_unseen" if line is not None else "cut_unbilled"] += 1
        elif r.usage is None:
            out["seen_unbilled"] += 1
            if line is not None:
                bad("billed_but_seen_unbilled", rid)
        else:
            out["seen_billed"] += 1
            if line is None:
                bad("lost_lines", rid)
            elif (line.input_tokens, line.cached_tokens, line.output_tokens) != r.usage:
                bad("usage_mismatches", rid)
    for rid in by_id.keys() - seen.responses.keys():
        bad("lines_never_seen", rid)
    forbidden = (
        "duplicate_lines",
        "billed_but_seen_unbilled",
        "lost_lines",
        "usage_mismatches",
        "lines_never_seen",
    )
    return {
        "responses_seen": len(seen.responses),
        "ledger_lines": len(lines),
        **{case: out[case] for case in ("seen_billed", "seen_unbilled", "billed_unseen", "cut_unbilled")},
        **{case: out[case] for case in forbidden},
        "mismatches": sum(out[case] for case in forbidden),
        "examples": examples,
    }
