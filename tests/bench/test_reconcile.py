"""The fault benchmark's verdict (bench/reconcile.py): each case the rule forbids is found."""

from __future__ import annotations

from bench.reconcile import Line, Seen, reconcile


def usage(i: int, c: int, o: int) -> dict:
    return {"input_tokens": i, "input_tokens_details": {"cached_tokens": c}, "output_tokens": o}


def seen_with(*responses: tuple[str, str | None, dict | None]) -> Seen:
    seen = Seen()
    for rid, terminal, used in responses:
        seen.created({"id": rid, "store": False}, "websocket")
        if terminal is not None:
            seen.finished(terminal, {"id": rid, "usage": used})
    return seen


def test_a_ledger_that_matches_what_the_clients_saw_has_no_mismatch():
    seen = seen_with(
        ("a", "response.completed", usage(10, 2, 3)),
        ("b", "response.failed", None),
        ("c", None, None),
        ("d", None, None),
    )
    verdict = reconcile(seen, [Line("a", 10, 2, 3), Line("c", 5, 0, 1)])
    assert verdict["mismatches"] == 0
    assert (
        verdict["seen_billed"],
        verdict["seen_unbilled"],
        verdict["billed_unseen"],
        verdict["cut_unbilled"],
    ) == (1, 1, 1, 1)


def test_every_forbidden_case_is_counted():
    seen = seen_with(
        ("lost", "response.completed", usage(1, 0, 1)),
        ("twice", "response.completed", usage(1, 0, 1)),
        ("differs", "response.incomplete", usage(1, 0, 1)),
        ("unbilled", "response.failed", None),
    )
    lines = [
        Line("twice", 1, 0, 1),
        Line("twice", 1, 0, 1),
        Line("differs", 1, 0, 2),
        Line("unbilled", 1, 0, 1),
        Line("stranger", 1, 0, 1),
    ]
    verdict = reconcile(seen, lines)
    assert {
        k: verdict[k]
        for k in (
            "lost_lines",
            "duplicate_lines",
            "usage_mismatches",
            "billed_but_seen_unbilled",
            "lines_never_seen",
        )
    } == dict.fromkeys(
        ("lost_lines", "duplicate_lines", "usage_mismatches", "billed_but_seen_unbilled", "lines_never_seen"),
        1,
    )
    assert verdict["mismatches"] == 5 and len(verdict["examples"]) == 5


def test_the_ledger_is_read_from_every_shard_of_a_redis_cluster(redis_cluster):
    """What ``bench ledger nodes`` reconciles, from a cluster store: each owner's ledger is in
    ``store.ledger_shards`` slots, and every line is read once."""
    import asyncio
    import uuid

    from bench.reconcile import read_redis_ledger
    from store import StoreConfig, UsageEntry, open_store

    config = StoreConfig(
        backend="redis", redis_url=redis_cluster.url, redis_cluster=True, key_prefix=f"rc-{uuid.uuid4().hex}:"
    )

    async def scenario() -> list:
        store = open_store(config)
        try:
            await store.add_usage(
                [UsageEntry(f"resp_{i}", f"k{i % 2}", "m", "http", i, 0, 1, 1.0) for i in range(30)]
            )
        finally:
            await store.close()
        return await read_redis_ledger(config.redis_url, ["k0", "k1"], config.key_prefix, cluster=True)

    lines = asyncio.run(scenario())
    assert sorted(line.response_id for line in lines) == sorted(f"resp_{i}" for i in range(30))
    assert {line.response_id: line.input_tokens for line in lines} == {f"resp_{i}": i for i in range(30)}


def test_the_owner_of_a_key_is_the_servers_fingerprint_of_it():
    from bench.reconcile import owner_of
    from serve.auth import fingerprint

    assert owner_of("sk-test-1") == fingerprint("sk-test-1") and len(owner_of("k")) == 32


def test_a_journal_counts_its_whole_lines_as_the_store_reads_them(tmp_path):
    from bench.reconcile import journal_lines
    from store.journal import read

    path = tmp_path / "host.123.jsonl"
    line = '{"response_id": "resp_1", "owner": "o", "model": "m", "transport": "websocket", '
    line += '"input_tokens": 3, "cached_tokens": 0, "output_tokens": 2, "created_at": 1.0}'
    path.write_text(line + "\n" + line.replace("resp_1", "resp_2") + '\n{"response_id": "resp_3", "inp')
    assert journal_lines(path) == len(read(path)) == 2
