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
import hashlib
import json
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


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


def owner_of(api_key: str) -> str:
    """The owner a ledger line names for ``api_key``: its fingerprint, the first 32 hex digits
    of its SHA-256 (docs/operations.md, "The usage ledger")."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def _line(raw: str | bytes) -> Line:
    entry = json.loads(raw)
    return Line(entry["response_id"], entry["input_tokens"], entry["cached_tokens"], entry["output_tokens"])


def _text(raw: str | bytes) -> str:
    return raw if isinstance(raw, str) else raw.decode()


def journal_lines(path: Path) -> int:
    """The lines of one ledger journal (``<store.data_dir>/ledger-journal/``, JSON lines); a
    torn last line (the process died mid-write) does not count."""
    count = 0
    for raw in path.read_text().splitlines():
        try:
            _line(raw)
        except (ValueError, KeyError, TypeError):
            continue
        count += 1
    return count


async def read_redis_ledger(
    url: str, owners: list[str], key_prefix: str = "rws:", *, cluster: bool = False, shards: int = 16
) -> list[Line]:
    """Every line of ``owners``' in the Redis ledger at ``url``, by its documented layout
    (docs/operations.md, "The usage ledger"): the list ``<prefix>usage:<owner>``, or on a
    Redis Cluster (``cluster``: ``url`` lists its nodes, comma-separated) the ``shards``
    lists ``<prefix>usage:{<owner>|<b>}``, each line after its commit time and a space.
    A line written twice is read twice."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    urls = [u.strip() for u in url.split(",") if u.strip()]
    client: Redis | RedisCluster
    if cluster:
        nodes = [ClusterNode(urlsplit(u).hostname or "127.0.0.1", urlsplit(u).port or 6379) for u in urls]
        client = RedisCluster.from_url(urls[0], startup_nodes=nodes, decode_responses=True)
    else:
        client = Redis.from_url(urls[0], decode_responses=True)
    lines: list[Line] = []
    try:
        for owner in owners:
            if not cluster:
                lines += [_line(raw) for raw in await client.lrange(f"{key_prefix}usage:{owner}", 0, -1)]
                continue
            for b in range(shards):
                raws = await client.lrange(f"{key_prefix}usage:{{{owner}|{b}}}", 0, -1)
                lines += [_line(_text(raw).split(" ", 1)[1]) for raw in raws]
    finally:
        await client.aclose()
    return lines


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
